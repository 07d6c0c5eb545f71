# The engine's result rows, included into engine.pyx (one module, so the calls stay inlinable):
# the step and request columns (names and dtypes, growth, typed writes), the decision-log
# events, the arenas of variable-length request data, and the handover of columns to numpy.

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
    ("picked_up_s", "float64"),
    ("first_scheduled_s", "float64"),
    ("first_token_s", "float64"),
    ("finish_s", "float64"),
    ("spec_drafts", "int64"),
    ("spec_accepted", "int64"),
)

# The gap record's columns (Engine.take_gaps; types.pxd GapsC), and their bytes per item.
GAP_COLUMNS = (
    ("gap_s", "float64"),
    ("count", "int64"),
)
cdef size_t GAP_ITEM[2]
GAP_ITEM[0] = sizeof(double)
GAP_ITEM[1] = sizeof(int64_t)

if len(STEP_COLUMNS) != N_STEP_COLS or len(REQUEST_COLUMNS) != N_REQ_COLS:
    raise ImportError("aisim._core.engine: column tables and enums disagree")

# Bytes per item of each step column, from its dtype (set once at import).
cdef size_t STEP_ITEM[N_STEP_COLS]
for _k, (_name, _dtype) in enumerate(STEP_COLUMNS):
    STEP_ITEM[_k] = np.dtype(_dtype).itemsize


cdef int _grow_columns(void** col, int n_cols, const size_t* item, int64_t cap, int64_t new) except -1 nogil:
    # Columns of ``cap`` rows grown to ``new`` (> cap).  The new rows are not zeroed: every row is
    # written whole before it is read (_log_line, _rcols_put), and zeroing the rows of a long
    # replay, doubling after doubling, cost as much as writing them.
    cdef int k
    for k in range(n_cols):
        mem_resize(&col[k], new, item[k])
    return 0


cdef inline int _cols_reserve(StepColsC* c) except -1 nogil:
    # Room for one more row: every column quadruples together (a long replay's rows are copied
    # at few growths; rows not yet written are never touched, so the room costs no page).
    if c.n < c.cap:
        return 0
    return _cols_grow(c, c.cap * 4 if c.cap > 0 else 1024)


cdef int _cols_grow(StepColsC* c, int64_t new) except -1 nogil:
    # Room for ``new`` rows in every column (zero-filled); never shrinks.
    if new > c.cap:
        _grow_columns(c.col, N_STEP_COLS, STEP_ITEM, c.cap, new)
        c.cap = new
    return 0


cdef void _cols_release(StepColsC* c) noexcept nogil:
    cdef int k
    for k in range(N_STEP_COLS):
        mem_free(c.col[k])
    memset(c, 0, sizeof(StepColsC))


# Typed writes into one row, staged (StepColsC.stage) unless the columns have it already; each
# column's type is its STEP_COLUMNS dtype.
cdef inline void _put_i64(StepColsC* c, int k, int64_t row, int64_t v) noexcept nogil:
    if row >= c.staged:
        c.stage[(row - c.staged) * N_STEP_COLS + k] = v
    else:
        (<int64_t*>c.col[k])[row] = v


cdef inline void _put_i32(StepColsC* c, int k, int64_t row, int32_t v) noexcept nogil:
    if row >= c.staged:
        c.stage[(row - c.staged) * N_STEP_COLS + k] = v
    else:
        (<int32_t*>c.col[k])[row] = v


cdef inline void _put_f64(StepColsC* c, int k, int64_t row, double v) noexcept nogil:
    if row >= c.staged:
        memcpy(&c.stage[(row - c.staged) * N_STEP_COLS + k], &v, sizeof(double))
    else:
        (<double*>c.col[k])[row] = v


cdef void _cols_flush(StepColsC* c) noexcept nogil:
    # The staged rows written to their columns.
    _rows_into_columns(c.stage, c.n - c.staged, N_STEP_COLS, c.col, STEP_ITEM, c.staged)
    c.staged = c.n


cdef void _rows_into_columns(const int64_t* rows, int64_t m, int width, void** col, const size_t* item,
                             int64_t at) noexcept nogil:
    """Rows ``rows`` (``m`` of ``width`` values side by side; a float64 by its bits) written to rows
    ``at`` .. ``at + m - 1`` of the columns ``col``, a column at a time: column k has items of
    ``item[k]`` bytes, 8 (copied whole) or 4 (an int32: the value's low half)."""
    cdef int64_t i
    cdef int k
    cdef const int64_t* src
    cdef int64_t* d64
    cdef int32_t* d32
    for k in range(width):
        src = rows + k
        if item[k] == 8:
            d64 = <int64_t*>col[k] + at
            for i in range(m):
                d64[i] = src[i * width]
        else:
            d32 = <int32_t*>col[k] + at
            for i in range(m):
                d32[i] = <int32_t>src[i * width]


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
        return r.sent_s
    if k == RC_PICKED_UP:
        return r.picked_up_s
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


