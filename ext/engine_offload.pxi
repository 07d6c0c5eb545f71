# Included into engine.pyx: the KV offload columns of the step and request rows and the decision-log
# events of a step's `offload` object (ext/offload.pxi keeps the records of each step).

# The offload step columns, in the order of a row (N_OFF_STEP); aisim.columns.OFFLOAD_STEPS names them.
OFF_STEP_COLUMNS = (
    ("offload_lookups", "int32"), ("offload_lookup_hits", "int32"), ("offload_lookups_deferred", "int32"),
    ("offload_loads", "int32"), ("offload_load_tokens", "int64"), ("offload_load_chunks", "int64"),
    ("offload_load_bytes", "int64"), ("offload_stores", "int32"), ("offload_store_chunks", "int64"),
    ("offload_store_bytes", "int64"), ("offload_flushed", "int32"), ("offload_cpu_evicted", "int64"),
    ("offload_completed", "int32"), ("offload_recving", "int32"), ("offload_remote_wait", "int32"),
    ("offload_cpu_used", "int64"), ("offload_cpu_evictable", "int64"),
)
# The offload request columns (N_OFF_REQ); aisim.columns.OFFLOAD_REQUESTS names them.
OFF_REQ_COLUMNS = (
    ("offload_hit_tokens", "int64"), ("offload_loaded_tokens", "int64"), ("offload_loads", "int32"),
    ("offload_store_chunks", "int64"),
)

if len(OFF_STEP_COLUMNS) != N_OFF_STEP or len(OFF_REQ_COLUMNS) != N_OFF_REQ \
        or [c for c, _ in OFF_STEP_COLUMNS[N_OFF_COUNTS:]] != ["offload_cpu_used", "offload_cpu_evictable"]:
    raise ImportError("aisim._core.engine: offload column tables and enums disagree")

# Bytes per item of each offload step column, from its dtype (set once at import).
cdef size_t OFF_ITEM[N_OFF_STEP]
for _k, (_name, _dtype) in enumerate(OFF_STEP_COLUMNS):
    if _dtype not in ("int32", "int64"):
        raise ImportError(f"aisim._core.engine: offload column {_name} of dtype {_dtype}")
    OFF_ITEM[_k] = np.dtype(_dtype).itemsize


cdef sec_t _off_idle_until_landing(Engine e, BatchC* b) noexcept nogil:
    """Transfers on the clock: an engine with nothing to compute polls until the next submitted copy
    lands (or the next request can reach it: _next_input_s, the API server's hand-over included);
    aisim folds the polling into step ``b``, which then ends there.  Asynchronous, a step is folded
    when neither it nor the step whose output it waited for computed anything (the copies of that
    output's step are submitted by then).  Returns the end of ``b``'s forward pass when the step was
    folded (where a replica's later arrival may cut it), else -1."""
    cdef sec_t land = off_next_landing(&e.off)
    cdef sec_t t, end = b.end_s
    if e.timed:
        t = _next_input_s(e, True)
        if t < land:
            land = t
    if land <= end:
        return -1
    b.end_s = land
    return end


cdef int _off_room(int64_t** rows, int64_t* cap, int64_t need, int32_t width) except -1 nogil:
    # Rows grown geometrically to hold ``need`` rows, not zeroed: every row is written whole before
    # it is read (_off_req_row, _disk_row, _disk_req_row), so a row never written costs
    # no page.
    cdef int64_t new = cap[0] if cap[0] > 0 else 1024
    if need <= cap[0]:
        return 0
    while new < need:
        new *= 2
    mem_resize(<void**>rows, <size_t>new * width, sizeof(int64_t))
    cap[0] = new
    return 0


