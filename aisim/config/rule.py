"""The configuration rules, written once: vLLM's relations between keys, the
grouped-prefix-caching rule, and what plans may conclude from their evidence.

Every :class:`~aisim.config.engine.EngineConfig` passes :func:`check_engine`
(its factory calls it): :func:`check_relations` (vLLM's ``SchedulerConfig`` and
``CacheConfig`` checks) and the grouped-prefix rule.

aisim replays a grouped (hybrid) KV cache with prefix caching only when the
deployment's geometry is known well enough for the replay to make vLLM's
decisions: the groups say whether they can be cached, their pages have one
size, the hash block (``prefix_match_unit``) is set (and is the one the probe
recorded, when planned from a probe), the vLLM release is one whose rules
aisim models (:mod:`aisim.config.versions`), ``max_model_len`` is set, state
groups are in align mode with their prefill-checkpoint geometry (on the
releases that need it), there is no convolution state group, model-specific
constraints hold (GLM-5.3-Flash) and one request of ``max_model_len`` fits the pool.

Every configuration, grouped or not, must then fit (:func:`check_capacity`):
the pool and block tables within what the replay core can index and hold, and
the pool (``num_gpu_blocks``, which is vLLM's ``num_gpu_blocks_override``, or
``kv_cache_bytes``) must hold one request of ``max_model_len``, as vLLM checks
at start-up (``vllm/v1/core/kv_cache_planning.py`` ``get_kv_cache_configs``),
unless ``startup_check`` is false (a scheduler built without the engine's
start-up, as the oracle's recordings are: see :func:`check_capacity`).

The same functions serve configuration validation, replay, planning and
sweeps (:mod:`aisim.plan` asks :func:`probe_cold_reason`,
:func:`unmodeled_version_note` and :func:`catalog_cold_reason` rather than
deciding itself); every refusal is a sentence naming the field and the value.
"""

from __future__ import annotations

from aisim.config.kvgroups import KIND, STATE_KINDS, expand_groups, request_blocks
from aisim.config.versions import (DEFAULT_VLLM_VERSION, is_supported, rules,
                                   supported_text)
from aisim.config.keys import where as _where
from aisim.errors import ConfigError

_GROUPED_VERSIONS = f"grouped prefix caching is modeled for vLLM {supported_text()} only"


# The replay core's block ids and block-table and hash rows are int32 (ext/types.pxd block_id_t, slot_t;
# ext/kvcache.pyx kv_init sizes rows as int32): the catalogue's bound.
from aisim.config.keys import INT32_MAX  # noqa: E402
# What the core allocates when a replay starts must stay below this: the block pool
# (ext/blockpool.pyx bp_init, about POOL_BYTES_PER_BLOCK a block with its hash map) and the
# block-table and hash rows of max_num_seqs + 8 sequences of max_model_len tokens (kv_init).
CORE_MEMORY_LIMIT_BYTES = 64 * 2**30
POOL_BYTES_PER_BLOCK = 56


def startup_blocks(cfg) -> int:
    """Blocks one request of ``max_model_len`` tokens needs at start-up, summed over groups."""
    return int(request_blocks(cfg, cfg.max_model_len, startup=True))


def is_glm_5_3_flash(model) -> bool:
    return model is not None and model.lower().replace("_", "-") in ("glm-5.3-flash", "zai-org/glm-5.3-flash")