cdef int _arena_init(ArenaC* a, int64_t cap, int32_t n_cols, size_t i0, size_t i1, size_t i2) except -1 nogil:
    cdef int32_t k
    memset(a, 0, sizeof(ArenaC))
    a.n_cols = n_cols
    a.item[0], a.item[1], a.item[2] = i0, i1, i2
    a.cap = cap
    for k in range(n_cols):
        a.col[k] = mem_calloc(cap if cap > 0 else 1, a.item[k])
    return 0


cdef void _arena_release(ArenaC* a) noexcept nogil:
    cdef int32_t k
    for k in range(a.n_cols):
        mem_free(a.col[k])
    memset(a, 0, sizeof(ArenaC))


# Bytes per item, and C type (0 int8, 1 int32, 2 int64, 3 seconds), of each request column
# (REQUEST_COLUMNS; set once at import).
cdef size_t REQ_ITEM[N_REQ_COLS]
cdef int REQ_KIND[N_REQ_COLS]
for _k, (_name, _dtype) in enumerate(REQUEST_COLUMNS):
    REQ_ITEM[_k] = np.dtype(_dtype).itemsize
    REQ_KIND[_k] = {"int8": 0, "int32": 1, "int64": 2, "float64": 3}[_dtype]


cdef inline int _rcols_reserve(ReqColsC* c) except -1 nogil:
    # Room for one more row: every column doubles together.
    if c.n < c.cap:
        return 0
    return _rcols_grow(c, c.cap * 2 if c.cap > 0 else 1024)


cdef int _rcols_grow(ReqColsC* c, int64_t new) except -1 nogil:
    # Room for ``new`` rows in every column (zero-filled); never shrinks.
    if new > c.cap:
        _grow_columns(c.col, N_REQ_COLS, REQ_ITEM, c.cap, new)
        c.cap = new
    return 0


cdef void _rcols_release(ReqColsC* c) noexcept nogil:
    cdef int k
    for k in range(N_REQ_COLS):
        mem_free(c.col[k])
    memset(c, 0, sizeof(ReqColsC))


cdef void _rcols_put(ReqColsC* c, const ReqC* r) noexcept nogil:
    # One row from a retiring request (the caller reserved the room).
    cdef int64_t row = c.n
    cdef int k
    for k in range(N_REQ_COLS):
        if REQ_KIND[k] == 0:
            (<flag_t*>c.col[k])[row] = <flag_t>_req_int(r, k)
        elif REQ_KIND[k] == 1:
            (<int32_t*>c.col[k])[row] = <int32_t>_req_int(r, k)
        elif REQ_KIND[k] == 2:
            (<int64_t*>c.col[k])[row] = _req_int(r, k)
        else:
            (<sec_t*>c.col[k])[row] = _req_sec(r, k)
    c.n += 1


@cython.final
cdef class _HandedOver:
    """A C column buffer handed over to numpy: freed when the last array viewing it goes."""
    cdef void* p
    cdef Py_ssize_t nbytes

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, self.p, self.nbytes, 0, flags)

    def __dealloc__(self):
        mem_free(self.p)


cdef object _columns_handover(void** cols, const size_t* item, columns, Py_ssize_t n, int64_t* cap):
    # The columns' first n rows as numpy arrays that take over the C buffers (no copy, no fresh
    # zeroed memory): each buffer is trimmed to its n rows and given to the array; the engine's
    # columns start empty again (cap 0, grown on the next row).
    cdef _HandedOver owner
    cdef int k
    out = {}
    for k, (name, dtype) in enumerate(columns):
        if n == 0:
            out[name] = np.zeros(0, dtype)
            continue
        mem_grow(&cols[k], cap[0], n, item[k])  # a shrink: nothing is zeroed or moved but the tail
        owner = _HandedOver.__new__(_HandedOver)
        owner.p = cols[k]
        owner.nbytes = n * item[k]
        cols[k] = NULL
        out[name] = np.frombuffer(owner, dtype, n)
    if n:
        cap[0] = 0
    return out


cdef void _zero_batch(StepColsC* c, int64_t row) noexcept nogil:
    # The batch columns of a line that scheduled nothing.
    _put_f64(c, SC_DURATION, row, 0)
    _put_i32(c, SC_NUM_REQS, row, 0)
    _put_i64(c, SC_PREFILL, row, 0)
    _put_i64(c, SC_DECODE, row, 0)
    _put_i32(c, SC_NUM_NEW, row, 0)
    _put_i32(c, SC_NUM_RESUMED, row, 0)
    _put_i32(c, SC_NUM_PREEMPTED, row, 0)
    _put_i64(c, SC_QUERIES, row, 0)
    _put_i64(c, SC_HITS, row, 0)
    _put_i64(c, SC_P_QUERIES, row, 0)
    _put_i64(c, SC_P_HITS, row, 0)
    _put_i64(c, SC_SPEC_TOKENS, row, 0)
    _put_i64(c, SC_SPEC_ACCEPTED, row, 0)


