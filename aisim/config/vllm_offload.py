"""vLLM's ways of asking for KV offload, as an engine's ``kv_offload`` section.

vLLM turns ``--kv-offloading-size GiB --kv-offloading-backend native`` into a
``kv_transfer_config`` (``vllm/config/vllm.py``, ``VllmConfig._post_init_kv_transfer_config``):
connector ``OffloadingConnector``, ``kv_role`` ``kv_both`` and ``cpu_bytes_to_use = GiB * 2**30`` in
``kv_connector_extra_config``.  The connector's spec (``vllm/v1/kv_offload/cpu/spec.py``,
``CPUOffloadingSpec.__init__``) sizes its tier from the KV bytes of one block over every worker
(``worker_kv_bytes_per_block * world_size``).  The functions here read the flag, a probe's
``kv_transfer_config`` and a sweep's tier size the same way, into the section that
:func:`aisim.config.offload.parse_offload` validates:

- :func:`offload_section` -- ``--kv-offloading-size`` and ``--kv-offloading-backend``;
- :func:`from_transfer_config` -- a ``kv_transfer_config`` as vLLM holds it;
- :func:`tier_bytes_per_block` -- the bytes one GPU block's KV takes in the tier.
"""

from __future__ import annotations

import math

from aisim.errors import ConfigError

# ``--kv-offloading-backend``'s choices (vllm/config/cache.py, KVOffloadingBackend).
BACKENDS = ("native", "lmcache")
_EXTRA = "kv_transfer_config.kv_connector_extra_config"
# The connector vLLM's native offloading flag builds, the one aisim replays.
OFFLOADING_CONNECTOR = "OffloadingConnector"
# kv_connector_extra_config keys of the OffloadingConnector and the kv_offload key each sets ("" for
# keys that change no scheduling decision: metrics, events, the tracker's memory).
EXTRA_CONFIG = {
    "cpu_bytes_to_use": "size_gib",
    "block_size": "block_size",
    "blocks_per_chunk": "blocks_per_chunk",
    "eviction_policy": "eviction_policy",
    "offload_prompt_only": "extra.offload_prompt_only",
    "store_threshold": "extra.store_threshold",
    "spec_name": "",
    "max_tracker_size": "",
    "self_describing_kv_events": "",
    "secondary_tiers": "disk_tier",
    "tier_poll_interval_s": "",
    "backpressure": "",
}
# The spec with secondary tiers behind the CPU tier (vllm/v1/kv_offload/tiering/spec.py); aisim replays one
# `fs` tier (tiering/fs/manager.py, FileSystemTierManager), whose settings below change no scheduling decision.
TIERING_SPEC = "TieringOffloadingSpec"
FS_TIER_KEYS = ("type", "root_dir", "n_read_threads", "n_write_threads", "enable_kv_events", "locality")


def _disk_tier(extra: dict, at: str) -> bool:
    """Whether ``kv_connector_extra_config`` asks for the disk tier (TieringOffloadingSpec with one `fs`
    secondary tier); anything else behind the CPU tier is refused with the reason."""
    spec = extra.get("spec_name", "CPUOffloadingSpec")
    if spec not in ("CPUOffloadingSpec", TIERING_SPEC):
        raise ConfigError(f"'{_EXTRA}.spec_name'{at} is {spec!r}: aisim replays the CPU tier "
                          f"(CPUOffloadingSpec) and a disk tier behind it ({TIERING_SPEC} with an 'fs' tier)")
    tiers = extra.get("secondary_tiers", []) if spec == TIERING_SPEC else []
    if spec != TIERING_SPEC and "secondary_tiers" in extra:
        raise ConfigError(f"'{_EXTRA}.secondary_tiers'{at} needs spec_name {TIERING_SPEC!r} (vLLM's CPUOffloadingSpec "
                          "ignores it)")
    if not isinstance(tiers, list):
        raise ConfigError(f"'{_EXTRA}.secondary_tiers'{at} must be a list of tier configurations (vLLM refuses "
                          f"anything else), got {tiers!r}")
    if "backpressure" in extra:
        raise ConfigError(f"'{_EXTRA}.backpressure'{at}: a tier's back-pressure detector (it drops stores by "
                          "measured latency) is not modelled")
    if len(tiers) > 1:
        raise ConfigError(f"'{_EXTRA}.secondary_tiers'{at} has {len(tiers)} tiers; aisim replays one 'fs' tier")
    for t in tiers:
        if not isinstance(t, dict) or t.get("type") != "fs":
            kind = t.get("type") if isinstance(t, dict) else t
            raise ConfigError(f"'{_EXTRA}.secondary_tiers'{at}: tier {kind!r} is not modelled; aisim replays the "
                              "file-system tier ('type': 'fs')")
        for k in t:
            if k not in FS_TIER_KEYS:
                why = ("a back-pressure detector is not modelled" if k == "backpressure"
                       else f"known: {', '.join(FS_TIER_KEYS)}")
                raise ConfigError(f"'{_EXTRA}.secondary_tiers[0].{k}'{at}: {why}")
    return bool(tiers)


def tier_bytes_per_block(groups, tp: int = 1) -> int:
    """Bytes of one GPU block's KV across the engine's ``tp`` workers (0 when the groups do not say).

    ``CPUOffloadingSpec``: ``worker_kv_bytes_per_block * world_size`` (every worker's copy of the
    block; a KV-cache group's ``page_size_bytes`` is one worker's page).
    """
    from aisim.config.kvgroups import groups_block_bytes

    return groups_block_bytes(groups) * int(tp)


