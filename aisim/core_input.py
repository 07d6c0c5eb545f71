"""What the compiled replay core receives: one resolved configuration, one trace.

:func:`core_config` derives a :class:`CoreConfig` from an
:class:`~aisim.config.engine.EngineConfig` once, in Python, where every rule
of vLLM's start-up (group block sizes, hash block size, spec-groups, the
step-time model) is applied.  ``aisim._core.engine.Engine(config, trace)``
reads both objects once in its constructor and never looks back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class CoreConfig:
    """Every scalar and table the replay core needs, resolved.

    Attributes
    ----------
    num_gpu_blocks, block_size, max_model_len : int
        Pool size (null block included), the engine's block size, longest sequence.
    enable_prefix_caching : bool
    watermark_blocks : int
        Blocks kept free when admitting waiting requests.
    max_num_batched_tokens, max_num_scheduled_tokens : int
        Input budget and token budget of one step.
    max_num_seqs, max_num_active_seqs : int
        Running requests and requests in flight.
    long_prefill_token_threshold : int
    long_prefill_token_threshold_adaptive, enable_chunked_prefill : bool
    priority_policy : bool
        ``policy == "priority"``.
    scheduler_reserve_full_isl, async_scheduling : bool
    groups : tuple of dict
        One spec per KV-cache group in group-id order
        (:func:`aisim.config.kvgroups.resolve_groups`).
    hash_block_size, sched_block_size, cache_block_size : int
        Granularity of block hashes, the scheduler block, the Mamba block.
    fine_grained : bool
        Partial hash hits enabled.
    retention : int
        ``prefix_cache_retention_interval``; -1 for None.
    rules : dict
        The release's rule switches the core reads, ``RulesC``'s fields
        (:func:`aisim.config.versions.core_rules`); the core never sees a version.
    mamba_split, mamba_partial, mamba_has_ckpt : bool
    mamba_ckpt_align : int
        Mamba block-aligned split settings.
    mamba_output_caching : bool
        A synchronous engine with Mamba layers and prefix caching whose release caches the
        final blocks after every output (``Rules.mamba_sync_output_caches_final_blocks``).
    aware_window : int
        ``cache_aware_admission_window`` as the scheduler resolves it: 0 unless the policy is
        FCFS and prefix caching is on.
    aware_threshold : float
        ``cache_aware_admission_threshold``: the KV usage from which the window applies.
    base_s, per_token_s, per_req_s : float
        Linear step-time coefficients.
    step_time : dict or None
        Roofline or table model (:func:`aisim.perf.step_time_args`); None
        for the linear model.
    time_scale : float
        Every step time multiplied by this (``time_model.time_scale``).
    speculative : dict or None
        Speculative decoding as the scheduler derives it and the acceptance
        rule in the core's terms (:func:`aisim.config.speculative.core_args`);
        None without speculative decoding.
    kv_offload : dict or None
        The CPU tier in the core's terms (:func:`offload_args`); None without KV offload.
    """

    num_gpu_blocks: int
    block_size: int
    max_model_len: int
    enable_prefix_caching: bool
    watermark_blocks: int
    max_num_batched_tokens: int
    max_num_scheduled_tokens: int
    max_num_seqs: int
    max_num_active_seqs: int
    long_prefill_token_threshold: int
    long_prefill_token_threshold_adaptive: bool
    enable_chunked_prefill: bool
    priority_policy: bool
    scheduler_reserve_full_isl: bool
    async_scheduling: bool
    groups: tuple
    hash_block_size: int
    sched_block_size: int
    cache_block_size: int
    fine_grained: bool
    retention: int
    rules: dict
    mamba_split: bool
    mamba_partial: bool
    mamba_has_ckpt: bool
    mamba_ckpt_align: int
    mamba_output_caching: bool
    aware_window: int
    aware_threshold: float
    base_s: float
    per_token_s: float
    per_req_s: float
    step_time: dict | None
    speculative: dict | None = None
    time_scale: float = 1.0
    kv_offload: dict | None = None


def core_config(engine) -> CoreConfig:
    """Resolve ``engine`` into the configuration the replay core reads.

    Parameters
    ----------
    engine : aisim.config.engine.EngineConfig

    Returns
    -------
    CoreConfig
    """
    from aisim.config.kvgroups import STATE_KINDS, expand_groups, resolve_groups
    from aisim.config.speculative import core_args
    from aisim.perf import step_time_args

    g = resolve_groups(engine)
    tm = engine.time_model
    return CoreConfig(
        num_gpu_blocks=int(engine.num_gpu_blocks),
        block_size=int(engine.block_size),
        max_model_len=int(engine.max_model_len),
        enable_prefix_caching=bool(engine.enable_prefix_caching),
        watermark_blocks=int(engine.watermark_blocks),
        max_num_batched_tokens=int(engine.max_num_batched_tokens),
        max_num_scheduled_tokens=int(engine.token_budget),
        max_num_seqs=int(engine.max_num_seqs),
        max_num_active_seqs=int(engine.active_seqs),
        long_prefill_token_threshold=int(engine.long_prefill_token_threshold),
        long_prefill_token_threshold_adaptive=bool(engine.long_prefill_token_threshold_adaptive),
        enable_chunked_prefill=bool(engine.enable_chunked_prefill),
        priority_policy=engine.policy == "priority",
        scheduler_reserve_full_isl=bool(engine.scheduler_reserve_full_isl),
        async_scheduling=bool(engine.async_scheduling),
        groups=tuple(dict(s) for s in g["groups"]),
        hash_block_size=int(g["hash_block_size"]),
        sched_block_size=int(g["sched_block_size"]),
        cache_block_size=int(g["cache_block_size"]),
        fine_grained=bool(g["fine_grained"]),
        retention=int(g["retention"]),
        rules=dict(g["rules"]),
        mamba_split=bool(g["mamba_split"]),
        mamba_partial=bool(g["mamba_partial"]),
        mamba_has_ckpt=bool(g["mamba_has_ckpt"]),
        mamba_ckpt_align=int(g["mamba_ckpt_align"]),
        # Scheduler.update_from_output: has_mamba_layers, not async_scheduling, prefix caching.
        mamba_output_caching=bool(g["rules"]["mamba_sync_output_caches_final_blocks"] and not engine.async_scheduling
                                  and engine.enable_prefix_caching
                                  and any(x["type"] in STATE_KINDS for x in expand_groups(engine.groups))),
        # Scheduler.__init__: the window applies under FCFS with prefix caching only.
        aware_window=int(engine.cache_aware_admission_window
                         if engine.policy == "fcfs" and engine.enable_prefix_caching else 0),
        aware_threshold=float(engine.cache_aware_admission_threshold),
        base_s=float(tm.base_s),
        per_token_s=float(tm.per_token_s),
        per_req_s=float(tm.per_req_s),
        step_time=step_time_args(tm, engine),
        time_scale=float(tm.time_scale),
        speculative=core_args(engine),
        kv_offload=offload_args(engine),
    )


def offload_args(engine) -> dict | None:
    """``kv_offload`` as the core reads it (ext/offload.pxd ``OffConfC``), or None."""
    from aisim.perf.transfer import disk_args, link_bytes_per_s

    off = engine.kv_offload
    if off is None:
        return None
    bpc = off.chunk_blocks(engine.block_size)
    return {
        "cpu_chunks": off.num_chunks(engine.block_size),
        "tokens_per_chunk": bpc * engine.block_size,
        "blocks_per_chunk": bpc,
        "prompt_only": off.prompt_only,
        "load_delay": off.load_delay_steps,
        "store_delay": off.store_delay_steps,
        "max_inflight_loads": off.max_num_inflight_kv_loads or 0,
        "chunk_bytes": off.chunk_bytes(engine.block_size),
        "link_bytes_per_s": link_bytes_per_s(off),
        "disk": disk_args(off),
    }


@dataclass(frozen=True)
class CoreTrace:
    """The request arrays of one replay, or of one piece of it, in trace order (built by :mod:`aisim.replay`).

    Attributes
    ----------
    prompt_len, max_tokens : numpy.ndarray of int64
    priority : numpy.ndarray of int32
        Lower runs first (priority policy).
    arrival_key : numpy.ndarray of float64
        The arrival step or time, the tie-break of the priority heap.
    id_rank : numpy.ndarray of int32
        Rank of each request id in string order.
    seg_off, seg_cnt : numpy.ndarray of int32
        Each request's first prompt segment and segment count.
    out_stream : numpy.ndarray of uint64
        Token stream of each request's output tokens.
    seg_stream, seg_first, seg_len : numpy.ndarray
        The prompt segments (uint64 stream, int64 first offset, int64 length).
    arrival_step : numpy.ndarray of int64 or None
        Arrival by engine iteration (step-clocked traces).
    arrival_time : numpy.ndarray of float64 or None
        Arrival in seconds (time-clocked traces); exactly one of the two is set.
    next_turn : numpy.ndarray of int32 or None
        Closed loop: the request sent when this one finishes (-1: none).
    think_s : numpy.ndarray of float64 or None
        Closed loop: seconds between the previous turn's finish and this one.
    accept_off, accept_cnt : numpy.ndarray of int32 or None
        Speculative decoding: each request's slice of ``accept_values`` (count
        0: the configured acceptance rule).
    accept_values : numpy.ndarray of int64 or None
        The trace's per-request ``accept`` lists, concatenated.
    next_think : numpy.ndarray of float64 or None
        Closed loop, a piece of a streamed trace: the think time of each
        request's next turn (a whole trace derives it from ``next_turn`` and
        ``think_s``).
    follows : numpy.ndarray of int8 or None
        Closed loop, a piece of a streamed trace: the request is an earlier
        request's next turn (sent by that one's finish).
    private : numpy.ndarray of int8 or None
        1 where the request shares no KV block with any other request of the
        whole trace (:func:`private_requests`): the core may cache its blocks
        without computing their keys.  None: no request is taken as private.
    shared_tokens : numpy.ndarray of int64 or None
        Leading tokens of each request that another request of the whole trace
        shares (:func:`aisim._core.hashing.shared_prefix_tokens`): the core
        caches the blocks past them without computing their keys (no other
        request can look them up).  None: only ``private`` requests are.
    run_node : numpy.ndarray of int32 or None
        With ``shared_tokens``: the node of every run of every request (its
        prompt segments, then its output; request ``i``'s from ``seg_off[i] + i``
        on), -1 where no other request holds the run: a block of a run that no
        other request in the engine holds is cached outside the map until one
        arrives.
    node_longest : numpy.ndarray of int32 or None
        With ``run_node``: the longest run of each node (room for the hashes of
        its blocks, computed once for every request holding it).
    frontend_s : numpy.ndarray of float64 or None
        The API server's seconds for each request before the engine sees it
        (:func:`aisim.perf.frontend.request_costs`); None: engine only.
    shared_block : int
        Tokens per block hash at which :meth:`with_shared_runs` computes
        ``private``, ``shared_tokens``, ``run_node`` and ``node_longest`` when
        the core asks for them (0: never).
    """

    prompt_len: np.ndarray
    max_tokens: np.ndarray
    priority: np.ndarray
    arrival_key: np.ndarray
    id_rank: np.ndarray
    seg_off: np.ndarray
    seg_cnt: np.ndarray
    out_stream: np.ndarray
    seg_stream: np.ndarray
    seg_first: np.ndarray
    seg_len: np.ndarray
    arrival_step: np.ndarray | None = None
    arrival_time: np.ndarray | None = None
    next_turn: np.ndarray | None = None
    think_s: np.ndarray | None = None
    accept_off: np.ndarray | None = None
    accept_cnt: np.ndarray | None = None
    accept_values: np.ndarray | None = None
    next_think: np.ndarray | None = None
    follows: np.ndarray | None = None
    private: np.ndarray | None = None
    shared_tokens: np.ndarray | None = None
    run_node: np.ndarray | None = None
    node_longest: np.ndarray | None = None
    frontend_s: np.ndarray | None = None
    shared_block: int = 0

    def with_shared_runs(self) -> "CoreTrace":
        """This trace with the arrays lazily keyed blocks read (:func:`shared_runs` at
        ``shared_block``), computed only when the core's cache can key blocks lazily (the core
        asks: a replay whose cache keys every block skips the pass); ``self`` when
        ``shared_block`` is 0."""
        return shared_runs(self, self.shared_block) if self.shared_block else self


def private_requests(trace: CoreTrace, hash_block_size: int) -> np.ndarray:
    """Which requests of a whole trace share no KV block with any other.

    Block keys are a chain (vllm/v1/core/kv_cache_utils.py, ``hash_block_tokens``): two
    requests share a block only if they share their first hash block, prompt tokens then
    output tokens.  A request whose first block no other request of the trace has, or that
    never fills a block, is private.

    Parameters
    ----------
    trace : CoreTrace
        Every request the engine will see.
    hash_block_size : int
        Tokens per block hash (:attr:`CoreConfig.hash_block_size`).

    Returns
    -------
    numpy.ndarray of int8
    """
    from aisim._core.hashing import first_block_keys

    return private_of_keys(first_block_keys(trace, hash_block_size))


def shared_runs(trace: CoreTrace, hash_block_size: int) -> CoreTrace:
    """``trace`` (a whole trace) with its private requests, the tokens each request shares with
    another and the nodes of its runs (``shared_tokens``, ``run_node``, ``node_longest``;
    :func:`aisim._core.hashing.shared_prefix_tokens`).

    Parameters
    ----------
    trace : CoreTrace
        Every request the engine will see.
    hash_block_size : int
        Tokens per block hash (:attr:`CoreConfig.hash_block_size`).

    Returns
    -------
    CoreTrace
    """
    from aisim._core.hashing import shared_prefix_tokens

    tokens, nodes, longest = shared_prefix_tokens(trace, nodes=True)
    counts = np.asarray(trace.seg_cnt, dtype=np.int64)
    # The nodes are laid out by request: request i's runs from seg_off[i] + i on.
    in_order = np.array_equal(np.asarray(trace.seg_off, dtype=np.int64), np.cumsum(counts) - counts)
    return replace(trace, private=(tokens < hash_block_size).astype(np.int8), shared_tokens=tokens,
                   run_node=nodes if in_order else None, node_longest=longest if in_order else None)


def private_of_keys(keys: np.ndarray) -> np.ndarray:
    """:func:`private_requests` from every request's first block key (``aisim._core.hashing.
    first_block_keys``, 0: no full block): int8, 1 where no other request has the key."""
    order = np.argsort(keys)
    ranked = keys[order]
    twin = ranked[1:] == ranked[:-1]  # a key equal to its neighbour's in sorted order is shared
    shared = np.zeros(len(keys), dtype=bool)
    shared[1:] |= twin
    shared[:-1] |= twin
    private = np.empty(len(keys), dtype=np.int8)
    private[order] = ~shared | (ranked == 0)
    return private