def grouped_prefix_caching_problems(cfg, probe_hash_block: int | None = None) -> list[str]:
    """Every reason ``cfg`` may not replay a grouped cache with prefix caching.

    Parameters
    ----------
    cfg : aisim.config.engine.EngineConfig
    probe_hash_block : int, optional
        ``hash_block_size_tokens`` of the probe a plan comes from.

    Returns
    -------
    list of str
        Empty when the rule passes (or does not apply: one group, or prefix
        caching off).
    """
    problems = []
    groups = expand_groups(cfg.groups)
    declared = cfg.declared
    if "vllm_version" in declared and cfg.kv_cache_groups is None:
        problems.append(f"'vllm_version' ({cfg.vllm_version}) selects the grouped KV-cache rules and needs "
                        "'kv_cache_groups'")
    grouped = cfg.kv_cache_groups is not None and len(groups) > 1
    if grouped and cfg.prefix_match_unit is not None and not cfg.enable_prefix_caching:
        problems.append(f"'prefix_match_unit' ({cfg.prefix_match_unit}) needs 'enable_prefix_caching' true")
    if not grouped or not cfg.enable_prefix_caching:
        return problems
    originals = [g for g in cfg.kv_cache_groups for _ in range(int(g.get("count", 1)))]
    for i, g in enumerate(originals):
        if "prefix_cacheable" not in g:
            problems.append(f"'kv_cache_groups[{i}].prefix_cacheable' is not declared; grouped prefix caching "
                            "needs every group to say whether it can be cached")
    pages = [g["page_size_bytes"] for g in groups]
    if any(p is None for p in pages):
        i = pages.index(None)
        problems.append(f"'kv_cache_groups[{i}].page_size_bytes' is not declared; grouped prefix caching needs "
                        "equal page sizes across groups")
    elif len(set(pages)) > 1:
        i = next(k for k, p in enumerate(pages) if p != pages[0])
        problems.append(f"'kv_cache_groups[{i}].page_size_bytes' ({pages[i]}) differs from "
                        f"'kv_cache_groups[0].page_size_bytes' ({pages[0]}); grouped prefix caching needs equal "
                        "page sizes across groups")
    if cfg.prefix_match_unit is None:
        problems.append("'prefix_match_unit' is not set; grouped prefix caching needs the hash block size")
    elif probe_hash_block is not None and cfg.prefix_match_unit != probe_hash_block:
        problems.append(f"'prefix_match_unit' ({cfg.prefix_match_unit}) differs from the probe's "
                        f"hash_block_size_tokens ({probe_hash_block})")
    if cfg.vllm_version is None:
        problems.append(f"'vllm_version' is not set; {_GROUPED_VERSIONS}")
    elif not is_supported(cfg.vllm_version):
        problems.append(f"'vllm_version' ({cfg.vllm_version}) is not modeled; {_GROUPED_VERSIONS}")
    if "max_model_len" not in declared:
        problems.append("'max_model_len' is not set; grouped prefix caching needs it for the start-up "
                        "capacity check")
    for i, g in enumerate(groups):
        cacheable = originals[i].get("prefix_cacheable", KIND[g["type"]].prefix_cacheable)
        if g["type"] == "conv":
            problems.append(f"'kv_cache_groups[{i}].type' is 'conv': vLLM cannot prefix-cache a convolution "
                            "state group")
        elif g["type"] in STATE_KINDS and cacheable:
            if cfg.resolved_mamba_cache_mode != "align":
                problems.append(f"'mamba_cache_mode' is '{cfg.resolved_mamba_cache_mode}'; the prefix-cacheable "
                                f"state group kv_cache_groups[{i}] ({g['type']}) needs 'align'")
            if rules(cfg.version).needs_checkpoint_geometry and "prefill_checkpoint_blocks" not in originals[i]:
                problems.append(f"'kv_cache_groups[{i}].prefill_checkpoint_blocks' is not declared; vLLM "
                                f"{cfg.version} needs the prefill-checkpoint geometry of every prefix-cacheable "
                                "state group")
    if is_glm_5_3_flash(cfg.model):
        if cfg.prefix_match_unit is not None and cfg.prefix_match_unit % 4:
            problems.append(f"'prefix_match_unit' ({cfg.prefix_match_unit}) must be a multiple of 4 for "
                            "GLM-5.3-Flash prefix caching")
        if cfg.max_num_batched_tokens % 4:
            problems.append(f"'max_num_batched_tokens' ({cfg.max_num_batched_tokens}) must be a multiple of 4 "
                            "for GLM-5.3-Flash prefix caching")
    if cfg.num_gpu_blocks is not None and not problems:
        fit = startup_fit_problem(cfg)
        if fit is not None:
            problems.append(fit)
    return problems


