"""The grouped-prefix-caching rule, written once.

aisim replays a grouped (hybrid) KV cache with prefix caching only when the
deployment's geometry is known well enough for the replay to make vLLM's
decisions: the groups say whether they can be cached, their pages have one
size, the hash block (``prefix_match_unit``) is set (and is the one the probe
recorded, when planned from a probe), the vLLM release is one whose rules
aisim models (0.31.0, 0.32.0), ``max_model_len`` is set, state groups are in
align mode with their prefill-checkpoint geometry (0.32.0), there is no
convolution state group, model-specific constraints hold (GLM-5.3-Flash) and
one request of ``max_model_len`` fits the pool, as vLLM checks at start-up
(``vllm/v1/core/kv_cache_utils.py`` ``check_enough_kv_cache_memory``).

The same function serves configuration validation, replay, planning and
sweeps; every refusal is a sentence naming the field and the value.
"""

from __future__ import annotations

from aisim.config.kvgroups import STATE_KINDS, expand_groups, request_blocks
from aisim.errors import ConfigError

SUPPORTED = ("0.31.0", "0.32.0")


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
        problems.append("'vllm_version' is not set; grouped prefix caching is modeled for vLLM "
                        f"{' and '.join(SUPPORTED)} only")
    elif cfg.vllm_version not in SUPPORTED:
        problems.append(f"'vllm_version' ({cfg.vllm_version}) is not modeled; grouped prefix caching is "
                        f"modeled for vLLM {' and '.join(SUPPORTED)} only")
    if "max_model_len" not in declared:
        problems.append("'max_model_len' is not set; grouped prefix caching needs it for the start-up "
                        "capacity check")
    for i, g in enumerate(groups):
        cacheable = originals[i].get("prefix_cacheable", g["type"] != "ring")
        if g["type"] == "conv":
            problems.append(f"'kv_cache_groups[{i}].type' is 'conv': vLLM cannot prefix-cache a convolution "
                            "state group")
        elif g["type"] in STATE_KINDS and cacheable:
            if cfg.resolved_mamba_cache_mode != "align":
                problems.append(f"'mamba_cache_mode' is '{cfg.resolved_mamba_cache_mode}'; the prefix-cacheable "
                                f"state group kv_cache_groups[{i}] ({g['type']}) needs 'align'")
            if cfg.version == "0.32.0" and "prefill_checkpoint_blocks" not in originals[i]:
                problems.append(f"'kv_cache_groups[{i}].prefill_checkpoint_blocks' is not declared; vLLM 0.32.0 "
                                "needs the prefill-checkpoint geometry of every prefix-cacheable state group")
    if is_glm_5_3_flash(cfg.model):
        if cfg.prefix_match_unit is not None and cfg.prefix_match_unit % 4:
            problems.append(f"'prefix_match_unit' ({cfg.prefix_match_unit}) must be a multiple of 4 for "
                            "GLM-5.3-Flash prefix caching")
        if cfg.max_num_batched_tokens % 4:
            problems.append(f"'max_num_batched_tokens' ({cfg.max_num_batched_tokens}) must be a multiple of 4 "
                            "for GLM-5.3-Flash prefix caching")
    if cfg.num_gpu_blocks is not None and not problems:
        need = startup_blocks(cfg)
        usable = cfg.num_gpu_blocks - 1
        if usable < need:
            problems.append(f"'num_gpu_blocks' ({cfg.num_gpu_blocks}) leaves {usable} usable blocks, but one "
                            f"request of max_model_len ({cfg.max_model_len}) needs {need}")
    return problems


def check_engine(cfg, source: str | None = None) -> None:
    """Raise :class:`ConfigError` listing every problem of the grouped-prefix rule."""
    problems = grouped_prefix_caching_problems(cfg)
    if problems:
        where = f" in {source}" if source else ""
        raise ConfigError(f"grouped prefix caching refused{where}: " + "; ".join(problems)
                          + ". Set enable_prefix_caching = false for a cold replay.")
