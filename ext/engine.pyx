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

from cpython.mem cimport PyMem_RawCalloc, PyMem_RawFree, PyMem_RawRealloc
from libc.string cimport memset

import numpy as np

from aisim._core.blockpool cimport bp_usage
from aisim._core.kvcache cimport MAX_GROUPS, GroupSpecC, kv_init, kv_release, specs_from_dicts
from aisim._core.steptime cimport TM_LINEAR, TimeModelC, tm_step_time
from aisim._core.request cimport ReqC, ST_PENDING
from aisim._core.scheduler cimport (
    BatchC, SchedConfC, batch_init, batch_release, sched_add_request,
    sched_has_requests, sched_init, sched_release, sched_schedule, sched_update,
)
from aisim._core.types cimport (
    block_id_t, flag_t, hash_t, int32_t, int64_t, req_t, sec_t, step_t, tok_t,
)


# ------------------------------------------------------------------ growable columns

cdef int _grow_array(void** p, int64_t old, int64_t new, size_t item) except -1 nogil:
    cdef void* q = PyMem_RawRealloc(p[0], <size_t>new * item)
    if q == NULL:
        with gil:
            raise MemoryError("replay result columns")
    memset(<char*>q + old * item, 0, (new - old) * item)
    p[0] = q
    return 0


cdef int _cols_reserve(StepColsC* c) except -1 nogil:
    cdef int64_t new
    if c.n < c.cap:
        return 0
    new = c.cap * 2 if c.cap > 0 else 1024
    _grow_array(<void**>&c.step, c.cap, new, sizeof(step_t))
    _grow_array(<void**>&c.kind, c.cap, new, sizeof(int32_t))
    _grow_array(<void**>&c.updated_step, c.cap, new, sizeof(step_t))
    _grow_array(<void**>&c.clock, c.cap, new, sizeof(sec_t))
    _grow_array(<void**>&c.duration, c.cap, new, sizeof(sec_t))
    _grow_array(<void**>&c.num_reqs, c.cap, new, sizeof(int32_t))
    _grow_array(<void**>&c.prefill_tokens, c.cap, new, sizeof(tok_t))
    _grow_array(<void**>&c.decode_tokens, c.cap, new, sizeof(tok_t))
    _grow_array(<void**>&c.num_new, c.cap, new, sizeof(int32_t))
    _grow_array(<void**>&c.num_resumed, c.cap, new, sizeof(int32_t))
    _grow_array(<void**>&c.num_preempted, c.cap, new, sizeof(int32_t))
    _grow_array(<void**>&c.num_finished, c.cap, new, sizeof(int32_t))
    _grow_array(<void**>&c.running, c.cap, new, sizeof(int32_t))
    _grow_array(<void**>&c.waiting, c.cap, new, sizeof(int32_t))
    _grow_array(<void**>&c.free_sched, c.cap, new, sizeof(block_id_t))
    _grow_array(<void**>&c.free_blocks, c.cap, new, sizeof(block_id_t))
    _grow_array(<void**>&c.cached_blocks, c.cap, new, sizeof(block_id_t))
    _grow_array(<void**>&c.queries, c.cap, new, sizeof(int64_t))
    _grow_array(<void**>&c.hits, c.cap, new, sizeof(int64_t))
    _grow_array(<void**>&c.p_queries, c.cap, new, sizeof(int64_t))
    _grow_array(<void**>&c.p_hits, c.cap, new, sizeof(int64_t))
    c.cap = new
    return 0


cdef void _cols_release(StepColsC* c) noexcept nogil:
    PyMem_RawFree(c.step)
    PyMem_RawFree(c.kind)
    PyMem_RawFree(c.updated_step)
    PyMem_RawFree(c.clock)
    PyMem_RawFree(c.duration)
    PyMem_RawFree(c.num_reqs)
    PyMem_RawFree(c.prefill_tokens)
    PyMem_RawFree(c.decode_tokens)
    PyMem_RawFree(c.num_new)
    PyMem_RawFree(c.num_resumed)
    PyMem_RawFree(c.num_preempted)
    PyMem_RawFree(c.num_finished)
    PyMem_RawFree(c.running)
    PyMem_RawFree(c.waiting)
    PyMem_RawFree(c.free_sched)
    PyMem_RawFree(c.free_blocks)
    PyMem_RawFree(c.cached_blocks)
    PyMem_RawFree(c.queries)
    PyMem_RawFree(c.hits)
    PyMem_RawFree(c.p_queries)
    PyMem_RawFree(c.p_hits)
    memset(c, 0, sizeof(StepColsC))


