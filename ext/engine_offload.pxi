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

if len(OFF_STEP_COLUMNS) != N_OFF_STEP or len(OFF_REQ_COLUMNS) != N_OFF_REQ:
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
    # it is read (_off_row, _off_req_row, _disk_row, _disk_req_row), so a row never written costs
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
    connector kept since this step's schedule()."""
    cdef OffloadC* o = &e.off
    cdef int64_t* v
    cdef int64_t line = e.steps_taken + row
    cdef int64_t new
    cdef int32_t i, k
    cdef const OffRecC* rec
    cdef req_t g
    # The counts of the row (v[0] .. v[14]), kept in registers and stored once: a memset of the
    # staged row before the counting cost more than the rest of a quiet step's row.
    cdef int64_t lookups = 0, hits = 0, deferred = 0, loads = 0, load_tok = 0, load_chunks = 0
    cdef int64_t stores = 0, store_chunks = 0, flushed = 0, done = 0, recving = 0, waits = 0
    if row >= e.off_cols.cap:
        # As many rows as the step columns hold (a whole trace's are sized once): grown with them,
        # not zeroed (each row is written whole below; a row never written costs no page).
        new = e.cols.cap if e.cols.cap > row else row + 1
        for k in range(N_OFF_STEP):
            mem_resize(&e.off_cols.col[k], new, OFF_ITEM[k])
        e.off_cols.cap = new
    v = &e.off_cols.stage[(row - e.off_cols.staged) * N_OFF_STEP]
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
    v[0] = lookups
    v[1] = hits
    v[2] = deferred
    v[3] = loads
    v[4] = load_tok
    v[5] = load_chunks
    v[6] = load_chunks * o.conf.chunk_bytes
    v[7] = stores
    v[8] = store_chunks
    v[9] = store_chunks * o.conf.chunk_bytes
    v[10] = flushed
    v[11] = o.step_evicted
    v[12] = done
    v[13] = recving
    v[14] = waits
    v[15] = o.n_used
    v[16] = o.n_evictable
    if row + 1 - e.off_cols.staged == OFF_STAGE_ROWS:
        _off_unstage(&e.off_cols, row + 1)
    # A step that schedules nothing still reports its transfers: the records start again.
    o.n_recs = 0
    o.step_evicted = 0
    return 0


cdef void _off_unstage(OffColsC* c, int64_t n) noexcept nogil:
    """The staged rows (``c.staged`` .. ``n`` - 1) written to their columns.  A step row's values
    are staged row by row and written a column at a time: written straight into the columns,
    each row's seventeen stores went to seventeen cache lines the connector's work had evicted
    since the row before."""
    cdef int64_t i, m = n - c.staged
    cdef int32_t k
    cdef const int64_t* src
    cdef int64_t* d64
    cdef int32_t* d32
    for k in range(N_OFF_STEP):
        src = &c.stage[k]
        if OFF_ITEM[k] == 8:
            d64 = <int64_t*>c.col[k] + c.staged
            for i in range(m):
                d64[i] = src[i * N_OFF_STEP]
        else:
            d32 = <int32_t*>c.col[k] + c.staged
            for i in range(m):
                d32[i] = <int32_t>src[i * N_OFF_STEP]
    c.staged = n


cdef void _off_cols_release(OffColsC* c) noexcept nogil:
    cdef int k
    for k in range(N_OFF_STEP):
        mem_free(c.col[k])
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
    # from 0), filled in one pass over the rows: a strided copy per column reads them all each time.
    cdef void* col[32]
    cdef bint wide[32]
    cdef Py_ssize_t i
    cdef int32_t k
    cdef const int64_t* src
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
        wide[k] = dtype == "int64"
    with nogil:
        for i in range(n):
            src = rows + i * width
            for k in range(width):
                if wide[k]:
                    (<int64_t*>col[k])[i] = src[k]
                else:
                    (<int32_t*>col[k])[i] = <int32_t>src[k]
    return out