def _check_backend(backend: str, where: str) -> None:
    if backend not in BACKENDS:
        raise ConfigError(f"{where}: the backend is one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "lmcache":
        raise ConfigError(f"{where}: 'lmcache' keeps the KV store in an LMCache server process; aisim replays "
                          "vLLM's native CPU OffloadingConnector (--kv-offloading-backend native)")


def offload_section(size_gib, backend: str = "native", bytes_per_block: int = 0, base: dict | None = None,
                    where: str = "--kv-offloading-size") -> dict:
    """``--kv-offloading-size size_gib --kv-offloading-backend backend`` as a ``kv_offload`` section.

    Parameters
    ----------
    size_gib : float
        The tier in GiB (vLLM's flag).
    backend : str
        ``native`` (``lmcache`` is refused: its store is another process).
    bytes_per_block : int
        :func:`tier_bytes_per_block` of the engine; used when ``base`` does not give
        ``kv_bytes_per_block``.
    base : dict, optional
        An existing section: its other keys (timing, chunk size, policy) are kept, its size replaced.
    where : str
        The flag or key, for messages.

    Raises
    ------
    ConfigError
        A size that is not a positive number, another backend, or no way to count the tier's chunks.
    """
    _check_backend(backend, where)
    if isinstance(size_gib, bool) or not isinstance(size_gib, (int, float)) or not math.isfinite(size_gib) \
            or size_gib <= 0:
        raise ConfigError(f"{where}: the tier size is a positive number of GiB, got {size_gib!r}")
    out = {k: v for k, v in (base or {}).items() if k not in ("cpu_blocks", "size_gib")}
    out["size_gib"] = float(size_gib)
    if out.get("kv_bytes_per_block") is None:
        if not bytes_per_block:
            raise ConfigError(f"{where}: the tier's chunks are counted from the KV bytes of a block; give "
                              "'page_size_bytes' and 'num_layers' on the KV-cache groups (or 'kv_offload."
                              "kv_bytes_per_block')")
        out["kv_bytes_per_block"] = int(bytes_per_block)
    return out


def from_transfer_config(ktc, bytes_per_block: int, at: str = ""):
    """A ``kv_transfer_config`` (vLLM's ``KVTransferConfig`` as a mapping) as a ``kv_offload`` section.

    ``at``: where it was read, for messages (`` in the probe``).

    Returns
    -------
    (dict or None, str or None)
        The section (None: no connector), and a note when the connector is one aisim does not
        replay (the plan then replays without it, and says so).

    Raises
    ------
    ConfigError
        A malformed mapping, or an OffloadingConnector setting aisim does not replay.
    """
    if ktc is None:
        return None, None
    if not isinstance(ktc, dict):
        raise ConfigError(f"'kv_transfer_config'{at} must be a mapping (vLLM's KVTransferConfig), got {ktc!r}")
    connector = ktc.get("kv_connector")
    if connector is None:
        return None, None
    if connector != OFFLOADING_CONNECTOR:
        return None, (f"the probed engine ran KV connector {connector!r}, which aisim does not replay; the plan "
                      "has no KV offload tier (vLLM's OffloadingConnector is replayed: --kv-offloading-size)")
    extra = ktc.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ConfigError(f"'{_EXTRA}'{at} must be a mapping, got {extra!r}")
    for k in extra:
        if k not in EXTRA_CONFIG:
            raise ConfigError(f"'{_EXTRA}.{k}'{at} is not an OffloadingConnector setting "
                              f"aisim knows; known: {', '.join(EXTRA_CONFIG)}")
    disk = _disk_tier(extra, at)
    cpu_bytes = extra.get("cpu_bytes_to_use")
    if isinstance(cpu_bytes, bool) or not isinstance(cpu_bytes, (int, float)) or cpu_bytes <= 0:
        raise ConfigError(f"'{_EXTRA}.cpu_bytes_to_use'{at} must be a positive number of "
                          f"bytes (vLLM refuses the connector without it), got {cpu_bytes!r}")
    section = offload_section(cpu_bytes / 2**30, "native", bytes_per_block, where=f"'{_EXTRA}.cpu_bytes_to_use'{at}")
    for k, target in EXTRA_CONFIG.items():
        if k in ("cpu_bytes_to_use", "secondary_tiers") or not target or k not in extra:
            continue
        if target.startswith("extra."):
            section.setdefault("extra", {})[target[len("extra."):]] = extra[k]
        else:
            section[target] = extra[k]
    if disk:
        section["disk_tier"] = True
    return section, None


def offload_options(f):
    """``--kv-offloading-size GiB`` and ``--kv-offloading-backend``, named and meant as ``vllm serve``'s
    (parameters ``kv_offloading_size``, ``kv_offloading_backend``)."""
    import click

    f = click.option("--kv-offloading-backend", type=click.Choice(BACKENDS),
                     help="As vllm serve: 'native' (vLLM's CPU OffloadingConnector, the one replayed; 'lmcache' "
                          "is refused).")(f)
    f = click.option("--kv-offloading-size", type=float, metavar="GIB",
                     help="As vllm serve: a CPU tier of this many GiB behind the GPU KV cache (the engine's "
                          "'kv_offload' section, its chunks counted from the groups' page bytes).")(f)
    return f
