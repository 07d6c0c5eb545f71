"""The vLLM releases whose rules aisim models: one row per release, written once.

A release is a :class:`Release` row of :data:`RELEASES`: its version (kept whole,
``major.minor.patch``), what ``vllm serve`` starts with by default, and its
:class:`Rules`, named switches where the releases' scheduler and KV-cache
manager differ.  Everything that names a release or depends on one reads it
from here: configuration validation, plans, the ``--vllm-version`` option, the
configuration reference (``docs/configuration.md``), the replay core (which receives the core's switches as one struct,
``RulesC`` in ``ext/types.pxd``, filled by :func:`aisim.core_input.core_config`)
and ``docs/vllm-version-rules.md`` (whose switch table :func:`rules_table`
writes and a test compares).  Adding a release adds a row here, its logs to
``tests/data/oracle/`` and its tests.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Rules:
    """One release's rule switches (False: the oldest release's behaviour).

    Every field is one rule, named for what the newer behaviour does; its comment
    cites where vLLM enforces it (paths relative to the ``vllm`` package).  Fields
    of :data:`CORE_RULES` reach the replay core as ``RulesC``.
    """

    # v1/core/sched/scheduler.py Scheduler._mamba_block_aligned_split: the last cacheable
    # position is ((num_tokens - 1) // B) * B (0.31: num_tokens - num_tokens % B).
    mamba_split_leaves_last_token: bool = False
    # v1/core/sched/scheduler.py Scheduler._mamba_block_aligned_split: the prefill checkpoint is
    # placed in hash blocks with fine-grained hits, else in scheduler blocks (0.31: hash blocks).
    mamba_split_ckpt_in_sched_blocks: bool = False
    # v1/kv_cache_interface.py get_mamba_prefill_checkpoint_position: under the EAGLE drop the
    # position rounds num_tokens down, not num_tokens - 1 (and the split's tail follows it).
    ckpt_position_rounds_n_under_drop: bool = False
    # v1/core/single_type_kv_cache_manager.py MambaManager.get_num_blocks_to_allocate: the
    # checkpoint is checked at cache_hit_alignment_tokens (0.31: at the hash block size).
    mamba_alloc_ckpt_at_alignment: bool = False
    # v1/core/single_type_kv_cache_manager.py MambaManager.get_num_blocks_to_allocate: draft
    # blocks count in the cap only on the first allocation (0.31: also with a checkpoint).
    mamba_drafts_capped_first_only: bool = False
    # v1/core/single_type_kv_cache_manager.py MambaManager.allocate_new_blocks: draft blocks
    # inside the padding relocate also with a checkpoint, up to the padding minus it.
    mamba_relocate_drafts_with_ckpt: bool = False
    # v1/core/single_type_kv_cache_manager.py MambaManager._cache_partial_tail_block: the tail
    # is keyed at ((prompt - 1) // H) * H, index cdiv(n, B) - 1, block-aligned too.
    mamba_tail_key_leaves_last_token: bool = False
    # v1/core/single_type_kv_cache_manager.py MambaManager._cache_partial_tail_block: the
    # checkpoint key is kept at the prompt boundary, a retained boundary or the junction.
    mamba_ckpt_key_kept_at_boundaries: bool = False
    # v1/core/single_type_kv_cache_manager.py FullAttentionManager._cache_partial_tail_block:
    # the partial tail key sits at ((prompt - 1) // H) * H (0.31: (prompt // H) * H).
    full_tail_key_leaves_last_token: bool = False
    # v1/core/single_type_kv_cache_manager.py MambaManager._cache_partial_tail_block: a block
    # already keyed at that length is left alone (early return, nothing marked this step).
    mamba_tail_keyed_once: bool = False
    # v1/core/sched/scheduler.py Scheduler.schedule: the running pass goes on after a request
    # preempts itself (`continue` when the request is PREEMPTED; before: the pass stops).
    running_pass_continues_after_self_preemption: bool = False
    # v1/core/single_type_kv_cache_manager.py SingleTypeKVCacheManager.cache_blocks: blocks
    # cached are capped by the hashes the request has (speculative decoding).
    cache_blocks_capped_by_hashes: bool = False
    # v1/core/sched/scheduler.py Scheduler.update_from_output / _update_request_with_output:
    # with drafts, a stop inside the accepted tokens lowers num_computed_tokens, placeholders
    # count every returned token, and every output caches its final blocks (also synchronous).
    spec_output_caches_final_blocks: bool = False
    # v1/core/sched/scheduler.py Scheduler.schedule: the long-prefill token threshold caps a
    # chunk only with chunked prefill on.
    long_prefill_cap_needs_chunked_prefill: bool = False
    # v1/core/sched/scheduler.py Scheduler._reorder_waiting_by_cached_prefix: FCFS admission
    # looks ahead within cache_aware_admission_window by cached prefix (config/scheduler.py).
    cache_aware_admission: bool = False
    # v1/core/sched/scheduler.py Scheduler.update_from_output: the synchronous engine with Mamba
    # layers and prefix caching caches a request's final blocks after each output.
    mamba_sync_output_caches_final_blocks: bool = False
    # config/vllm.py VllmConfig.num_hash_lookahead_tokens: EAGLE/MTP with prefix caching hash
    # one token past each block instead of dropping the last matched block.
    hash_lookahead_replaces_eagle_drop: bool = False
    # v1/core/sched/scheduler.py Scheduler._spec_decode_step_blocks: an attribute (0.31: a method).
    spec_decode_step_blocks_attribute: bool = False
    # v1/kv_cache_interface.py MambaSpec.prefill_checkpoint_blocks: every prefix-cacheable state
    # group needs the prefill-checkpoint geometry.
    needs_checkpoint_geometry: bool = False

    def since(self, **switches) -> "Rules":
        """These rules with ``switches`` turned on (a newer release)."""
        return replace(self, **{k: True for k in switches if switches[k]})


@dataclass(frozen=True)
class Release:
    """One vLLM release: its version, ``vllm serve``'s start-up defaults and its rules.

    Attributes
    ----------
    version : str
        ``major.minor.patch``.
    block_size : int
        ``CacheConfig.DEFAULT_BLOCK_SIZE`` (config/cache.py): tokens per block when unset.
    gpu_memory_utilization : float
        ``CacheConfig.gpu_memory_utilization`` when unset, as resolved
        (``resolved_gpu_memory_utilization`` with the extensible KV cache).
    extensible_kv_cache : bool
        ``CacheConfig.enable_extensible_kv_cache`` on CUDA by default: the KV cache is
        sized from the memory left after CUDA graph capture and warmup.
    async_scheduling : bool
        ``SchedulerConfig.async_scheduling`` when unset: None until ``VllmConfig.__post_init__``
        (config/vllm.py) turns it on, unless a pooling model, a speculative method or executor that
        cannot run it, or pipeline parallelism turns it off.
    gb10_small_batches : bool
        ``EngineArgs.get_batch_defaults`` (engine/arg_utils.py) gives a GB10 (compute capability
        12.1) the small batch limits despite its memory.
    rules : Rules
    """

    version: str
    block_size: int
    gpu_memory_utilization: float
    extensible_kv_cache: bool
    async_scheduling: bool
    gb10_small_batches: bool
    cudagraph_rule: str
    rules: Rules


_R031 = Rules()
_R032 = _R031.since(
    mamba_split_leaves_last_token=True, mamba_split_ckpt_in_sched_blocks=True,
    ckpt_position_rounds_n_under_drop=True, mamba_alloc_ckpt_at_alignment=True,
    mamba_drafts_capped_first_only=True, mamba_relocate_drafts_with_ckpt=True,
    mamba_tail_key_leaves_last_token=True, mamba_ckpt_key_kept_at_boundaries=True,
    full_tail_key_leaves_last_token=True, spec_decode_step_blocks_attribute=True,
    needs_checkpoint_geometry=True)
_R033 = _R032.since(
    mamba_tail_keyed_once=True, running_pass_continues_after_self_preemption=True,
    cache_blocks_capped_by_hashes=True, spec_output_caches_final_blocks=True,
    hash_lookahead_replaces_eagle_drop=True)
_R034 = _R033.since(
    long_prefill_cap_needs_chunked_prefill=True, cache_aware_admission=True,
    mamba_sync_output_caches_final_blocks=True)

# The releases, oldest first: one row each.
RELEASES = (
    Release("0.31.0", block_size=16, gpu_memory_utilization=0.92, extensible_kv_cache=False, async_scheduling=True,
            gb10_small_batches=False, cudagraph_rule="shared", rules=_R031),
    Release("0.32.0", block_size=16, gpu_memory_utilization=0.92, extensible_kv_cache=False, async_scheduling=True,
            gb10_small_batches=False, cudagraph_rule="shared", rules=_R032),
    Release("0.33.0", block_size=16, gpu_memory_utilization=0.92, extensible_kv_cache=False, async_scheduling=True,
            gb10_small_batches=True, cudagraph_rule="shared", rules=_R033),
    Release("0.34.0", block_size=64, gpu_memory_utilization=1.0, extensible_kv_cache=True, async_scheduling=True,
            gb10_small_batches=True, cudagraph_rule="split", rules=_R034),
)

# The switches the replay core reads (the fields of ``RulesC``, in this order).
CORE_RULES = (
    "mamba_split_leaves_last_token", "mamba_split_ckpt_in_sched_blocks", "ckpt_position_rounds_n_under_drop",
    "mamba_alloc_ckpt_at_alignment", "mamba_drafts_capped_first_only", "mamba_relocate_drafts_with_ckpt",
    "mamba_tail_key_leaves_last_token", "mamba_ckpt_key_kept_at_boundaries", "full_tail_key_leaves_last_token",
    "mamba_tail_keyed_once", "running_pass_continues_after_self_preemption", "cache_blocks_capped_by_hashes",
    "spec_output_caches_final_blocks", "long_prefill_cap_needs_chunked_prefill",
    "mamba_sync_output_caches_final_blocks",
)

_BY_VERSION = {r.version: r for r in RELEASES}
# The releases, oldest first.
SUPPORTED_VLLM_VERSIONS = tuple(_BY_VERSION)
# What a configuration without ``vllm_version`` follows: the newest release.
DEFAULT_VLLM_VERSION = SUPPORTED_VLLM_VERSIONS[-1]


def is_supported(version) -> bool:
    """Whether aisim models the rules of vLLM ``version``."""
    return version in _BY_VERSION


def release(version: str | None = None) -> Release:
    """The row of ``version`` (default: :data:`DEFAULT_VLLM_VERSION`); the caller checked it."""
    return _BY_VERSION[version or DEFAULT_VLLM_VERSION]


def rules(version: str | None = None) -> Rules:
    """The rule switches of ``version`` (default: :data:`DEFAULT_VLLM_VERSION`)."""
    return release(version).rules


def core_rules(version: str | None = None) -> dict:
    """The switches of ``version`` the replay core reads, as ``RulesC``'s fields."""
    r = rules(version)
    return {name: bool(getattr(r, name)) for name in CORE_RULES}