def startup_fit_problem(cfg, where: str = "") -> str | None:
    """Why one request of ``max_model_len`` tokens does not fit the pool (None when it fits).

    ``where`` (`` in FILE``) follows the key named first.

    vLLM refuses to start such an engine (``vllm/v1/core/kv_cache_planning.py``
    ``get_kv_cache_configs``, ``_check_enough_kv_cache_memory``); block 0 is the null block.
    """
    need = startup_blocks(cfg)
    usable = cfg.usable_blocks
    if usable >= need:
        return None
    # vLLM's reason names the longest length that fits (_check_enough_kv_cache_memory's estimate).
    longest = longest_startup_len(cfg)
    estimate = f"; the estimated maximum model length is {longest}" if longest > 0 else ""
    return (f"'num_gpu_blocks' ({cfg.num_gpu_blocks}){where} leaves {usable} usable blocks, but one "
            f"request of max_model_len ({cfg.max_model_len}) needs {need} blocks{estimate}")


def longest_startup_len(cfg) -> int:
    """The longest ``max_model_len`` (at most ``cfg``'s) whose one request fits the pool at start-up; 0: none.

    vLLM's auto-fit (``--max-model-len -1``; ``vllm/v1/core/kv_cache_utils.py``
    ``_estimate_max_model_len_from_groups``, a bisection over lengths with the null block
    held back), the length its start-up error suggests.
    """
    usable = cfg.usable_blocks
    lo, hi = 0, cfg.max_model_len
    while lo < hi:  # invariant: lo fits (0 trivially), every length above hi does not
        mid = (lo + hi + 1) // 2
        if int(request_blocks(cfg, mid, startup=True)) <= usable:
            lo = mid
        else:
            hi = mid - 1
    return lo