cdef int _log_line(Engine e, step_t step, int32_t kind, sec_t clock, const BatchC* sched_b,
                   const BatchC* upd_b, block_id_t free_sched) except -1 nogil:
    """Append one step row to ``e``'s columns: ``sched_b`` scheduled in it, ``upd_b`` was processed."""
    cdef StepColsC* c = &e.cols
    cdef int64_t row
    cdef int32_t i
    cdef int64_t at
    cdef const int64_t* g = e.slot_global
    _cols_reserve(c)
    if c.n - c.staged == STEP_STAGE:
        _cols_flush(c)
    row = c.n
    at = e.steps_taken + row
    _put_i64(c, SC_STEP, row, step)
    _put_i32(c, SC_KIND, row, kind)
    _put_f64(c, SC_CLOCK, row, clock)
    _put_i64(c, SC_UPDATED_STEP, row, upd_b.step if upd_b != NULL else -1)
    _put_i32(c, SC_FREE_SCHED, row, free_sched)
    _put_i32(c, SC_FREE_BLOCKS, row, e.kv.pool.num_free)
    _put_i32(c, SC_CACHED_BLOCKS, row, e.kv.pool.cached_free)
    _put_i32(c, SC_RUNNING, row, e.sched.n_running)
    _put_i32(c, SC_WAITING, row, e.sched.n_waiting + (e.off.n_parked if e.offload else 0))
    _put_i32(c, SC_NUM_FINISHED, row, e.sched.n_finished if upd_b != NULL else 0)
    # A drain line scheduled nothing: its batch columns are zero (_zero_batch).
    if sched_b == NULL:
        _zero_batch(c, row)
    else:
        _put_f64(c, SC_DURATION, row, sched_b.end_s - sched_b.start_s)
        _put_i32(c, SC_NUM_REQS, row, sched_b.n)
        _put_i64(c, SC_PREFILL, row, sched_b.total_tokens - sched_b.decode_tokens)
        _put_i64(c, SC_DECODE, row, sched_b.decode_tokens)
        _put_i32(c, SC_NUM_NEW, row, sched_b.n_new)
        _put_i32(c, SC_NUM_RESUMED, row, sched_b.n_resumed)
        _put_i32(c, SC_NUM_PREEMPTED, row, sched_b.n_preempted)
        _put_i64(c, SC_QUERIES, row, sched_b.queries)
        _put_i64(c, SC_HITS, row, sched_b.hits)
        _put_i64(c, SC_P_QUERIES, row, sched_b.p_queries)
        _put_i64(c, SC_P_HITS, row, sched_b.p_hits)
        _put_i64(c, SC_SPEC_TOKENS, row, sched_b.spec_tokens)
        _put_i64(c, SC_SPEC_ACCEPTED, row, sched_b.spec_accepted)
        if e.record_events:
            for i in range(sched_b.n):
                _event(&e.events, at, EV_SCHED, <req_t>g[sched_b.req[i]], sched_b.tokens[i])
            for i in range(sched_b.n):
                if sched_b.spec_m[i] == 0:
                    continue
                _event(&e.events, at, EV_SPEC, <req_t>g[sched_b.req[i]], sched_b.spec_m[i])
                _event(&e.events, at, EV_SPEC_ACCEPTED, <req_t>g[sched_b.req[i]], sched_b.spec_a[i])
                if sched_b.padded[i]:
                    _event(&e.events, at, EV_SPEC_PADDED, <req_t>g[sched_b.req[i]], sched_b.spec_m[i])
            for i in range(sched_b.n_new):
                _event(&e.events, at, EV_NEW, <req_t>g[sched_b.new_req[i]], sched_b.new_computed[i])
            for i in range(sched_b.n_resumed):
                _event(&e.events, at, EV_RESUMED, <req_t>g[sched_b.res_req[i]], sched_b.res_computed[i])
            for i in range(sched_b.n_preempted):
                _event(&e.events, at, EV_PREEMPTED, <req_t>g[sched_b.preempted[i]], 0)
    if upd_b != NULL and e.record_events:
        for i in range(e.sched.n_finished):
            _event(&e.events, at, EV_FINISHED, <req_t>g[e.sched.finished[i]], 0)
    if e.offload:
        _off_row(e, row)
        if e.off.disk != NULL:
            _disk_row(e, row)
    c.n += 1
    return 0
