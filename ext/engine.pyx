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

from libc.string cimport memcpy, memset

import numpy as np

from aisim._core.heap cimport heap_init, heap_pop, heap_push, heap_release
from aisim._core.kvcache cimport MAX_GROUPS, GroupSpecC, kv_init, kv_release, specs_from_dicts
from aisim._core.memory cimport mem_calloc, mem_free, mem_grow
from aisim._core.steptime cimport TM_LINEAR, TM_ROOFLINE, TM_TABLE, TimeModelC, tm_step_time
from aisim._core.request cimport ReqC, ST_PENDING
from aisim._core.scheduler cimport (
    BatchC, SchedConfC, batch_init, batch_release, sched_add_request,
    sched_has_requests, sched_init, sched_release, sched_schedule, sched_update,
)
from aisim._core.types cimport (
    block_id_t, flag_t, hash_t, int32_t, int64_t, req_t, sec_t, step_t, tok_t,
)


# ------------------------------------------------------------------ result columns

# The step columns: (name, numpy dtype) in StepCol order (engine.pxd).  The
# Python catalogue of output columns is checked against this table.
STEP_COLUMNS = (
    ("step", "int64"),
    ("kind", "int32"),
    ("updated_step", "int64"),
    ("clock_s", "float64"),
    ("duration_s", "float64"),
    ("num_reqs", "int32"),
    ("prefill_tokens", "int64"),
    ("decode_tokens", "int64"),
    ("num_new", "int32"),
    ("num_resumed", "int32"),
    ("num_preempted", "int32"),
    ("num_finished", "int32"),
    ("running", "int32"),
    ("waiting", "int32"),
    ("free_blocks_sched", "int32"),
    ("free_blocks", "int32"),
    ("cached_blocks", "int32"),
    ("prefix_queries", "int64"),
    ("prefix_hits", "int64"),
    ("preempted_prefix_queries", "int64"),
    ("preempted_prefix_hits", "int64"),
    ("spec_tokens", "int64"),
    ("spec_accepted", "int64"),
)

# The request columns: (name, numpy dtype) in ReqCol order (engine.pxd).
REQUEST_COLUMNS = (
    ("status", "int8"),
    ("output_tokens", "int64"),
    ("cached_tokens", "int64"),
    ("cached_tokens_all_admissions", "int64"),
    ("preemptions", "int32"),
    ("arrival_s", "float64"),
    ("first_scheduled_s", "float64"),
    ("first_token_s", "float64"),
    ("finish_s", "float64"),
    ("spec_drafts", "int64"),
    ("spec_accepted", "int64"),
)

if len(STEP_COLUMNS) != N_STEP_COLS or len(REQUEST_COLUMNS) != N_REQ_COLS:
    raise ImportError("aisim._core.engine: column tables and enums disagree")

# Bytes per item of each step column, from its dtype (set once at import).
cdef size_t STEP_ITEM[N_STEP_COLS]
for _k, (_name, _dtype) in enumerate(STEP_COLUMNS):
    STEP_ITEM[_k] = np.dtype(_dtype).itemsize


cdef int _cols_reserve(StepColsC* c) except -1 nogil:
    # Room for one more row: every column doubles together.
    cdef int64_t new
    cdef int k
    if c.n < c.cap:
        return 0
    new = c.cap * 2 if c.cap > 0 else 1024
    for k in range(N_STEP_COLS):
        mem_grow(&c.col[k], c.cap, new, STEP_ITEM[k])
    c.cap = new
    return 0


cdef void _cols_release(StepColsC* c) noexcept nogil:
    cdef int k
    for k in range(N_STEP_COLS):
        mem_free(c.col[k])
    memset(c, 0, sizeof(StepColsC))


# Typed writes into one row; each column's type is its STEP_COLUMNS dtype.
cdef inline void _put_i64(StepColsC* c, int k, int64_t row, int64_t v) noexcept nogil:
    (<int64_t*>c.col[k])[row] = v