def core_memory_bytes(cfg) -> int:
    """Bytes the replay core allocates at start for ``cfg``: the pool and the rows of its sequences."""
    from aisim.config.kvgroups import resolve_groups

    r = resolve_groups(cfg)
    hash_row = cfg.max_model_len // r["hash_block_size"] + 1
    table_rows = sum(-(-cfg.max_model_len // g["block_size"]) + g["num_spec"] + 3 for g in r["groups"])
    return POOL_BYTES_PER_BLOCK * cfg.num_gpu_blocks + (cfg.max_num_seqs + 8) * (8 * hash_row + 4 * table_rows)


def check_capacity(cfg, source: str | None = None) -> None:
    """Refuse a pool the replay core cannot index or hold, or one a request of ``max_model_len`` does not fit.

    Raises
    ------
    ConfigError
        ``num_gpu_blocks`` beyond int32, the core's memory beyond
        :data:`CORE_MEMORY_LIMIT_BYTES`, or vLLM's start-up check failing
        (unless ``startup_check`` is false).
    """
    if cfg.num_gpu_blocks > INT32_MAX:
        raise ConfigError(f"'num_gpu_blocks' ({cfg.num_gpu_blocks}){_where(source)} must be at most {INT32_MAX}: "
                          "the replay core's block ids are 32-bit")
    if cfg.max_model_len > INT32_MAX:
        raise ConfigError(f"'max_model_len' ({cfg.max_model_len}){_where(source)} must be at most {INT32_MAX}: "
                          "the replay core's block-table rows are 32-bit")
    need = core_memory_bytes(cfg)
    if need > CORE_MEMORY_LIMIT_BYTES:
        raise ConfigError(
            f"'num_gpu_blocks' ({cfg.num_gpu_blocks}), 'max_num_seqs' ({cfg.max_num_seqs}) and 'max_model_len' "
            f"({cfg.max_model_len}){_where(source)} need {need / 2**30:.1f} GiB of replay-core memory; "
            f"the limit is {CORE_MEMORY_LIMIT_BYTES // 2**30} GiB"
        )
    # vLLM refuses to start an engine whose pool cannot hold one request of max_model_len
    # (vllm/v1/core/kv_cache_planning.py get_kv_cache_configs -> _check_enough_kv_cache_memory, 0.31.0
    # to 0.34.0).  It checks the memory it found, which 'kv_cache_bytes' is, after applying
    # num_gpu_blocks_override (an explicit 'num_gpu_blocks') to it, with the null block held back.
    # 'startup_check' false is the one exception: the oracle's decision logs were recorded on a
    # Scheduler built directly, the way EngineCore builds it but without get_kv_cache_configs
    # (tests/data/oracle/README.md: "the scheduler built the way vLLM's EngineCore builds it"), so
    # full_small (200 blocks, max_model_len 4096) ran although vLLM's engine would refuse it; its
    # configuration replays with the key false.  The grouped-prefix rule checks the fit regardless.
    if not cfg.startup_check:
        return
    fit = startup_fit_problem(cfg)
    if fit is not None:
        if "num_gpu_blocks" not in cfg.declared:
            fit = f"'kv_cache_bytes' ({cfg.kv_cache_bytes}){_where(source)} gives {fit}"
        else:
            fit = startup_fit_problem(cfg, _where(source))
        raise ConfigError(f"{fit}; vLLM refuses to start such an engine")


def check_engine(cfg, source: str | None = None) -> None:
    """Apply every configuration rule to ``cfg`` (the engine-configuration factory calls this).

    Raises
    ------
    ConfigError
        The first relation vLLM refuses (:func:`check_relations`), else every
        problem of the grouped-prefix rule (:func:`grouped_prefix_caching_problems`),
        else a pool that does not fit (:func:`check_capacity`).
    """
    check_relations(cfg, source)
    problems = grouped_prefix_caching_problems(cfg)
    if problems:
        raise ConfigError(f"grouped prefix caching refused{_where(source)}: " + "; ".join(problems)
                          + ". Set enable_prefix_caching = false for a cold replay.")
    check_capacity(cfg, source)


def check_relations(cfg, source: str | None = None) -> None:
    """Raise :class:`ConfigError` for the first relation between keys that vLLM refuses.

    vLLM's ``SchedulerConfig``/``CacheConfig`` checks and the hash-block
    constraints of ``resolve_kv_cache_block_sizes``.
    """
    # vllm/config/scheduler.py SchedulerConfig.verify_max_model_len
    if cfg.max_num_batched_tokens < cfg.max_num_seqs:
        raise ConfigError(
            f"'max_num_batched_tokens' ({cfg.max_num_batched_tokens}){_where(source)} must be at least "
            f"'max_num_seqs' ({cfg.max_num_seqs})"
        )
    if not cfg.enable_chunked_prefill and cfg.max_num_batched_tokens < cfg.max_model_len:
        raise ConfigError(
            f"'max_num_batched_tokens' ({cfg.max_num_batched_tokens}){_where(source)} must be at least "
            f"'max_model_len' ({cfg.max_model_len}) when 'enable_chunked_prefill' is false"
        )
    if cfg.long_prefill_token_threshold > cfg.max_model_len:
        raise ConfigError(
            f"'long_prefill_token_threshold' ({cfg.long_prefill_token_threshold}){_where(source)} must not "
            f"exceed 'max_model_len' ({cfg.max_model_len})"
        )
    if cfg.active_seqs > cfg.max_num_seqs:
        raise ConfigError(f"'max_num_active_seqs'{_where(source)} must not exceed 'max_num_seqs'")
    if cfg.token_budget > cfg.max_num_batched_tokens:
        raise ConfigError(f"'max_num_scheduled_tokens'{_where(source)} must not exceed 'max_num_batched_tokens'")
    if cfg.mamba_cache_mode not in (None, "none", "align"):
        raise ConfigError(f"'mamba_cache_mode'{_where(source)} must be 'align' or 'none', got {cfg.mamba_cache_mode!r}")
    groups = expand_groups(cfg.groups)
    if cfg.speculative is not None:
        _check_speculative(cfg, groups, source)
    unit = cfg.prefix_match_unit
    if unit is not None and len(groups) == 1 and unit != cfg.block_size and cfg.enable_prefix_caching:
        # vllm resolve_kv_cache_block_sizes: one group hashes at its block size.
        raise ConfigError(
            f"'prefix_match_unit' ({unit}){_where(source)} must equal 'block_size' "
            f"({cfg.block_size}) for a single KV-cache group"
        )
    if len(groups) > 1 and cfg.enable_prefix_caching and cfg.resolved_mamba_cache_mode == "align":
        sizes = [g["block_size"] or cfg.block_size for g in groups]
        if unit is not None and any(s % unit for s in sizes):
            raise ConfigError(f"'prefix_match_unit' ({unit}){_where(source)} must divide every group's "
                              f"block size {sizes}")
    r = cfg.prefix_cache_retention_interval
    if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 0):
        raise ConfigError(f"'prefix_cache_retention_interval'{_where(source)} must be null or an integer >= 0")


# ---------------------------------------------------------------- plans
# What a plan may conclude from its evidence, before the configuration is built.


def _check_speculative(cfg, groups, source) -> None:
    """vLLM's constraints between speculative decoding and the other keys."""
    sp = cfg.speculative
    k = sp.num_speculative_tokens
    lpt = cfg.long_prefill_token_threshold
    if 0 < lpt <= k:
        # Scheduler.schedule asserts that a padded one-token admission keeps its 1 + k rows.
        raise ConfigError(f"'long_prefill_token_threshold' ({lpt}){_where(source)} must exceed "
                          f"'speculative.num_speculative_tokens' ({k}) or be 0")
    if cfg.max_num_batched_tokens <= (1 if sp.method == "draft_model" else 0):
        raise ConfigError(f"'max_num_batched_tokens'{_where(source)} leaves no input budget beside the draft slots")
    for i, g in enumerate(groups):
        if g["type"] in STATE_KINDS and g.get("num_speculative_blocks") not in (None, k):
            raise ConfigError(f"'kv_cache_groups[{i}].num_speculative_blocks' ({g['num_speculative_blocks']})"
                              f"{_where(source)} must equal 'speculative.num_speculative_tokens' ({k}): vLLM "
                              "gives a state group one draft block per speculative token")
    eagle_drop = sp.use_eagle and (not rules(cfg.version).hash_lookahead_replaces_eagle_drop
                                   or not cfg.enable_prefix_caching)
    if eagle_drop and cfg.enable_prefix_caching and any(g["type"] == "chunked_local" for g in groups):
        # ChunkedLocalAttentionManager.find_longest_cache_hit asserts that no EAGLE drop reaches it.
        raise ConfigError(f"'speculative.method' ({sp.method}){_where(source)}: vLLM {cfg.version} cannot "
                          "prefix-cache chunked local attention under the EAGLE block drop")


def unmodeled_version_note(version) -> str | None:
    """Why a probe's ``vllm_version`` cannot be followed (None when aisim models it)."""
    if is_supported(version):
        return None
    return (f"vllm_version {version} is not modeled (only {supported_text(', ')}); the replay follows "
            f"{DEFAULT_VLLM_VERSION}'s scheduler")


def probe_cold_reason(*, ran_with_prefix_caching: bool, grouped: bool, hash_block, version) -> str | None:
    """Why probe evidence cannot give a warm plan, before the grouped-prefix rule is tried.

    Parameters
    ----------
    ran_with_prefix_caching : bool
        The probed engine ran with prefix caching on.
    grouped : bool
        The probe has more than one KV-cache group.
    hash_block : int or None
        The probe's ``hash_block_size_tokens``.
    version : str
        The probe's ``vllm_version``.

    Returns
    -------
    str or None
        The reason, or None when the rule decides.
    """
    if not ran_with_prefix_caching:
        return "the probed engine ran with prefix caching off"
    if grouped and hash_block is None:
        return "the probe did not record hash_block_size_tokens"
    if grouped and not is_supported(version):
        return _GROUPED_VERSIONS
    return None


def catalog_cold_reason(grouped: bool) -> str | None:
    """Why a plan from the catalog alone replays cold (None: prefix caching may stay on)."""
    if grouped:
        return "grouped prefix caching needs probe evidence of the hash block; run aisim plan --probe"
    return None