cdef int _off_row(Engine e, int64_t row) except -1 nogil:
    """The offload columns of step row ``row`` and, when recorded, its events, from the records the
    connector kept since this step's schedule(): kept only when it counts some work or changes a
    level of the tier (OffColsC)."""
    cdef OffloadC* o = &e.off
    cdef OffColsC* c = &e.off_cols
    cdef int64_t* v
    cdef int64_t line = e.steps_taken + row
    cdef int64_t new
    cdef int32_t i
    cdef const OffRecC* rec
    cdef req_t g
    # The counts of the row, kept in registers and stored once, only for a row that is kept.
    cdef int64_t lookups = 0, hits = 0, deferred = 0, loads = 0, load_tok = 0, load_chunks = 0
    cdef int64_t stores = 0, store_chunks = 0, flushed = 0, done = 0, recving = 0, waits = 0
    cdef int64_t evicted = o.step_evicted
    for i in range(o.n_recs):
        rec = &o.recs[i]
        g = <req_t>e.slot_global[rec.req]
        if rec.kind == OR_LOOKUP:
            lookups += 1
            if rec.b > 0:
                hits += 1
            elif rec.b < 0:
                deferred += 1
            if e.record_events:
                _event(&e.events, line, EV_OFF_LOOKUP, g, rec.a)
                _event(&e.events, line, EV_OFF_LOOKUP_EXT, g, rec.b)
        elif rec.kind == OR_LOAD:
            loads += 1
            load_tok += rec.a
            load_chunks += rec.b
            if e.record_events:
                _event(&e.events, line, EV_OFF_LOAD, g, rec.id)
                _event(&e.events, line, EV_OFF_LOAD_TOKENS, g, rec.a)
                _event(&e.events, line, EV_OFF_LOAD_CHUNKS, g, rec.b)
        elif rec.kind == OR_STORE:
            stores += 1
            store_chunks += rec.b
            if e.record_events:
                _event(&e.events, line, EV_OFF_STORE, g, rec.id)
                _event(&e.events, line, EV_OFF_STORE_CHUNKS, g, rec.b)
        elif rec.kind == OR_FLUSH:
            flushed += 1
            if e.record_events:
                _event(&e.events, line, EV_OFF_FLUSH, g, rec.id)
        elif rec.kind == OR_DONE:
            done += 1
            if e.record_events:
                _event(&e.events, line, EV_OFF_DONE, g, rec.id)
        elif rec.kind == OR_RECV:
            recving += 1
            if e.record_events:
                _event(&e.events, line, EV_OFF_RECV, g, 0)
    for i in range(o.n_parked):
        if e.reqs[o.parked[i]].off_park == 1 or e.reqs[o.parked[i]].off_park == 2:
            waits += 1
            if e.record_events:
                _event(&e.events, line, EV_OFF_WAIT, <req_t>e.slot_global[o.parked[i]], 0)
    # A step that schedules nothing still reports its transfers: the records start again.
    o.n_recs = 0
    o.step_evicted = 0
    # Most steps move nothing: with every count 0 (the byte counts are chunk counts times the chunk
    # size) and the tier's levels those of the last row kept, the row is not kept.
    if (lookups | hits | deferred | loads | load_tok | load_chunks | stores | store_chunks | flushed
            | evicted | done | recving | waits) == 0 and o.n_used == c.used and o.n_evictable == c.evictable:
        return 0
    if c.n == c.cap:
        new = 2 * c.cap if c.cap > 0 else 1024
        mem_resize(<void**>&c.rows, <size_t>new * (1 + N_OFF_STEP), sizeof(int64_t))
        c.cap = new
    v = c.rows + c.n * (1 + N_OFF_STEP)
    v[0] = row
    v[1] = lookups
    v[2] = hits
    v[3] = deferred
    v[4] = loads
    v[5] = load_tok
    v[6] = load_chunks
    v[7] = load_chunks * o.conf.chunk_bytes
    v[8] = stores
    v[9] = store_chunks
    v[10] = store_chunks * o.conf.chunk_bytes
    v[11] = flushed
    v[12] = evicted
    v[13] = done
    v[14] = recving
    v[15] = waits
    v[16] = o.n_used
    v[17] = o.n_evictable
    c.n += 1
    c.used = o.n_used
    c.evictable = o.n_evictable
    return 0


