"""The engine loop of a replay: arrivals, schedule/update interleave, step time.

Reproduces how vLLM's ``EngineCore`` drives the scheduler
(``vllm/v1/engine/core.py``): a synchronous engine does schedule then
update each iteration (``EngineCore.step``); an asynchronous one keeps a batch
queue of two (``step_with_batch_queue``: schedule step k+1 before processing
step k's output).  An iteration runs only while ``Scheduler.has_requests()``
(or, async, while a batch is in flight); otherwise the engine idles until the
next arrival, and the replay jumps there.

Arrivals are by engine iteration (``arrival_step``) or by simulated clock
(``arrival_time``): a request is added before the first iteration whose clock
has reached its arrival.  The clock advances by each scheduled batch's step
time; the linear model is ``base_s + per_token_s * tokens + per_req_s *
requests`` evaluated left to right, as the oracle's recorder did.
"""

cimport cython
from cpython.buffer cimport PyBuffer_FillInfo
from libc.string cimport memcpy, memset

import numpy as np

from aisim._core.blockpool cimport bp_nodes
from aisim._core.gaps cimport gaps_add, gaps_release
from aisim._core.heap cimport heap_init, heap_pop, heap_push, heap_release
from aisim._core.kvcache cimport (
    MAX_GROUPS, GroupSpecC, kv_allocate_slots, kv_decode_period, kv_end_schedule, kv_init,
    kv_lazy_ok, kv_new_step_starts, kv_node_hashes, kv_decode_settled, kv_release, specs_from_dicts,
)
from aisim._core.memory cimport mem_calloc, mem_free, mem_grow, mem_resize
from aisim._core.util cimport num_tokens, tmin
from aisim._core.steptime cimport TM_LINEAR, TimeModelC, tm_load, tm_step_time
from aisim._core.request cimport ReqC, ST_FINISHED, ST_PENDING
from aisim._core.offload cimport (
    OR_DONE, OR_FLUSH, OR_LOAD, OR_LOOKUP, OR_RECV, OR_STORE, DiskC, DiskConfC, OffConfC, OffRecC, OffloadC,
)
from aisim._core.scheduler cimport (
    BatchC, SchedC, SchedConfC, batch_grow, batch_init, batch_release, disk_init, off_init, off_next_landing, off_release,
    sched_add_request,
    sched_admit_waiting, sched_cap, sched_end_schedule, sched_has_requests, sched_init, sched_release,
    sched_schedule, sched_step_lpt, sched_update, off_quiet_bound, off_quiet_meta, off_stamp_one, off_worker_output,
)
from aisim._core.types cimport (
    block_id_t, flag_t, hash_t, int32_t, int64_t, req_t, sec_t, step_t, tok_t,
)


include "engine_rows.pxi"
include "engine_offload.pxi"
include "engine_disk.pxi"


# Iterations in a row without a scheduled token or a finish before a replay is
# declared stuck (vLLM itself would spin forever).
cdef int64_t STALL_LIMIT = 100000

# Slots a streaming replay starts with, when it may hold more requests than that; it grows as
# needed.  A replay of fewer requests gets exactly as many (as a whole trace does).
cdef req_t FIRST_SLOTS = 4096

# Segment entries a streaming replay starts with.
cdef int64_t FIRST_SEGMENTS = 1 << 16

# Most step rows a whole trace's first estimate reserves (the columns grow past it).
cdef int64_t MAX_FIRST_STEP_ROWS = 1 << 20


def _c_array(a, dtype):
    return np.ascontiguousarray(a, dtype=dtype)


cdef int64_t _pow2_at_least(int64_t n) noexcept nogil:
    cdef int64_t p = 1
    while p < n:
        p <<= 1
    return p


# Free functions over an Engine (its C fields), one job per file:
include "engine_slots.pxi"      # slots, the trace window, the open queue and the arenas grow
include "engine_client.pxi"     # the client's sends, its cap, closed-loop turns, the API server's queue
include "engine_replica.pxi"    # a deployment's replica: one request fed, one iteration stepped
include "engine_macro.pxi"      # macro-steps: a quiet stretch of decoding in one move