cdef int _event(EventsC* e, int64_t line, int32_t kind, req_t r, tok_t value) except -1 nogil:
    cdef int64_t new
    if e.n == e.cap:
        new = e.cap * 2 if e.cap > 0 else 4096
        _grow_array(<void**>&e.line, e.cap, new, sizeof(int64_t))
        _grow_array(<void**>&e.kind, e.cap, new, sizeof(int32_t))
        _grow_array(<void**>&e.req, e.cap, new, sizeof(req_t))
        _grow_array(<void**>&e.value, e.cap, new, sizeof(tok_t))
        e.cap = new
    e.line[e.n] = line
    e.kind[e.n] = kind
    e.req[e.n] = r
    e.value[e.n] = value
    e.n += 1
    return 0


cdef void _events_release(EventsC* e) noexcept nogil:
    PyMem_RawFree(e.line)
    PyMem_RawFree(e.kind)
    PyMem_RawFree(e.req)
    PyMem_RawFree(e.value)
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
        self.rel_time = NULL
        self.rel_req = NULL
        self.ready = False

    def __init__(self, *, prompt_len, max_tokens, priority, arrival_key, id_rank, seg_off, seg_cnt, out_stream,
                 seg_stream, seg_first, seg_len, arrival_step=None, arrival_time=None,
                 int num_gpu_blocks, int block_size, long max_model_len,
                 bint enable_prefix_caching, int watermark_blocks,
                 groups=None, long hash_block_size=0, long sched_block_size=0,
                 bint fine_grained=False, long retention=0, int version=32,
                 long cache_block_size=0, bint mamba_split=False, bint mamba_partial=False,
                 bint mamba_has_ckpt=False, long mamba_ckpt_align=0,
                 long max_num_batched_tokens, long max_num_scheduled_tokens,
                 int max_num_seqs, int max_num_active_seqs,
                 long long_prefill_token_threshold, bint long_prefill_token_threshold_adaptive,
                 bint enable_chunked_prefill, bint priority_policy,
                 bint scheduler_reserve_full_isl, bint async_scheduling,
                 double base_s, double per_token_s, double per_req_s,
                 bint record_events=False, step_time=None, next_turn=None, think_s=None):
        cdef Py_ssize_t i, n = len(prompt_len)
        cdef SchedConfC conf
        cdef const tok_t[::1] p_len = _c_array(prompt_len, np.int64)
        cdef const tok_t[::1] m_tok = _c_array(max_tokens, np.int64)
        cdef const int32_t[::1] prio = _c_array(priority, np.int32)
        cdef const sec_t[::1] a_key = _c_array(arrival_key, np.float64)
        cdef const int32_t[::1] rank = _c_array(id_rank, np.int32)
        cdef const int32_t[::1] s_off = _c_array(seg_off, np.int32)
        cdef const int32_t[::1] s_cnt = _c_array(seg_cnt, np.int32)
        cdef const hash_t[::1] o_str = _c_array(out_stream, np.uint64)
        cdef const hash_t[::1] g_str = _c_array(seg_stream, np.uint64)
        cdef const tok_t[::1] g_first = _c_array(seg_first, np.int64)
        cdef const tok_t[::1] g_len = _c_array(seg_len, np.int64)
        cdef const step_t[::1] a_step
        cdef const sec_t[::1] a_time
        keep = [g_str, g_first, g_len]
        self.timed = arrival_time is not None
        if self.timed:
            a_time = _c_array(arrival_time, np.float64)
            keep.append(a_time)
            self.arrival_time = &a_time[0] if n > 0 else NULL
        else:
            a_step = _c_array(arrival_step, np.int64)
            keep.append(a_step)
            self.arrival_step = &a_step[0] if n > 0 else NULL
        self._keep = keep
        self.n_reqs = <req_t>n
        self.reqs = <ReqC*>PyMem_RawCalloc(n if n > 0 else 1, sizeof(ReqC))
        if self.reqs == NULL:
            raise MemoryError()
        cdef const int32_t[::1] nt = _c_array(next_turn if next_turn is not None else np.full(n, -1), np.int32)
        cdef const sec_t[::1] th = _c_array(think_s if think_s is not None else np.zeros(n), np.float64)
        self.open_idx = <req_t*>PyMem_RawCalloc(n if n > 0 else 1, sizeof(req_t))
        self.rel_time = <sec_t*>PyMem_RawCalloc(n if n > 0 else 1, sizeof(sec_t))
        self.rel_req = <req_t*>PyMem_RawCalloc(n if n > 0 else 1, sizeof(req_t))
        if self.open_idx == NULL or self.rel_time == NULL or self.rel_req == NULL:
            raise MemoryError()
        followers = set(int(x) for x in nt if x >= 0)
        self.n_open = 0
        for i in range(n):
            if i not in followers:
                self.open_idx[self.n_open] = <req_t>i
                self.n_open += 1
        self.n_rel = 0
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
        conf.max_num_batched_tokens = max_num_batched_tokens
        conf.max_num_scheduled_tokens = max_num_scheduled_tokens
        conf.max_num_running_reqs = max_num_seqs
        conf.max_num_active_reqs = max_num_active_seqs
        conf.long_prefill_token_threshold = long_prefill_token_threshold
        conf.adaptive_threshold = long_prefill_token_threshold_adaptive
        conf.chunked_prefill = enable_chunked_prefill
        conf.priority = priority_policy
        conf.reserve_full_isl = scheduler_reserve_full_isl
        conf.async_scheduling = async_scheduling
        conf.max_model_len = max_model_len
        conf.version = version
        conf.mamba_split = mamba_split
        conf.cache_block_size = cache_block_size if cache_block_size > 0 else block_size
        conf.mamba_partial = mamba_partial
        conf.mamba_has_ckpt = mamba_has_ckpt
        conf.mamba_ckpt_align = mamba_ckpt_align
        if groups is None:
            groups = [dict(kind=0, block_size=block_size, cacheable=True, spec_group=0)]
            hash_block_size = sched_block_size = block_size
        cdef GroupSpecC specs[MAX_GROUPS]
        specs_from_dicts(groups, specs)
        kv_init(&self.kv, num_gpu_blocks, <int32_t>len(groups), specs, hash_block_size,
                sched_block_size, fine_grained, enable_prefix_caching, retention, version,
                max_model_len, watermark_blocks, max_num_seqs + 8)
        self.kv.seg_stream = &g_str[0] if g_str.shape[0] > 0 else NULL
        self.kv.seg_first = &g_first[0] if g_first.shape[0] > 0 else NULL
        self.kv.seg_len = &g_len[0] if g_len.shape[0] > 0 else NULL
        sched_init(&self.sched, conf, &self.kv, self.reqs, <req_t>n)
        batch_init(&self.batches[0], self.sched.cap)
        batch_init(&self.batches[1], self.sched.cap)
        self.time_model.kind = TM_LINEAR
        self.time_model.base_s = base_s
        self.time_model.per_token_s = per_token_s
        self.time_model.per_req_s = per_req_s
        if step_time is not None:
            self._set_step_time(step_time)
        self.record_events = record_events
        self.ready = True

    def _set_step_time(self, dict m):
        """Load a roofline or table model (plain dict from aisim.perf)."""
        cdef const double[::1] af, kb, xs, ys, lat
        cdef const tok_t[::1] win
        cdef TimeModelC* tm = &self.time_model
        tm.kind = m["kind"]
        keep = []
        if m["kind"] == 1:
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
        elif m["kind"] == 2:
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
        PyMem_RawFree(self.reqs)
        PyMem_RawFree(self.open_idx)
        PyMem_RawFree(self.rel_time)
        PyMem_RawFree(self.rel_req)

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
        c.step[row] = step
        c.kind[row] = kind
        c.clock[row] = clock
        c.updated_step[row] = upd_b.step if upd_b != NULL else -1
        c.free_sched[row] = free_sched
        c.free_blocks[row] = self.kv.pool.num_free
        c.cached_blocks[row] = self.kv.pool.cached_free
        c.running[row] = self.sched.n_running
        c.waiting[row] = self.sched.n_waiting
        c.num_finished[row] = self.sched.n_finished if upd_b != NULL else 0
        if sched_b != NULL:
            for i in range(sched_b.n):
                if sched_b.decode[i]:
                    dec += sched_b.tokens[i]
                else:
                    pre += sched_b.tokens[i]
            c.duration[row] = sched_b.end_s - sched_b.start_s
            c.num_reqs[row] = sched_b.n
            c.prefill_tokens[row] = pre
            c.decode_tokens[row] = dec
            c.num_new[row] = sched_b.n_new
            c.num_resumed[row] = sched_b.n_resumed
            c.num_preempted[row] = sched_b.n_preempted
            c.queries[row] = sched_b.queries
            c.hits[row] = sched_b.hits
            c.p_queries[row] = sched_b.p_queries
            c.p_hits[row] = sched_b.p_hits
            if self.record_events:
                for i in range(sched_b.n):
                    _event(&self.events, row, EV_SCHED, sched_b.req[i], sched_b.tokens[i])
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

    cdef void _rel_push(self, sec_t t, req_t r) noexcept nogil:
        # Binary min-heap on (release time, request index).
        cdef req_t i = self.n_rel
        cdef req_t p
        self.n_rel += 1
        while i > 0:
            p = (i - 1) >> 1
            if self.rel_time[p] < t or (self.rel_time[p] == t and self.rel_req[p] < r):
                break
            self.rel_time[i] = self.rel_time[p]
            self.rel_req[i] = self.rel_req[p]
            i = p
        self.rel_time[i] = t
        self.rel_req[i] = r

    cdef void _rel_pop(self) noexcept nogil:
        cdef req_t i = 0, c
        cdef sec_t t
        cdef req_t r
        self.n_rel -= 1
        if self.n_rel == 0:
            return
        t = self.rel_time[self.n_rel]
        r = self.rel_req[self.n_rel]
        while True:
            c = 2 * i + 1
            if c >= self.n_rel:
                break
            if c + 1 < self.n_rel and (self.rel_time[c + 1] < self.rel_time[c] or (
                    self.rel_time[c + 1] == self.rel_time[c] and self.rel_req[c + 1] < self.rel_req[c])):
                c += 1
            if t < self.rel_time[c] or (t == self.rel_time[c] and r < self.rel_req[c]):
                break
            self.rel_time[i] = self.rel_time[c]
            self.rel_req[i] = self.rel_req[c]
            i = c
        self.rel_time[i] = t
        self.rel_req[i] = r

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
                self._rel_push(t, nx)

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
                    if self.n_rel > 0 and self.rel_time[0] <= clock and (
                            self.rel_time[0] < self.arrival_time[r_open]
                            or (self.rel_time[0] == self.arrival_time[r_open] and self.rel_req[0] < r_open)):
                        r_new = self.rel_req[0]
                        self._rel_pop()
                    else:
                        r_new = r_open
                        self._nxt += 1
                elif self.n_rel > 0 and self.rel_time[0] <= clock:
                    r_new = self.rel_req[0]
                    self._rel_pop()
                else:
                    break
                self.reqs[r_new].arrival_s = clock
                sched_add_request(&self.sched, r_new)
                if self.record_events:
                    _event(&self.events, arrived_row, EV_ARRIVED, r_new, 0)
            if not sched_has_requests(&self.sched) and q_len == 0:
                # Idle engine: jump to the next arrival, or stop.
                if self._nxt == self.n_open and self.n_rel == 0:
                    break
                if self.timed:
                    t_next = self.arrival_time[self.open_idx[self._nxt]] if self._nxt < self.n_open else self.rel_time[0]
                    if self.n_rel > 0 and self.rel_time[0] < t_next:
                        t_next = self.rel_time[0]
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
        if not self.ready:
            raise RuntimeError("Engine.run can be called once")
        self.ready = False
        with nogil:
            self._run()
        return {"steps": self._steps(), "requests": self._requests(), "events": self._events()}

    # -------------------------------------------------------------- results

    def _steps(self):
        cdef StepColsC* c = &self.cols
        cdef Py_ssize_t n = c.n

        def col(object view, dtype):
            return np.array(view, dtype=dtype, copy=True) if n else np.zeros(0, dtype)

        return {
            "step": col(<step_t[:n]>c.step if n else None, np.int64),
            "kind": col(<int32_t[:n]>c.kind if n else None, np.int32),
            "updated_step": col(<step_t[:n]>c.updated_step if n else None, np.int64),
            "clock_s": col(<sec_t[:n]>c.clock if n else None, np.float64),
            "duration_s": col(<sec_t[:n]>c.duration if n else None, np.float64),
            "num_reqs": col(<int32_t[:n]>c.num_reqs if n else None, np.int32),
            "prefill_tokens": col(<tok_t[:n]>c.prefill_tokens if n else None, np.int64),
            "decode_tokens": col(<tok_t[:n]>c.decode_tokens if n else None, np.int64),
            "num_new": col(<int32_t[:n]>c.num_new if n else None, np.int32),
            "num_resumed": col(<int32_t[:n]>c.num_resumed if n else None, np.int32),
            "num_preempted": col(<int32_t[:n]>c.num_preempted if n else None, np.int32),
            "num_finished": col(<int32_t[:n]>c.num_finished if n else None, np.int32),
            "running": col(<int32_t[:n]>c.running if n else None, np.int32),
            "waiting": col(<int32_t[:n]>c.waiting if n else None, np.int32),
            "free_blocks_sched": col(<block_id_t[:n]>c.free_sched if n else None, np.int32),
            "free_blocks": col(<block_id_t[:n]>c.free_blocks if n else None, np.int32),
            "cached_blocks": col(<block_id_t[:n]>c.cached_blocks if n else None, np.int32),
            "prefix_queries": col(<int64_t[:n]>c.queries if n else None, np.int64),
            "prefix_hits": col(<int64_t[:n]>c.hits if n else None, np.int64),
            "preempted_prefix_queries": col(<int64_t[:n]>c.p_queries if n else None, np.int64),
            "preempted_prefix_hits": col(<int64_t[:n]>c.p_hits if n else None, np.int64),
        }

    def _requests(self):
        cdef Py_ssize_t i, n = self.n_reqs
        out = {
            "status": np.zeros(n, np.int8),
            "output_tokens": np.zeros(n, np.int64),
            "cached_tokens": np.zeros(n, np.int64),
            "cached_tokens_all": np.zeros(n, np.int64),
            "preemptions": np.zeros(n, np.int32),
            "arrival_s": np.zeros(n, np.float64),
            "first_scheduled_s": np.zeros(n, np.float64),
            "first_token_s": np.zeros(n, np.float64),
            "finish_s": np.zeros(n, np.float64),
        }
        cdef flag_t[::1] st = out["status"]
        cdef tok_t[::1] ot = out["output_tokens"]
        cdef tok_t[::1] ct = out["cached_tokens"]
        cdef tok_t[::1] ca = out["cached_tokens_all"]
        cdef int32_t[::1] pr = out["preemptions"]
        cdef sec_t[::1] ar = out["arrival_s"]
        cdef sec_t[::1] fs = out["first_scheduled_s"]
        cdef sec_t[::1] ft = out["first_token_s"]
        cdef sec_t[::1] fi = out["finish_s"]
        for i in range(n):
            st[i] = self.reqs[i].status
            ot[i] = self.reqs[i].num_output
            ct[i] = self.reqs[i].cached_first
            ca[i] = self.reqs[i].cached_total
            pr[i] = self.reqs[i].num_preemptions
            ar[i] = self.reqs[i].arrival_s
            fs[i] = self.reqs[i].first_sched_s
            ft[i] = self.reqs[i].first_token_s
            fi[i] = self.reqs[i].finish_s
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