cdef inline void _put_i32(StepColsC* c, int k, int64_t row, int32_t v) noexcept nogil:
    (<int32_t*>c.col[k])[row] = v


cdef inline void _put_f64(StepColsC* c, int k, int64_t row, double v) noexcept nogil:
    (<double*>c.col[k])[row] = v


cdef inline int64_t _req_int(const ReqC* r, int k) noexcept nogil:
    # Integer request columns (ReqCol).
    if k == RC_STATUS:
        return r.status
    if k == RC_OUTPUT:
        return r.num_output
    if k == RC_CACHED:
        return r.cached_first
    if k == RC_CACHED_ALL:
        return r.cached_total
    if k == RC_SPEC_DRAFTS:
        return r.spec_drafts
    if k == RC_SPEC_ACCEPTED:
        return r.spec_accepted
    return r.num_preemptions


cdef inline sec_t _req_sec(const ReqC* r, int k) noexcept nogil:
    # Time request columns (ReqCol).
    if k == RC_ARRIVAL:
        return r.arrival_s
    if k == RC_FIRST_SCHED:
        return r.first_sched_s
    if k == RC_FIRST_TOKEN:
        return r.first_token_s
    return r.finish_s


cdef int _event(EventsC* e, int64_t line, int32_t kind, req_t r, tok_t value) except -1 nogil:
    cdef int64_t new
    if e.n == e.cap:
        new = e.cap * 2 if e.cap > 0 else 4096
        mem_grow(<void**>&e.line, e.cap, new, sizeof(int64_t))
        mem_grow(<void**>&e.kind, e.cap, new, sizeof(int32_t))
        mem_grow(<void**>&e.req, e.cap, new, sizeof(req_t))
        mem_grow(<void**>&e.value, e.cap, new, sizeof(tok_t))
        e.cap = new
    e.line[e.n] = line
    e.kind[e.n] = kind
    e.req[e.n] = r
    e.value[e.n] = value
    e.n += 1
    return 0


cdef void _events_release(EventsC* e) noexcept nogil:
    mem_free(e.line)
    mem_free(e.kind)
    mem_free(e.req)
    mem_free(e.value)
    memset(e, 0, sizeof(EventsC))


# Iterations in a row without a scheduled token or a finish before a replay is
# declared stuck (vLLM itself would spin forever).
cdef int64_t STALL_LIMIT = 100000


def _c_array(a, dtype):
    return np.ascontiguousarray(a, dtype=dtype)