cdef class Engine:
    """One replay: requests, KV cache and scheduler, built from plain arrays.

    Made by ``aisim.replay``, which validates every argument; this class
    trusts them.  Two ways to use it:

    - whole: ``Engine(config, trace).run()`` replays a whole trace and
      returns every result column at once (``run`` can be called once);
    - streaming: ``Engine(config, timed=..., expected=N)``, then ``feed``
      chunks of the trace in order and ``end_input`` after the last;
      ``advance`` runs until it needs the next chunk, has ``out_rows`` result
      rows waiting, or is done; ``take_steps`` and ``take_requests`` hand the
      rows over.  Its memory follows the requests in flight (fed and not yet
      retired), not the trace.

    Both give the same rows: a request's row is written when it and every
    request before it in the trace have finished (trace order), a step's
    when the step ends.
    """

    def __cinit__(self):
        self.reqs = NULL
        self.finished = True

    def __init__(self, config not None, trace=None, bint record_events=False, *, timed=None, expected=None,
                 out_rows=None, bint replica=False, int64_t max_concurrency=0,
                 bint macro_steps=True):
        """Read the resolved configuration, and the whole trace when given.

        Parameters
        ----------
        config : aisim.core_input.CoreConfig
        trace : aisim.core_input.CoreTrace, optional
            A whole trace (fed and ended here); without it, the engine streams.
        record_events : bool
            Keep the decision-log events (whole traces only).
        timed : bool, optional
            Streaming: arrivals in seconds (else by engine iteration).
        expected : int, optional
            Streaming: the requests that will be fed (at most); sizes the
            first slots.
        out_rows : int, optional
            Streaming: ``advance`` returns when this many step or request
            rows wait to be taken (default 65,536).
        replica : bool
            Streaming: a replica of a deployment (``aisim._core.deploy``), fed one request at a
            time and stepped by the deployment's clock; it may record decision-log events.
        max_concurrency : int
            The client sends at most this many requests at a time (0: no cap): a request due
            while that many are in flight is sent when one finishes (``vllm bench serve
            --max-concurrency``).  Open-loop arrivals only.
        macro_steps : bool
            Replay quiet stretches of decoding in one move (engine_macro.pxi); the output is
            byte-identical either way.  A deployment's replica runs a stretch only up to the
            deployment's next event (``replica_step``).
        """
        cdef SchedConfC conf
        cdef GroupSpecC specs[MAX_GROUPS]
        cdef tok_t block_size = config.block_size
        cdef tok_t max_model_len = config.max_model_len
        cdef int32_t max_num_seqs = config.max_num_seqs
        cdef req_t cap
        cdef req_t i
        memset(&conf, 0, sizeof(SchedConfC))
        if max_concurrency < 0:
            raise ValueError(f"max_concurrency must be >= 0, got {max_concurrency}")
        self.max_conc = max_concurrency
        self.whole = trace is not None
        if self.whole:
            n = len(trace.prompt_len)
            self.timed = trace.arrival_time is not None
            cap = <req_t>max(n, 1)
            self.out_rows = (<int64_t>1) << 62
        else:
            if timed is None:
                raise TypeError("a streaming Engine needs timed=True or timed=False")
            if record_events and not replica:
                raise ValueError("decision-log events are recorded for whole traces only")
            self.timed = bool(timed)
            # As many slots as requests when they are few (as a whole trace); else a first
            # helping that holds a full batch, grown on demand.
            cap = <req_t>(expected if expected is not None and 0 < expected <= FIRST_SLOTS
                          else max(FIRST_SLOTS, max_num_seqs + 1))
            self.out_rows = out_rows if out_rows is not None else 65536
        self.pool_cap = cap
        self.reqs = <ReqC*>mem_calloc(cap, sizeof(ReqC))
        self.free_slots = <req_t*>mem_calloc(cap, sizeof(req_t))
        for i in range(cap):
            self.free_slots[i] = cap - 1 - i  # slot 0 on top: a whole trace's slots are its indices
        self.n_free = cap
        self.slot_global = <int64_t*>mem_calloc(cap, sizeof(int64_t))
        self.slot_time = <sec_t*>mem_calloc(cap, sizeof(sec_t))
        self.slot_step = <step_t*>mem_calloc(cap, sizeof(step_t))
        self.slot_next = <int64_t*>mem_calloc(cap, sizeof(int64_t))
        self.slot_next_think = <sec_t*>mem_calloc(cap, sizeof(sec_t))
        self.slot_front = <sec_t*>mem_calloc(cap, sizeof(sec_t))
        self.slot_pin = <flag_t*>mem_calloc(cap, sizeof(flag_t))
        self.win_cap = _pow2_at_least(cap)
        self.win = <req_t*>mem_calloc(self.win_cap, sizeof(req_t))
        self.open_cap = _pow2_at_least(cap)
        self.open_q = <req_t*>mem_calloc(self.open_cap, sizeof(req_t))
        # A whole trace's segments arrive in one feed, which sizes the arena exactly (_make_room).
        _arena_init(&self.segs, 0 if self.whole else FIRST_SEGMENTS, 3, sizeof(hash_t), sizeof(tok_t),
                    sizeof(tok_t))
        _arena_init(&self.accs, 0, 1, sizeof(int64_t), 0, 0)
        heap_init(&self.rel, cap)
        conf.max_num_batched_tokens = config.max_num_batched_tokens
        conf.max_num_scheduled_tokens = config.max_num_scheduled_tokens
        conf.max_num_running_reqs = max_num_seqs
        conf.max_num_active_reqs = config.max_num_active_seqs
        conf.long_prefill_token_threshold = config.long_prefill_token_threshold
        conf.adaptive_threshold = config.long_prefill_token_threshold_adaptive
        conf.chunked_prefill = config.enable_chunked_prefill
        conf.priority = config.priority_policy
        conf.reserve_full_isl = config.scheduler_reserve_full_isl
        conf.async_scheduling = config.async_scheduling
        conf.max_model_len = max_model_len
        conf.rules = config.rules
        conf.mamba_output_caching = config.mamba_output_caching
        conf.aware_window = config.aware_window
        conf.aware_threshold = config.aware_threshold
        conf.mamba_split = config.mamba_split
        conf.cache_block_size = config.cache_block_size if config.cache_block_size > 0 else block_size
        conf.mamba_partial = config.mamba_partial
        conf.mamba_has_ckpt = config.mamba_has_ckpt
        conf.mamba_ckpt_align = config.mamba_ckpt_align
        groups = config.groups
        specs_from_dicts(groups, specs)
        kv_init(&self.kv, config.num_gpu_blocks, <int32_t>len(groups), specs, config.hash_block_size,
                config.sched_block_size, config.fine_grained, config.enable_prefix_caching,
                config.retention, conf.rules, max_model_len, config.watermark_blocks,
                max_num_seqs + 8)
        spec = config.speculative
        if spec is not None:
            self._set_speculative(spec, &conf)
        self.kv.eagle = conf.eagle_drop and config.enable_prefix_caching
        self.kv.hash_lookahead = conf.hash_lookahead
        sched_init(&self.sched, conf, &self.kv, self.reqs, cap)
        self.sched.gaps = &self.gaps
        if config.kv_offload is not None:
            self._set_offload(config.kv_offload, config.hash_block_size, max_model_len)
        _point_at_arenas(self)
        batch_init(&self.batches[0], self.sched.cap)
        batch_init(&self.batches[1], self.sched.cap)
        self.replica = replica
        self.poll_floor = -1
        if macro_steps:
            _macro_init(self)
        self.time_model.kind = TM_LINEAR
        self.time_model.base_s = config.base_s
        self.time_model.per_token_s = config.per_token_s
        self.time_model.per_req_s = config.per_req_s
        self.time_model.scale = config.time_scale
        if config.step_time is not None:
            self._tm_keep = tm_load(&self.time_model, config.step_time)
        self.record_events = record_events
        self.finished = False
        if self.whole:
            # A whole trace's result rows sized once: a row per request, and a step row per
            # request and per output token (a replay at low concurrency decodes a request a step;
            # grown if short).  Rows are reserved, not written: the room a replay does not use
            # costs no page, while each growth would copy every column written so far.
            _rcols_grow(&self.rcols, max(n, 1))
            _cols_grow(&self.cols, min(max(n + int(np.sum(trace.max_tokens)), 1024), MAX_FIRST_STEP_ROWS))
            self.feed(trace)
            self.end_input()

    cdef int _set_offload(self, dict off, tok_t hash_block, tok_t max_model_len) except -1:
        """KV offload behind the GPU cache (aisim.core_input.offload_args)."""
        cdef OffConfC oc
        memset(&oc, 0, sizeof(OffConfC))
        oc.cpu_chunks = off["cpu_chunks"]
        oc.tokens_per_chunk = off["tokens_per_chunk"]
        oc.hashes_per_chunk = <int32_t>(off["tokens_per_chunk"] // hash_block)
        oc.prompt_only = off["prompt_only"]
        oc.load_delay = off["load_delay"]
        oc.store_delay = off["store_delay"]
        oc.max_inflight_loads = off["max_inflight_loads"]
        oc.chunk_bytes = off["chunk_bytes"]
        oc.link_bps = off["link_bytes_per_s"]
        off_init(&self.off, oc, <int32_t>(max_model_len // oc.tokens_per_chunk + 1), self.kv.cap_slots, 64)
        if off.get("disk") is not None:
            _set_disk(&self.off, off["disk"], self.kv.cap_slots)
        self.sched.off = &self.off
        self.offload = True
        return 0

    cdef int _set_speculative(self, dict spec, SchedConfC* conf) except -1:
        """Speculative-decoding settings (aisim.core_input); the trace's ``accept`` lists come with ``feed``."""
        cdef const int64_t[::1] table = np.ascontiguousarray(spec["acc_table"], dtype=np.int64)
        conf.num_spec_tokens = spec["num_speculative_tokens"]
        conf.num_lookahead = spec["num_lookahead_tokens"]
        conf.draft_slots = spec["draft_slots"]
        conf.eagle_drop = spec["use_eagle_block_drop"]
        conf.hash_lookahead = spec["num_hash_lookahead_tokens"]
        conf.acc_kind = spec["acc_kind"]
        conf.acc_n = <int32_t>table.shape[0]
        conf.acc_table = &table[0]
        conf.acc_seed_mix = <hash_t>spec["acc_seed_mix"]
        self.time_model.drafter_fraction = spec["drafter_fraction"]
        self.time_model.drafter_base_s = spec["drafter_base_s"]
        self.time_model.drafter_per_token_s = spec["drafter_per_token_s"]
        self.time_model.drafter = (spec["drafter_fraction"] > 0 or spec["drafter_base_s"] > 0
                                   or spec["drafter_per_token_s"] > 0)
        self._spec_keep = table
        return 0

    def __dealloc__(self):
        if self.reqs == NULL:
            return
        batch_release(&self.batches[0])
        batch_release(&self.batches[1])
        self.sched.reqs = NULL
        sched_release(&self.sched)
        kv_release(&self.kv)
        _cols_release(&self.cols)
        _rcols_release(&self.rcols)
        _events_release(&self.events)
        gaps_release(&self.gaps)
        heap_release(&self.rel)
        _macro_release(&self.macro)
        mem_free(self.reqs)
        mem_free(self.free_slots)
        mem_free(self.slot_global)
        mem_free(self.slot_time)
        mem_free(self.slot_step)
        mem_free(self.slot_next)
        mem_free(self.slot_next_think)
        mem_free(self.slot_front)
        mem_free(self.srv_q)
        mem_free(self.slot_pin)
        mem_free(self.win)
        mem_free(self.open_q)
        _arena_release(&self.segs)
        _arena_release(&self.accs)
        if self.offload:
            off_release(&self.off)
        _off_cols_release(&self.off_cols)
        mem_free(self.off_reqs)
        mem_free(self.disk_steps)
        mem_free(self.disk_reqs)

    # -------------------------------------------------------------- input

    def feed(self, trace not None):
        """Append the next requests of the trace (a :class:`~aisim.core_input.CoreTrace` chunk).

        The chunk's ``next_turn`` are trace indices (of the whole trace);
        ``follows`` says which requests are some earlier request's next turn
        (sent by its finish, not at their own arrival) and ``next_think`` the
        think time of each request's next turn.  Left out, they are derived
        from ``next_turn`` and ``think_s`` within the chunk (a whole trace).
        """
        cdef Py_ssize_t i, n
        cdef int64_t base = self.loaded
        cdef req_t s
        cdef ReqC* r
        if self.ended:
            raise RuntimeError("Engine.feed after end_input")
        if self.kv.pool.n_nodes > 0:
            # Every request's runs must be counted where they are shared (kvcache kv_arrive).
            raise RuntimeError("Engine.feed after a trace fed whole with its run nodes")
        n = len(trace.prompt_len)
        if n == 0:
            return
        cdef const tok_t[::1] p_len = _c_array(trace.prompt_len, np.int64)
        cdef const tok_t[::1] m_tok = _c_array(trace.max_tokens, np.int64)
        cdef const int32_t[::1] prio = _c_array(trace.priority, np.int32)
        cdef const sec_t[::1] a_key = _c_array(trace.arrival_key, np.float64)
        cdef const int32_t[::1] rank = _c_array(trace.id_rank, np.int32)
        cdef const int32_t[::1] s_off = _c_array(trace.seg_off, np.int32)
        cdef const int32_t[::1] s_cnt = _c_array(trace.seg_cnt, np.int32)
        cdef const hash_t[::1] o_str = _c_array(trace.out_stream, np.uint64)
        cdef const hash_t[::1] g_str = _c_array(trace.seg_stream, np.uint64)
        cdef const tok_t[::1] g_first = _c_array(trace.seg_first, np.int64)
        cdef const tok_t[::1] g_len = _c_array(trace.seg_len, np.int64)
        cdef const sec_t[::1] a_time = _c_array(trace.arrival_time if self.timed else np.zeros(n), np.float64)
        cdef const step_t[::1] a_step = _c_array(trace.arrival_step if not self.timed else np.zeros(n), np.int64)
        nt_raw = trace.next_turn if trace.next_turn is not None else np.full(n, -1)
        th_raw = trace.think_s if trace.think_s is not None else np.zeros(n)
        cdef const int64_t[::1] nt = _c_array(nt_raw, np.int64)
        cdef const sec_t[::1] th = _c_array(th_raw, np.float64)
        follows = getattr(trace, "follows", None)
        next_think = getattr(trace, "next_think", None)
        if follows is None:  # a whole trace: its next turns are in it
            follows = np.zeros(n, dtype=np.int8)
            nt_local = np.asarray(nt_raw, dtype=np.int64) - base
            has = nt_local >= 0
            follows[nt_local[has]] = 1
            next_think = np.zeros(n)
            next_think[has] = np.asarray(th_raw, dtype=np.float64)[nt_local[has]]
        cdef const flag_t[::1] fol = _c_array(follows, np.int8)
        cdef const sec_t[::1] nth = _c_array(next_think, np.float64)
        # Requests sharing no block with any other are keyed lazily where the cache allows it.  A KV
        # offload tier too: its connector reads a request's own hashes (hash_extend), never the GPU
        # pool's keys, and only another request's GPU lookup could need a lazily cached block's key.
        cdef bint lazy_ok = kv_lazy_ok(&self.kv)
        if lazy_ok and getattr(trace, "shared_block", 0):
            trace = trace.with_shared_runs()  # the trace's shared runs, found only when used here
        lazy_ok = lazy_ok and getattr(trace, "private", None) is not None
        cdef const flag_t[::1] priv = _c_array(trace.private if lazy_ok else np.zeros(n), np.int8)
        # ... past the leading tokens another request shares (the rest of every request is its own).
        shared = getattr(trace, "shared_tokens", None) if lazy_ok else None
        cdef bint has_shared = shared is not None
        cdef const tok_t[::1] shr = _c_array(shared if has_shared else np.zeros(n), np.int64)
        cdef tok_t hbs = self.kv.hash_block_size
        # ... and, fed whole, the runs each request shares: a block of one that no other request in
        # the engine holds is cached outside the map until one arrives (kvcache _cache_group).
        nodes = getattr(trace, "run_node", None) if has_shared and self.loaded == 0 else None
        cdef bint has_nodes = nodes is not None and len(nodes) > 0 and self.kv.pool.n_nodes == 0
        if has_nodes:
            self._node_keep = np.ascontiguousarray(nodes, dtype=np.int32)
        cdef const int32_t[::1] run_node = self._node_keep if has_nodes else np.zeros(1, np.int32)
        cdef int32_t n_nodes = int(self._node_keep.max()) + 1 if has_nodes else 0
        cdef const int32_t[::1] longest = _c_array(trace.node_longest if has_nodes else np.zeros(1), np.int32)
        # The API server in front (aisim/perf/frontend.py): every chunk of a replay says so alike.
        front = getattr(trace, "frontend_s", None)
        if front is not None:
            self.front = True
        cdef const sec_t[::1] fr = _c_array(front if front is not None else np.zeros(n), np.float64)
        cdef int64_t n_seg = g_str.shape[0]
        # Speculative decoding: the requests' own `accept` lists (count 0: the configured rule).
        has_acc = trace.accept_values is not None and len(trace.accept_values) > 0
        cdef const int64_t[::1] acc_v = _c_array(trace.accept_values if has_acc else np.zeros(1), np.int64)
        cdef const int32_t[::1] acc_o = _c_array(trace.accept_off if has_acc else np.zeros(n), np.int32)
        cdef const int32_t[::1] acc_c = _c_array(trace.accept_cnt if has_acc else np.zeros(n), np.int32)
        cdef int64_t n_acc = len(trace.accept_values) if has_acc else 0
        with nogil:
            if has_nodes and n_nodes > 0:
                bp_nodes(&self.kv.pool, n_nodes)
                kv_node_hashes(&self.kv, n_nodes, &longest[0])
                self.kv.run_node = &run_node[0]
            if self.n_free < n:
                _grow_pool(self, <req_t>(self.pool_cap - self.n_free + n))
            _grow_window(self, self.loaded + n - self.retired)
            _make_room(self, &self.segs, False, n_seg)
            _make_room(self, &self.accs, True, n_acc)
            if n_seg:
                memcpy(<hash_t*>self.segs.col[0] + self.segs.n, &g_str[0], n_seg * sizeof(hash_t))
                memcpy(<tok_t*>self.segs.col[1] + self.segs.n, &g_first[0], n_seg * sizeof(tok_t))
                memcpy(<tok_t*>self.segs.col[2] + self.segs.n, &g_len[0], n_seg * sizeof(tok_t))
            if n_acc:
                memcpy(<int64_t*>self.accs.col[0] + self.accs.n, &acc_v[0], n_acc * sizeof(int64_t))
            for i in range(n):
                s = _occupy(self, base + i, a_time[i], a_step[i], nt[i], nth[i], not fol[i])
                r = &self.reqs[s]
                r.next_turn = <int32_t>nt[i]
                r.think_s = th[i]
                r.prompt_len = p_len[i]
                r.max_tokens = m_tok[i]
                r.priority = prio[i]
                r.arrival_key = a_key[i]
                r.id_rank = rank[i]
                r.seg_off = <int32_t>(self.segs.n + s_off[i])
                r.seg_cnt = s_cnt[i]
                r.acc_off = <int32_t>(self.accs.n + acc_o[i])
                r.acc_cnt = acc_c[i]
                r.out_stream = o_str[i]
                r.lazy_keys = priv[i] if lazy_ok else 0
                if has_shared:
                    r.lazy_keys = 1
                    r.key_blocks = <int32_t>tmin(shr[i] // hbs, <tok_t>0x7fffffff)
                if has_nodes:
                    r.node_off = s_off[i] + <int32_t>i
                    while r.node_n <= s_cnt[i] and run_node[r.node_off + r.node_n] >= 0:
                        r.node_n += 1
                self.slot_front[s] = fr[i]
            self.segs.n += n_seg
            self.accs.n += n_acc
            _point_at_arenas(self)
            self.loaded += n

    def end_input(self):
        """No more requests will be fed."""
        self.ended = True

    # -------------------------------------------------------------- the loop

    cdef int _schedule_batch(self, BatchC* b) except -1 nogil:
        """Schedule the next iteration into ``b`` at this clock and price it (Scheduler.schedule)."""
        b.step = self.step
        b.start_s = self.clock
        sched_schedule(&self.sched, b)
        self._price(b)
        return 0

    cdef int _price(self, BatchC* b) except -1 nogil:
        """When the forward pass of ``b``, scheduled at this clock, ends."""
        b.end_s = self.clock + tm_step_time(&self.time_model, b)
        if self.time_model.out_of_range:
            self._range_error(self.step)
        return 0

    cdef BatchC* _process_oldest(self) except NULL nogil:
        """Asynchronous: the oldest batch in flight leaves the queue and its output is processed
        (update_from_output); returns it."""
        cdef BatchC* ob = &self.batches[self.q_head]
        self.q_head = (self.q_head + 1) % 2
        self.q_len -= 1
        sched_update(&self.sched, ob)
        self.upd_batch = ob
        _release_next_turns(self)
        self.stalled = self.stalled + 1 if ob.total_tokens == 0 and self.sched.n_finished == 0 else 0
        return ob

    cdef int _end_async_step(self, BatchC* b, block_id_t free_sched) except -1 nogil:
        """An asynchronous iteration that scheduled ``b`` into a full queue: the oldest batch's output
        processed, the row written, the clock at the end of ``b``'s forward pass."""
        cdef BatchC* ob = self._process_oldest()
        if self.offload and b.total_tokens == 0 and ob.total_tokens == 0:
            _off_idle_until_landing(self, b)
        _log_line(self, self.step, LINE_STEP, self.clock, b, ob, free_sched)
        self.clock = b.end_s
        self.step += 1
        return 0

    cdef int _end_sync_step(self, BatchC* b) except -1 nogil:
        """A synchronous iteration after its schedule(): the output of ``b`` processed
        (update_from_output), its row written, the clock at the end of its forward pass."""
        cdef block_id_t free_sched = self.kv.pool.num_free
        sched_update(&self.sched, b)
        self.upd_batch = b
        self.poll_floor = -1
        if self.offload and b.total_tokens == 0:
            # A replica's next arrival is routed after this step: replica_wake cuts the poll there.
            self.poll_floor = _off_idle_until_landing(self, b)
        _release_next_turns(self)
        self.stalled = self.stalled + 1 if b.total_tokens == 0 and self.sched.n_finished == 0 else 0
        _log_line(self, self.step, LINE_STEP, self.clock, b, b, free_sched)
        self.clock = b.end_s
        self.step += 1
        return 0

    cdef int _range_error(self, step_t step) except -1 nogil:
        with gil:
            raise ValueError(f"engine step {step} falls outside the step-time profile's measured range "
                             f"(values {self.time_model.bad_x:g}, {self.time_model.bad_y:g} on its axes); "
                             "aisim never extrapolates a profile: measure a wider range")

    cdef int _retire(self, bint all_of_them) except -1 nogil:
        """Write out, in trace order, the requests that finished with every request before them.

        A slot a batch still in flight names (async scheduling) is kept until
        that batch's output is processed: its update looks the request up.
        With ``all_of_them`` (the replay ended) every request fed is written.
        """
        cdef int32_t i, j
        cdef req_t s
        cdef int64_t mask = self.win_cap - 1
        cdef BatchC* b
        for j in range(self.q_len):
            b = &self.batches[(self.q_head + j) % 2]
            for i in range(b.n):
                self.slot_pin[b.req[i]] = 1
        while self.retired < self.loaded:
            s = self.win[self.retired & mask]
            if not all_of_them and (self.reqs[s].status != ST_FINISHED or self.slot_pin[s] or self.reqs[s].held
                                    or self.reqs[s].off_hold):
                break
            _rcols_reserve(&self.rcols)
            if self.offload:
                _off_req_row(self, &self.reqs[s])
                if self.off.disk != NULL:
                    _disk_req_row(self, &self.reqs[s])
            _rcols_put(&self.rcols, &self.reqs[s])
            self.free_slots[self.n_free] = s
            self.n_free += 1
            self.retired += 1
        for j in range(self.q_len):
            b = &self.batches[(self.q_head + j) % 2]
            for i in range(b.n):
                self.slot_pin[b.req[i]] = 0
        return 0

    cdef int _run(self) except -1 nogil:
        """Run until the replay ends (ADV_DONE), needs the next input (ADV_INPUT) or has rows to hand
        over (ADV_OUTPUT).  Resumable: it stops only before an iteration or between two arrivals."""
        cdef sec_t t_next
        while True:
            # Safety net: an engine that schedules nothing and finishes nothing
            # for this many iterations in a row can never make progress.
            if self.stalled > STALL_LIMIT:
                with gil:
                    raise RuntimeError(_stall_reason(self.sched.off, self.step, self.sched.n_running,
                                                     self.sched.n_waiting))
            self._retire(False)
            if self.cols.n >= self.out_rows or self.rcols.n >= self.out_rows or self.gaps.n >= self.out_rows:
                return ADV_OUTPUT
            if _add_arrivals(self) == ADV_INPUT:
                return ADV_INPUT
            if not sched_has_requests(&self.sched) and self.q_len == 0:
                # Idle engine: jump to the next arrival, or stop.
                if self.open_n == 0 and self.rel.n == 0 and self.srv_n == 0:
                    self._retire(True)
                    self.finished = True
                    return ADV_DONE
                if self.timed:
                    # The next send (an open-loop one only while the client's cap has room: a full
                    # cap with an idle engine has its requests in the API server's queue), release,
                    # or request the API server hands over.
                    t_next = _next_input_s(self, False)
                    if t_next > self.clock:
                        self.clock = t_next
                else:
                    self.step = self.slot_step[self.open_q[self.open_head]]
                continue
            if self.macro.period == 0 or _stretch(self, INF_TIME) == 0:
                self._iterate()

    cdef int _add_request(self, req_t r) except -1 nogil:
        """The engine adds request ``r`` at this clock (Scheduler.add_request)."""
        self.reqs[r].picked_up_s = self.clock
        sched_add_request(&self.sched, r)
        if self.record_events:
            _event(&self.events, self.steps_taken + self.cols.n, EV_ARRIVED, <req_t>self.slot_global[r], 0)
        return 0

    cdef int _iterate(self) except -1 nogil:
        """One engine iteration of a busy engine (the body of ``_run``'s loop after the arrivals):
        synchronous schedule + update, or one turn of the asynchronous batch queue.  Sets
        ``upd_batch`` to the batch whose output it processed (NULL: none)."""
        cdef BatchC* b
        cdef BatchC* ob
        cdef bint scheduled
        cdef block_id_t free_sched
        self.upd_batch = NULL
        self.last_start = self.clock
        if not self.sched.conf.async_scheduling:
            b = &self.batches[0]
            self._schedule_batch(b)
            return self._end_sync_step(b)
        # Asynchronous engine, batch queue of two (step_with_batch_queue).
        scheduled = False
        free_sched = self.kv.pool.num_free
        b = NULL
        if sched_has_requests(&self.sched):
            b = &self.batches[(self.q_head + self.q_len) % 2]
            self._schedule_batch(b)
            free_sched = self.kv.pool.num_free
            self.q_len += 1
            scheduled = True
            if self.q_len < 2 and (b.total_tokens > 0 or sched_has_requests(&self.sched)):
                # Do not wait for the worker while the queue has room.
                self.sched.n_finished = 0
                _log_line(self, self.step, LINE_STEP, self.clock, b, NULL, free_sched)
                self.clock = b.end_s
                self.step += 1
                return 0
        if scheduled:
            return self._end_async_step(b, free_sched)
        ob = self._process_oldest()
        _log_line(self, self.step, LINE_DRAIN, self.clock, NULL, ob, free_sched)
        self.step += 1
        return 0

    def advance(self):
        """Replay until the next input is needed, rows wait to be taken, or the replay is done.

        Returns
        -------
        int
            ``ADVANCE["done"]``, ``ADVANCE["input"]`` (feed the next chunk, or
            call ``end_input``) or ``ADVANCE["output"]`` (take the rows).
        """
        cdef int code
        if self.finished:
            return ADV_DONE
        with nogil:
            code = self._run()
        return code

    def run(self):
        """Replay a whole trace; returns the result columns as numpy arrays.

        Returns
        -------
        dict
            ``steps``: one array per step column; ``requests``: one array per
            request column (trace order); ``events``: the decision-log events
            (empty unless recorded).
        """
        if not self.whole or self.finished:
            raise RuntimeError("Engine.run replays a whole trace, once")
        with nogil:
            self._run()
        return {"steps": self.take_steps(), "requests": self.take_requests(), "events": self._events(),
                "spec": self.spec_counts, "offload": self.offload_counts,
                "gaps": self.take_gaps()}

    # -------------------------------------------------------------- results

    def take_steps(self):
        """The step rows written since the last call (one array per step column), handed over;
        with KV offload, its columns (``OFF_STEP_COLUMNS``) too."""
        cdef Py_ssize_t n = self.cols.n
        _cols_flush(&self.cols)
        off = _off_columns(&self.off_cols, n) if self.offload else {}
        if self.offload and self.off.disk != NULL:
            off.update(_off_take(self.disk_steps, n, N_DISK_STEP, DISK_STEP_COLUMNS))
        out = _columns_handover(self.cols.col, STEP_ITEM, STEP_COLUMNS, n, &self.cols.cap)
        out.update(off)
        self.steps_taken += n
        self.cols.n = 0
        self.cols.staged = 0
        return out

    def take_requests(self):
        """The request rows retired since the last call, in trace order, handed over.

        Returns
        -------
        dict
            One array per request column; ``first`` is the trace index of the
            first row.
        """
        cdef Py_ssize_t n = self.rcols.n
        off = _off_take(self.off_reqs, n, N_OFF_REQ, OFF_REQ_COLUMNS) if self.offload else {}
        if self.offload and self.off.disk != NULL:
            off.update(_off_take(self.disk_reqs, n, N_DISK_REQ, DISK_REQ_COLUMNS))
        out = _columns_handover(self.rcols.col, REQ_ITEM, REQUEST_COLUMNS, n, &self.rcols.cap)
        out.update(off)
        self.rcols.n = 0
        return out

    def take_gaps(self):
        """The gaps between outputs recorded since the last call, handed over.

        Returns
        -------
        dict
            ``gap_s``: seconds between two consecutive outputs (streamed chunks) of one request;
            ``count``: how many outputs came that long after their request's previous one.  A gap
            may appear in more than one pair; the pairs are in the order they were recorded.
        """
        cdef void* cols[2]
        cols[0] = self.gaps.gap
        cols[1] = self.gaps.count
        out = _columns_handover(cols, GAP_ITEM, GAP_COLUMNS, self.gaps.n, &self.gaps.cap)
        self.gaps.gap = <double*>cols[0]
        self.gaps.count = <int64_t*>cols[1]
        self.gaps.n = 0
        return out

    @property
    def retired_requests(self):
        """Requests whose rows have been written (the trace index of the next one)."""
        return self.retired

    @property
    def spec_counts(self):
        """Speculative-decoding totals so far: the scheduler's counters (zero without drafts)."""
        cdef SchedC* s = &self.sched
        return {
            "verifications": s.verifications,
            "padded_requests": s.padded_requests,
            "padded_tokens": s.padded_tokens,
            "draft_feeds": s.draft_feeds,
            "num_drafts": s.stat_drafts,
            "num_draft_tokens": s.stat_draft_tokens,
            "num_accepted_tokens": s.stat_accepted,
        }

    @property
    def offload_counts(self):
        """KV offload totals so far (None without it): the connector's counters and the tier's state."""
        cdef OffloadC* o = &self.off
        if not self.offload:
            return None
        out = {
            "lookups": o.lookups, "lookups_with_hit": o.lookups_hit, "lookups_deferred": o.lookups_deferred,
            "loads": o.loads, "load_tokens": o.load_tokens, "load_chunks": o.load_chunks,
            "stores": o.stores, "store_chunks": o.store_chunks, "flushed_jobs": o.flushed,
            "cpu_evicted_chunks": o.evicted, "completed_jobs": o.completed, "finished_recving": o.recving,
            "max_remote_wait": o.max_wait, "cpu_chunks": o.conf.cpu_chunks, "chunk_bytes": o.conf.chunk_bytes,
            "connector_prefix_cache_stats": {
                "requests": o.conn_requests, "queries": o.conn_queries, "hits": o.conn_hits,
                "preempted_requests": o.conn_p_requests, "preempted_queries": o.conn_p_queries,
                "preempted_hits": o.conn_p_hits,
            },
        }
        if o.disk != NULL:
            out["disk"] = _disk_counts(o)
        return out

    @property
    def macro_counts(self):
        """Macro-steps so far: ``stretches`` replayed in one move and the engine ``steps`` they covered."""
        return {"stretches": self.macro.stretches, "steps": self.macro.steps}

    @property
    def slots(self):
        """Request slots allocated (they follow the requests in flight)."""
        return self.pool_cap

    def _events(self):
        cdef EventsC* e = &self.events
        cdef Py_ssize_t n = e.n
        if n == 0:
            return {"line": np.zeros(0, np.int64), "kind": np.zeros(0, np.int32),
                    "req": np.zeros(0, np.int32), "value": np.zeros(0, np.int64)}
        return {
            "line": np.array(<int64_t[:n]>e.line, copy=True),
            "kind": np.array(<int32_t[:n]>e.kind, copy=True),
            "req": np.array(<req_t[:n]>e.req, copy=True),
            "value": np.array(<tok_t[:n]>e.value, copy=True),
        }


# advance()'s answers, by name.
ADVANCE = {"done": ADV_DONE, "input": ADV_INPUT, "output": ADV_OUTPUT}
