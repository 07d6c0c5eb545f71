"""KV-cache groups as vLLM's engine core resolves them at start-up.

From the configured groups this derives what the replay core needs: each
group's manager kind and block size, the scheduler block size (LCM of the
group block sizes), the hash block size (``prefix_match_unit``, else the GCD
of the prefix-cacheable groups' block sizes, with vLLM's fall-backs), whether
fine-grained ("partial") hits are on, the cache-hit alignment, the
sliding-window admission caps and the lookup spec-groups.  Rules:
``vllm/v1/core/kv_cache_utils.py`` (``resolve_kv_cache_block_sizes``,
``partial_hash_hits_enabled``), ``kv_cache_coordinator.py``
(``HybridKVCacheCoordinator.verify_and_split_kv_cache_groups``) and
``kv_cache_interface.py`` (``max_admission_blocks_per_request``).

The group kinds are one table, :data:`KINDS` (core manager, state or not, the
key a kind requires, the default of ``prefix_cacheable``); the per-group keys
and their defaults are :data:`aisim.config.keys.GROUP_KEYS`.  ``GROUP_KINDS``,
``STATE_KINDS`` and ``GROUP_DEFAULTS`` are read from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aisim._core.constants import GROUP_KINDS as _CORE_KINDS
from aisim.config.keys import GROUP_KEYS, defaults
from aisim.config.versions import core_rules


@dataclass(frozen=True)
class GroupKind:
    """A ``type`` of KV-cache group.

    Parameters
    ----------
    name : str
        The ``type`` as configured.
    core : str
        The replay core's manager for it (vLLM's ``KVCacheSpec`` class family).
    state : bool
        Holds a recurrent state rather than per-token KV (vLLM ``MambaSpec``).
    required : str or None
        Per-group key the kind cannot do without.
    prefix_cacheable : bool
        Default of the group's ``prefix_cacheable``.
    meaning : str
        One line for the documentation.
    """

    name: str
    core: str
    state: bool = False
    required: str | None = None
    prefix_cacheable: bool = True
    meaning: str = ""


# Order is the order error messages list the kinds in.
KINDS = (
    GroupKind("full", "full", meaning="full attention: every block of the sequence"),
    GroupKind("sliding_window", "sliding_window", required="sliding_window",
              meaning="sliding-window attention: the blocks of the window"),
    GroupKind("chunked_local", "chunked_local", required="attention_chunk_size",
              meaning="chunked local attention: the blocks of the current chunk"),
    GroupKind("mamba", "state", state=True, meaning="Mamba state"),
    GroupKind("gdn", "state", state=True, meaning="gated DeltaNet state"),
    GroupKind("kda", "state", state=True, meaning="Kimi delta attention state"),
    GroupKind("conv", "state", state=True, meaning="convolution state (vLLM cannot prefix-cache it)"),
    GroupKind("ring", "ring", prefix_cacheable=False, meaning="a ring buffer of one block"),
)
KIND = {k.name: k for k in KINDS}


def _core_kind_code(core: str) -> int:
    """The replay core's group-kind code of manager ``core`` (aisim._core.constants.GROUP_KINDS)."""
    return _CORE_KINDS[core]


# Group type -> the replay core's kind code.
GROUP_KINDS = {k.name: _core_kind_code(k.core) for k in KINDS}
# Groups that hold a recurrent state rather than per-token KV (vLLM MambaSpec).
STATE_KINDS = tuple(k.name for k in KINDS if k.state)
# Per-group keys of the configuration, with their defaults (aisim.config.keys.GROUP_KEYS).
GROUP_DEFAULTS = defaults(GROUP_KEYS)


def group_cacheable(group: dict) -> bool:
    """The group's ``prefix_cacheable``, else its kind's default."""
    c = group.get("prefix_cacheable")
    return KIND[group["type"]].prefix_cacheable if c is None else c