cdef object _off_columns(OffColsC* c, Py_ssize_t n):
    """The offload columns of the first ``n`` step rows (fresh arrays; the rows kept start again):
    each column written once, front to back, from the rows kept -- a count column 0 between
    them, a level column holding the value of the row kept before."""
    cdef void* col[N_OFF_STEP]
    cdef const int64_t* v
    cdef int64_t j, at, row, x, carry
    cdef int32_t k
    cdef int64_t width = 1 + N_OFF_STEP
    out = {}
    for k, (name, dtype) in enumerate(OFF_STEP_COLUMNS):
        arr = np.empty(n, dtype=dtype)
        out[name] = arr
        col[k] = <void*><size_t>arr.ctypes.data
    with nogil:
        for k in range(N_OFF_STEP):
            # the level before the first row kept: the one the rows taken before ended at
            carry = 0 if k < N_OFF_COUNTS else (c.from_used if k == N_OFF_COUNTS else c.from_evictable)
            at = 0
            for j in range(c.n + 1):
                if j < c.n:
                    v = c.rows + j * width
                    row = v[0]
                    x = v[1 + k]
                else:
                    row = n
                    x = 0
                _col_fill(col[k], OFF_ITEM[k], at, row, carry)
                if j < c.n:
                    _col_fill(col[k], OFF_ITEM[k], row, row + 1, x)
                at = row + 1
                if k >= N_OFF_COUNTS:
                    carry = x
        c.n = 0
        c.from_used = c.used
        c.from_evictable = c.evictable
    return out


cdef inline void _col_fill(void* col, size_t item, int64_t a, int64_t b, int64_t v) noexcept nogil:
    # Items a .. b - 1 of a column of ``item``-byte items (8, or 4: an int32, v's low half) set to v.
    cdef int64_t i
    if b - a > 1 and v == 0:
        memset(<char*>col + a * item, 0, <size_t>(b - a) * item)
    elif item == 8:
        for i in range(a, b):
            (<int64_t*>col)[i] = v
    else:
        for i in range(a, b):
            (<int32_t*>col)[i] = <int32_t>v


cdef void _off_cols_release(OffColsC* c) noexcept nogil:
    mem_free(c.rows)
    memset(c, 0, sizeof(OffColsC))


cdef int _off_req_row(Engine e, const ReqC* r) except -1 nogil:
    """The offload columns of the request row about to be written (``e.rcols.n``)."""
    cdef int64_t* v
    _off_room(&e.off_reqs, &e.off_reqs_cap, e.rcols.n + 1, N_OFF_REQ)
    v = e.off_reqs + e.rcols.n * N_OFF_REQ
    v[0] = r.off_hit_first
    v[1] = r.off_loaded
    v[2] = r.off_n_loads
    v[3] = r.off_store_chunks
    return 0


cdef object _off_take(const int64_t* rows, Py_ssize_t n, int32_t width, columns):
    # The first n rows as one numpy array per column (fresh arrays; the rows are written again
    # from 0).
    cdef void* col[32]
    cdef size_t item[32]
    cdef int32_t k
    out = {}
    if n == 0 or rows == NULL:
        for name, dtype in columns:
            out[name] = np.zeros(0, dtype)
        return out
    if width > 32:
        raise ValueError("aisim._core.engine: too many offload columns")
    for k, (name, dtype) in enumerate(columns):
        if dtype not in ("int32", "int64"):
            raise ValueError(f"aisim._core.engine: offload column {name} of dtype {dtype}")
        arr = np.empty(n, dtype=dtype)
        out[name] = arr
        col[k] = <void*><size_t>arr.ctypes.data
        item[k] = 8 if dtype == "int64" else 4
    with nogil:
        _rows_into_columns(rows, n, width, col, item, 0)
    return out