def supported_text(sep: str = " and ") -> str:
    """The supported releases as prose, e.g. ``"0.31.0, 0.32.0 and 0.33.0"``."""
    if len(SUPPORTED_VLLM_VERSIONS) < 3 or sep != " and ":
        return sep.join(SUPPORTED_VLLM_VERSIONS)
    return ", ".join(SUPPORTED_VLLM_VERSIONS[:-1]) + " and " + SUPPORTED_VLLM_VERSIONS[-1]


def _rule_comments() -> dict:
    """Each switch's comment lines from this file's source (the rule and its vLLM function)."""
    import inspect

    out, pending = {}, []
    for line in inspect.getsource(Rules).splitlines():
        s = line.strip()
        if s.startswith("#"):
            pending.append(s[1:].strip())
        elif ":" in s and s.split(":")[0].isidentifier() and pending:
            out[s.split(":")[0]] = " ".join(pending)
            pending = []
        else:
            pending = []
    return out


def rules_table() -> str:
    """The Markdown table of every switch by release (``docs/vllm-version-rules.md`` holds it)."""
    comments = _rule_comments()
    head = "| switch | " + " | ".join(r.version for r in RELEASES) + " | rule (vLLM file, function) |"
    rows = [head, "|---|" + "---|" * len(RELEASES) + "---|"]
    for f in fields(Rules):
        marks = " | ".join("on" if getattr(r.rules, f.name) else "-" for r in RELEASES)
        core = " (core)" if f.name in CORE_RULES else ""
        rows.append(f"| `{f.name}`{core} | {marks} | {comments[f.name]} |")
    rows.append("| serve: `block_size` | " + " | ".join(str(r.block_size) for r in RELEASES)
                + " | config/cache.py `CacheConfig.DEFAULT_BLOCK_SIZE` |")
    rows.append("| serve: `gpu_memory_utilization` | " + " | ".join(f"{r.gpu_memory_utilization:g}" for r in RELEASES)
                + " | config/cache.py `CacheConfig.resolved_gpu_memory_utilization` |")
    rows.append("| serve: extensible KV cache | " + " | ".join("on" if r.extensible_kv_cache else "-" for r in RELEASES)
                + " | config/cache.py `CacheConfig.enable_extensible_kv_cache` |")
    rows.append("| serve: async scheduling | " + " | ".join("on" if r.async_scheduling else "-" for r in RELEASES)
                + " | config/vllm.py `VllmConfig.__post_init__` |")
    rows.append("| serve: GB10 small batches | " + " | ".join("on" if r.gb10_small_batches else "-" for r in RELEASES)
                + " | engine/arg_utils.py `EngineArgs.get_batch_defaults` |")
    rows.append("| serve: CUDA-graph padding | " + " | ".join(r.cudagraph_rule for r in RELEASES)
                + " | config/vllm.py `VllmConfig._split_cudagraph_capture_sizes` (split) |")
    return "\n".join(rows) + "\n"