def expand_groups(groups) -> list[dict]:
    """Each configured group repeated ``count`` times, defaults filled in.

    ``None`` stands for vLLM's single full-attention group.
    """
    if groups is None:
        groups = ({"type": "full"},)
    out = []
    for g in groups:
        full = {**GROUP_DEFAULTS, **g}
        for _ in range(int(full["count"])):
            out.append(full)
    return out


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def resolve_groups(cfg) -> dict:
    """Keyword arguments of the replay core for the groups of ``cfg``.

    Parameters
    ----------
    cfg : aisim.config.engine.EngineConfig

    Returns
    -------
    dict
        ``groups`` (one dict per group, in group-id order), ``hash_block_size``,
        ``sched_block_size``, ``fine_grained``, ``retention``, ``version``,
        ``cache_block_size`` and the Mamba split settings.
    """
    groups = expand_groups(cfg.groups)
    caching = cfg.enable_prefix_caching
    align_mode = cfg.resolved_mamba_cache_mode == "align"
    sizes = group_block_sizes(cfg)
    sched = sizes[0] if len(groups) == 1 else math.lcm(*sizes)
    cacheable = [group_cacheable(g) for g in groups]
    has_state = any(g["type"] in STATE_KINDS for g in groups)
    unit = cfg.prefix_match_unit
    if len(groups) == 1 or not caching or (has_state and not align_mode):
        hash_bs = sched
    else:
        hashing = [s for s, c in zip(sizes, cacheable) if c] or sizes
        hash_bs = unit if unit is not None else math.gcd(*hashing)
    # partial_hash_hits_enabled: an aligned state group with blocks wider than a
    # hash block, and every other cacheable group able to look up finely.
    fine = (
        len(groups) > 1 and caching and align_mode
        and any(g["type"] in STATE_KINDS and s > hash_bs for g, s in zip(groups, sizes))
        and all(not c or g["type"] in ("full",) + STATE_KINDS or s == hash_bs
                for g, s, c in zip(groups, sizes, cacheable))
    )
    in_flight = (2 if cfg.async_scheduling else 1) * cfg.max_num_batched_tokens
    specs = []
    keys = []
    for g, s, c in zip(groups, sizes, cacheable):
        kind = GROUP_KINDS[g["type"]]
        window = g["sliding_window"] or g["attention_chunk_size"] or 0
        cap = -1
        if g["type"] == "sliding_window":
            cap = _cdiv(min(window - 1 + in_flight, cfg.max_model_len), s) + 1
        elif g["type"] == "chunked_local":
            cap = _cdiv(min(window + in_flight, cfg.max_model_len), s)
        state = g["type"] in STATE_KINDS
        spec = {
            "kind": kind,
            "block_size": s,
            "window": window,
            "cacheable": bool(c and caching),
            "align_mode": bool(state and align_mode),
            "num_spec": _num_speculative_blocks(cfg, g) if state else 0,
            "has_ckpt": bool(state and align_mode and g["prefill_checkpoint_blocks"] > 0),
            "ckpt_align": int(g["prefill_checkpoint_alignment"] or 0) if state else 0,
            "admission_cap": cap,
            "spec_group": -1,
        }
        specs.append(spec)
        keys.append((kind, s, window, spec["num_spec"], spec["has_ckpt"], spec["ckpt_align"]))
    # Spec-groups: equal specs are looked up jointly; full attention first.
    order = []
    for i, spec in enumerate(specs):
        if not spec["cacheable"]:
            continue
        for members in order:
            if keys[members[0]] == keys[i]:
                members.append(i)
                break
        else:
            order.append([i])
    order.sort(key=lambda m: specs[m[0]]["kind"] != GROUP_KINDS["full"])
    for sg, members in enumerate(order):
        for i in members:
            specs[i]["spec_group"] = sg
    state_groups = [(g, sp) for g, sp in zip(groups, specs) if g["type"] in STATE_KINDS]
    mamba_split = bool(state_groups) and align_mode
    retention = cfg.prefix_cache_retention_interval
    return {
        "groups": specs,
        "hash_block_size": hash_bs,
        "sched_block_size": sched,
        "fine_grained": fine,
        "retention": -1 if retention is None else retention,
        "rules": core_rules(cfg.version),
        "cache_block_size": cfg.block_size,
        "mamba_split": mamba_split,
        "mamba_partial": bool(mamba_split and hash_bs < sched and fine),
        "mamba_has_ckpt": bool(state_groups) and all(sp["has_ckpt"] for _, sp in state_groups),
        "mamba_ckpt_align": state_groups[0][1]["ckpt_align"] if state_groups else 0,
    }