cdef class Engine:
    """One replay: requests, KV cache and scheduler, built from plain arrays.

    Made by ``aisim.replay``, which validates every argument; this class
    trusts them.  ``run`` can be called once.
    """

    def __cinit__(self):
        self.reqs = NULL
        self.open_idx = NULL
        self.ready = False

    def __init__(self, config not None, trace not None, bint record_events=False):
        """Read the resolved configuration and the request arrays once.

        Parameters
        ----------
        config : aisim.core_input.CoreConfig
        trace : aisim.core_input.CoreTrace
        record_events : bool
            Keep the decision-log events.
        """
        cdef Py_ssize_t i, n = len(trace.prompt_len)
        cdef SchedConfC conf
        cdef GroupSpecC specs[MAX_GROUPS]
        cdef tok_t block_size = config.block_size
        cdef tok_t max_model_len = config.max_model_len
        cdef int32_t max_num_seqs = config.max_num_seqs
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
        cdef const step_t[::1] a_step
        cdef const sec_t[::1] a_time
        cdef const int32_t[::1] nt = _c_array(
            trace.next_turn if trace.next_turn is not None else np.full(n, -1), np.int32)
        cdef const sec_t[::1] th = _c_array(
            trace.think_s if trace.think_s is not None else np.zeros(n), np.float64)
        keep = [g_str, g_first, g_len]
        memset(&conf, 0, sizeof(SchedConfC))
        self.timed = trace.arrival_time is not None
        if self.timed:
            a_time = _c_array(trace.arrival_time, np.float64)
            keep.append(a_time)
            self.arrival_time = &a_time[0] if n > 0 else NULL
        else:
            a_step = _c_array(trace.arrival_step, np.int64)
            keep.append(a_step)
            self.arrival_step = &a_step[0] if n > 0 else NULL
        self._keep = keep
        self.n_reqs = <req_t>n
        self.reqs = <ReqC*>mem_calloc(n, sizeof(ReqC))
        self.open_idx = <req_t*>mem_calloc(n, sizeof(req_t))
        heap_init(&self.rel, <int32_t>n)
        # A request that is some session's next turn is sent by that turn's finish.
        followers = set(int(x) for x in nt if x >= 0)
        self.n_open = 0
        for i in range(n):
            if i not in followers:
                self.open_idx[self.n_open] = <req_t>i
                self.n_open += 1
        for i in range(n):
            self.reqs[i].next_turn = nt[i]
            self.reqs[i].think_s = th[i]
            self.reqs[i].prompt_len = p_len[i]
            self.reqs[i].max_tokens = m_tok[i]
            self.reqs[i].priority = prio[i]
            self.reqs[i].arrival_key = a_key[i]
            self.reqs[i].id_rank = rank[i]
            self.reqs[i].seg_off = s_off[i]
            self.reqs[i].seg_cnt = s_cnt[i]
            self.reqs[i].out_stream = o_str[i]
            self.reqs[i].status = ST_PENDING
            self.reqs[i].slot = -1
            self.reqs[i].arrival_s = -1
            self.reqs[i].first_sched_s = -1
            self.reqs[i].first_token_s = -1
            self.reqs[i].finish_s = -1
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
        conf.version = config.version
        conf.mamba_split = config.mamba_split
        conf.cache_block_size = config.cache_block_size if config.cache_block_size > 0 else block_size
        conf.mamba_partial = config.mamba_partial
        conf.mamba_has_ckpt = config.mamba_has_ckpt
        conf.mamba_ckpt_align = config.mamba_ckpt_align
        groups = config.groups
        specs_from_dicts(groups, specs)
        kv_init(&self.kv, config.num_gpu_blocks, <int32_t>len(groups), specs, config.hash_block_size,
                config.sched_block_size, config.fine_grained, config.enable_prefix_caching,
                config.retention, config.version, max_model_len, config.watermark_blocks,
                max_num_seqs + 8)
        spec = config.speculative
        if spec is not None:
            self._set_speculative(spec, trace, &conf)
        self.kv.eagle = conf.eagle_drop and config.enable_prefix_caching
        self.kv.hash_lookahead = conf.hash_lookahead
        self.kv.seg_stream = &g_str[0] if g_str.shape[0] > 0 else NULL
        self.kv.seg_first = &g_first[0] if g_first.shape[0] > 0 else NULL
        self.kv.seg_len = &g_len[0] if g_len.shape[0] > 0 else NULL
        sched_init(&self.sched, conf, &self.kv, self.reqs, <req_t>n)
        batch_init(&self.batches[0], self.sched.cap)
        batch_init(&self.batches[1], self.sched.cap)
        self.time_model.kind = TM_LINEAR
        self.time_model.base_s = config.base_s
        self.time_model.per_token_s = config.per_token_s
        self.time_model.per_req_s = config.per_req_s
        if config.step_time is not None:
            self._set_step_time(config.step_time)
        self.record_events = record_events
        self.ready = True

    cdef int _set_speculative(self, dict spec, object trace, SchedConfC* conf) except -1:
        """Speculative-decoding settings (aisim.core_input) and the trace's ``accept`` lists."""
        cdef const int64_t[::1] table = np.ascontiguousarray(spec["acc_table"], dtype=np.int64)
        cdef const int64_t[::1] values
        cdef const int32_t[::1] off
        cdef const int32_t[::1] cnt
        cdef Py_ssize_t i
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
        keep = [table]
        if trace.accept_values is not None and len(trace.accept_values) > 0:
            values = np.ascontiguousarray(trace.accept_values, dtype=np.int64)
            off = np.ascontiguousarray(trace.accept_off, dtype=np.int32)
            cnt = np.ascontiguousarray(trace.accept_cnt, dtype=np.int32)
            keep.append(values)
            conf.acc_list = &values[0]
            for i in range(self.n_reqs):
                self.reqs[i].acc_off = off[i]
                self.reqs[i].acc_cnt = cnt[i]
        self._spec_keep = keep
        return 0

    def _set_step_time(self, dict m):
        """Load a roofline or table model (plain dict from aisim.perf)."""
        cdef const double[::1] af, kb, xs, ys, lat
        cdef const tok_t[::1] win
        cdef TimeModelC* tm = &self.time_model
        tm.kind = m["kind"]
        keep = []
        if m["kind"] == TM_ROOFLINE:
            af = np.ascontiguousarray(m["attn_flops"], dtype=np.float64)
            kb = np.ascontiguousarray(m["kv_bytes"], dtype=np.float64)
            win = np.ascontiguousarray(m["window"], dtype=np.int64)
            keep += [af, kb, win]
            tm.n_terms = <int32_t>af.shape[0]
            tm.attn_flops = <double*>&af[0] if af.shape[0] else NULL
            tm.kv_bytes = <double*>&kb[0] if kb.shape[0] else NULL
            tm.window = <tok_t*>&win[0] if win.shape[0] else NULL
            tm.flops_per_token = m["flops_per_token"]
            tm.state_bytes = m["state_bytes"]
            tm.weight_bytes = m["weight_bytes"]
            tm.flops_rate = m["flops_rate"]
            tm.bytes_rate = m["bytes_rate"]
            tm.overhead_s = m["overhead_s"]
            tm.req_s = m["req_s"]
            tm.flops_per_req = m["flops_per_req"]
            tm.attn_rate = m["attn_rate"]
            tm.moe_experts = m["moe_experts"]
            tm.moe_log_miss = m["moe_log_miss"]
            tm.moe_expert_bytes = m["moe_expert_bytes"]
            tm.comm_s = m["comm_s"]
            tm.comm_per_token_s = m["comm_per_token_s"]
        elif m["kind"] == TM_TABLE:
            xs = np.ascontiguousarray(m["xs"], dtype=np.float64)
            ys = np.ascontiguousarray(m["ys"], dtype=np.float64)
            lat = np.ascontiguousarray(m["latency"], dtype=np.float64)
            keep += [xs, ys, lat]
            tm.n_axes = len(m["axes"])
            tm.axis[0] = m["axes"][0]
            tm.axis[1] = m["axes"][1] if tm.n_axes == 2 else 0
            tm.n_x = <int32_t>xs.shape[0]
            tm.n_y = <int32_t>ys.shape[0]
            tm.xs = <double*>&xs[0]
            tm.ys = <double*>&ys[0]
            tm.latency = <double*>&lat[0]
        self._tm_keep = keep

    def __dealloc__(self):
        batch_release(&self.batches[0])
        batch_release(&self.batches[1])
        sched_release(&self.sched)
        kv_release(&self.kv)
        _cols_release(&self.cols)
        _events_release(&self.events)
        heap_release(&self.rel)
        mem_free(self.reqs)
        mem_free(self.open_idx)

    # -------------------------------------------------------------- the loop

    cdef int _log_line(self, step_t step, int32_t kind, sec_t clock, const BatchC* sched_b,
                       const BatchC* upd_b, block_id_t free_sched) except -1 nogil:
        """Append one row: ``sched_b`` scheduled in it, ``upd_b`` was processed."""
        cdef StepColsC* c = &self.cols
        cdef int64_t row
        cdef int32_t i
        cdef tok_t pre = 0, dec = 0
        _cols_reserve(c)
        row = c.n
        _put_i64(c, SC_STEP, row, step)
        _put_i32(c, SC_KIND, row, kind)
        _put_f64(c, SC_CLOCK, row, clock)
        _put_i64(c, SC_UPDATED_STEP, row, upd_b.step if upd_b != NULL else -1)
        _put_i32(c, SC_FREE_SCHED, row, free_sched)
        _put_i32(c, SC_FREE_BLOCKS, row, self.kv.pool.num_free)
        _put_i32(c, SC_CACHED_BLOCKS, row, self.kv.pool.cached_free)
        _put_i32(c, SC_RUNNING, row, self.sched.n_running)
        _put_i32(c, SC_WAITING, row, self.sched.n_waiting)
        _put_i32(c, SC_NUM_FINISHED, row, self.sched.n_finished if upd_b != NULL else 0)
        # A drain line scheduled nothing: its batch columns stay zero (zero-filled growth).
        if sched_b != NULL:
            for i in range(sched_b.n):
                if sched_b.decode[i]:
                    dec += sched_b.tokens[i]
                else:
                    pre += sched_b.tokens[i]
            _put_f64(c, SC_DURATION, row, sched_b.end_s - sched_b.start_s)
            _put_i32(c, SC_NUM_REQS, row, sched_b.n)
            _put_i64(c, SC_PREFILL, row, pre)
            _put_i64(c, SC_DECODE, row, dec)
            _put_i32(c, SC_NUM_NEW, row, sched_b.n_new)
            _put_i32(c, SC_NUM_RESUMED, row, sched_b.n_resumed)
            _put_i32(c, SC_NUM_PREEMPTED, row, sched_b.n_preempted)
            _put_i64(c, SC_QUERIES, row, sched_b.queries)
            _put_i64(c, SC_HITS, row, sched_b.hits)
            _put_i64(c, SC_P_QUERIES, row, sched_b.p_queries)
            _put_i64(c, SC_P_HITS, row, sched_b.p_hits)
            _put_i64(c, SC_SPEC_TOKENS, row, sched_b.spec_tokens)
            _put_i64(c, SC_SPEC_ACCEPTED, row, sched_b.spec_accepted)
            if self.record_events:
                for i in range(sched_b.n):
                    _event(&self.events, row, EV_SCHED, sched_b.req[i], sched_b.tokens[i])
                for i in range(sched_b.n):
                    if sched_b.spec_m[i] == 0:
                        continue
                    _event(&self.events, row, EV_SPEC, sched_b.req[i], sched_b.spec_m[i])
                    _event(&self.events, row, EV_SPEC_ACCEPTED, sched_b.req[i], sched_b.spec_a[i])
                    if sched_b.padded[i]:
                        _event(&self.events, row, EV_SPEC_PADDED, sched_b.req[i], sched_b.spec_m[i])
                for i in range(sched_b.n_new):
                    _event(&self.events, row, EV_NEW, sched_b.new_req[i], sched_b.new_computed[i])
                for i in range(sched_b.n_resumed):
                    _event(&self.events, row, EV_RESUMED, sched_b.res_req[i], sched_b.res_computed[i])
                for i in range(sched_b.n_preempted):
                    _event(&self.events, row, EV_PREEMPTED, sched_b.preempted[i], 0)
        if upd_b != NULL and self.record_events:
            for i in range(self.sched.n_finished):
                _event(&self.events, row, EV_FINISHED, self.sched.finished[i], 0)
        c.n += 1
        return 0

    cdef bint _open_due(self, sec_t clock, step_t step) noexcept nogil:
        # The next open-loop request has arrived by this clock / engine step.
        cdef req_t r
        if self._nxt >= self.n_open:
            return False
        r = self.open_idx[self._nxt]
        if self.timed:
            return self.arrival_time[r] <= clock
        return self.arrival_step[r] <= step

    cdef void _release_next_turns(self) noexcept nogil:
        """Closed loop: a finished turn sends its session's next turn after its think time."""
        cdef int32_t i
        cdef req_t f, nx
        cdef sec_t t
        for i in range(self.sched.n_finished):
            f = self.sched.finished[i]
            nx = self.reqs[f].next_turn
            if nx >= 0:
                t = self.reqs[f].finish_s + self.reqs[nx].think_s
                self.reqs[nx].arrival_key = t
                heap_push(&self.rel, 0, t, nx, nx)

    cdef int _range_error(self, step_t step) except -1 nogil:
        with gil:
            raise ValueError(f"engine step {step} falls outside the step-time profile's measured range "
                             f"(values {self.time_model.bad_x:g}, {self.time_model.bad_y:g} on its axes); "
                             "aisim never extrapolates a profile: measure a wider range")

    cdef int _run(self) except -1 nogil:
        cdef req_t r_open, r_new
        cdef sec_t t_next
        cdef step_t step = 0
        cdef sec_t clock = 0.0
        cdef BatchC* b
        cdef BatchC* ob
        cdef int32_t q_len = 0, q_head = 0
        cdef bint scheduled
        cdef block_id_t free_sched
        cdef int64_t arrived_row
        cdef int64_t stalled = 0
        while True:
            # Safety net: an engine that schedules nothing and finishes nothing
            # for this many iterations in a row can never make progress.
            if stalled > STALL_LIMIT:
                with gil:
                    raise RuntimeError(
                        f"replay stalled at engine step {step}: {self.sched.n_running} running and "
                        f"{self.sched.n_waiting} waiting requests cannot be scheduled")
            # Add the requests that have arrived by now: open-loop requests in
            # trace order, merged with closed-loop turns released by a finish,
            # ordered by (time, request index).
            arrived_row = self.cols.n
            while True:
                if self._open_due(clock, step):
                    r_open = self.open_idx[self._nxt]
                    if self.rel.n > 0 and self.rel.a[0].key <= clock and (
                            self.rel.a[0].key < self.arrival_time[r_open]
                            or (self.rel.a[0].key == self.arrival_time[r_open] and self.rel.a[0].item < r_open)):
                        r_new = heap_pop(&self.rel)
                    else:
                        r_new = r_open
                        self._nxt += 1
                elif self.rel.n > 0 and self.rel.a[0].key <= clock:
                    r_new = heap_pop(&self.rel)
                else:
                    break
                self.reqs[r_new].arrival_s = clock
                sched_add_request(&self.sched, r_new)
                if self.record_events:
                    _event(&self.events, arrived_row, EV_ARRIVED, r_new, 0)
            if not sched_has_requests(&self.sched) and q_len == 0:
                # Idle engine: jump to the next arrival, or stop.
                if self._nxt == self.n_open and self.rel.n == 0:
                    break
                if self.timed:
                    t_next = self.arrival_time[self.open_idx[self._nxt]] if self._nxt < self.n_open else self.rel.a[0].key
                    if self.rel.n > 0 and self.rel.a[0].key < t_next:
                        t_next = self.rel.a[0].key
                    if t_next > clock:
                        clock = t_next
                else:
                    step = self.arrival_step[self.open_idx[self._nxt]]
                continue
            if not self.sched.conf.async_scheduling:
                b = &self.batches[0]
                b.step = step
                b.start_s = clock
                sched_schedule(&self.sched, b)
                b.end_s = clock + tm_step_time(&self.time_model, b)
                if self.time_model.out_of_range:
                    self._range_error(step)
                free_sched = self.kv.pool.num_free
                sched_update(&self.sched, b)
                self._release_next_turns()
                stalled = stalled + 1 if b.total_tokens == 0 and self.sched.n_finished == 0 else 0
                self._log_line(step, LINE_STEP, clock, b, b, free_sched)
                clock = b.end_s
                step += 1
                continue
            # Asynchronous engine, batch queue of two (step_with_batch_queue).
            scheduled = False
            free_sched = self.kv.pool.num_free
            b = NULL
            if sched_has_requests(&self.sched):
                b = &self.batches[(q_head + q_len) % 2]
                b.step = step
                b.start_s = clock
                sched_schedule(&self.sched, b)
                b.end_s = clock + tm_step_time(&self.time_model, b)
                if self.time_model.out_of_range:
                    self._range_error(step)
                free_sched = self.kv.pool.num_free
                q_len += 1
                scheduled = True
                if q_len < 2 and (b.total_tokens > 0 or sched_has_requests(&self.sched)):
                    # Do not wait for the worker while the queue has room.
                    self.sched.n_finished = 0
                    self._log_line(step, LINE_STEP, clock, b, NULL, free_sched)
                    clock = b.end_s
                    step += 1
                    continue
            ob = &self.batches[q_head]
            q_head = (q_head + 1) % 2
            q_len -= 1
            sched_update(&self.sched, ob)
            self._release_next_turns()
            stalled = stalled + 1 if ob.total_tokens == 0 and self.sched.n_finished == 0 else 0
            if scheduled:
                self._log_line(step, LINE_STEP, clock, b, ob, free_sched)
                clock = b.end_s
            else:
                self._log_line(step, LINE_DRAIN, clock, NULL, ob, free_sched)
            step += 1
        return 0

    def run(self):
        """Replay every request; returns the result columns as numpy arrays.

        Returns
        -------
        dict
            ``steps``: one array per step column; ``requests``: one array per
            request column (trace order); ``events``: the decision-log events
            (empty unless recorded); ``num_blocks``: pool size.
        """
        cdef SchedC* s
        if not self.ready:
            raise RuntimeError("Engine.run can be called once")
        self.ready = False
        with nogil:
            self._run()
        s = &self.sched
        spec = {
            "verifications": s.verifications,
            "padded_requests": s.padded_requests,
            "padded_tokens": s.padded_tokens,
            "draft_feeds": s.draft_feeds,
            "num_drafts": s.stat_drafts,
            "num_draft_tokens": s.stat_draft_tokens,
            "num_accepted_tokens": s.stat_accepted,
        }
        return {"steps": self._steps(), "requests": self._requests(), "events": self._events(), "spec": spec}

    # -------------------------------------------------------------- results

    def _steps(self):
        # One copy per column, out of the C buffers (which the engine keeps).
        cdef StepColsC* c = &self.cols
        cdef Py_ssize_t n = c.n
        cdef unsigned char[::1] dst
        cdef int k
        out = {}
        for k, (name, dtype) in enumerate(STEP_COLUMNS):
            a = np.zeros(n, dtype)
            if n:
                dst = a.view(np.uint8)
                memcpy(&dst[0], c.col[k], n * STEP_ITEM[k])
            out[name] = a
        return out

    def _requests(self):
        # Column by column out of the request structs (REQUEST_COLUMNS order).
        cdef Py_ssize_t i, n = self.n_reqs
        cdef int k
        cdef flag_t[::1] v8
        cdef int32_t[::1] v32
        cdef int64_t[::1] v64
        cdef sec_t[::1] vs
        out = {}
        for k, (name, dtype) in enumerate(REQUEST_COLUMNS):
            a = np.zeros(n, dtype)
            if dtype == "int8":
                v8 = a
                for i in range(n):
                    v8[i] = <flag_t>_req_int(&self.reqs[i], k)
            elif dtype == "int32":
                v32 = a
                for i in range(n):
                    v32[i] = <int32_t>_req_int(&self.reqs[i], k)
            elif dtype == "int64":
                v64 = a
                for i in range(n):
                    v64[i] = _req_int(&self.reqs[i], k)
            else:
                vs = a
                for i in range(n):
                    vs[i] = _req_sec(&self.reqs[i], k)
            out[name] = a
        return out

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