def _num_speculative_blocks(cfg, group) -> int:
    """A state group's draft blocks: as configured, else k with speculative decoding
    (vLLM's ``MambaSpec.num_speculative_blocks`` is ``num_speculative_tokens``)."""
    n = group.get("num_speculative_blocks")
    if n is not None:
        return int(n)
    sp = getattr(cfg, "speculative", None)
    return sp.num_speculative_tokens if sp is not None else 0


def group_block_sizes(cfg) -> list[int]:
    """Each group's block size: its own, else the engine's; a state group outside
    align mode holds one block of ``max_model_len`` tokens (vLLM's
    ``mamba_block_size`` without prefix caching)."""
    align_mode = cfg.resolved_mamba_cache_mode == "align"
    out = []
    for g in expand_groups(cfg.groups):
        if g["type"] in STATE_KINDS and not align_mode:
            out.append(cfg.max_model_len)
        else:
            out.append(g["block_size"] or cfg.block_size)
    return out


def block_bytes(cfg) -> int:
    """Bytes of one block id: layers per group times the page (0 when unknown).

    vLLM's ``get_kv_cache_configs``: a block id owns one page in each of a
    group's layer tensors, so it costs the largest ``num_layers *
    page_size_bytes`` over groups.
    """
    return groups_block_bytes(cfg.groups)


def groups_block_bytes(groups) -> int:
    """:func:`block_bytes` of configured ``groups`` (None: one full-attention group)."""
    sizes = [g["num_layers"] * g["page_size_bytes"] for g in expand_groups(groups) if g["page_size_bytes"]]
    return max(sizes) if sizes else 0


def request_blocks(cfg, tokens, startup: bool = False):
    """Blocks one request of ``tokens`` tokens holds at most, summed over groups.

    The per-group footprint of vLLM's start-up sizing (``max_memory_usage_bytes``):
    full attention every block, a sliding window or chunked local group its
    admission cap, a state group two state blocks (+ drafts and a checkpoint)
    in align mode or one (+ drafts) otherwise, a ring one.  ``startup`` sizes a
    window group as vLLM's start-up check does for ``max_model_len = tokens``
    (``SlidingWindowSpec.max_memory_usage_bytes``: ``cdiv(min(window - 1 +
    in-flight tokens, tokens), block) + 1``; chunked local without the ``- 1``
    and the ``+ 1``), for any ``tokens`` up to ``cfg.max_model_len``; otherwise a
    request shorter than the cap holds only its own blocks.

    Parameters
    ----------
    cfg : aisim.config.engine.EngineConfig
    tokens : int or numpy.ndarray
    startup : bool
    """
    import numpy as np

    tokens = np.asarray(tokens, dtype=np.int64)
    total = np.zeros_like(tokens)
    for g, spec in zip(expand_groups(cfg.groups), resolve_groups(cfg)["groups"]):
        full = -(-tokens // spec["block_size"])
        if g["type"] in ("sliding_window", "chunked_local"):
            # The cap is this formula at cfg.max_model_len: at tokens <= it, the smaller of the two.
            at_len = full + (g["type"] == "sliding_window") if startup else full
            total += np.minimum(at_len, spec["admission_cap"])
        elif g["type"] in STATE_KINDS:
            total += (2 + spec["num_spec"] + int(spec["has_ckpt"])) if spec["align_mode"] else 1 + spec["num_spec"]
        elif g["type"] == "ring":
            total += 1
        else:
            total += full
    return total
