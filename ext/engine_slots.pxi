# Included into engine.pyx: where a request lives from feed to retirement, and the growth of it.
# A free slot is taken for each request fed (_occupy); the slots, the window mapping trace
# indices to slots, the open-loop arrival queue and the arenas of variable-length request data
# grow geometrically, between iterations only (Engine.feed, replica_add), so nothing is
# allocated per request.  Free functions over the Engine's C fields (a class body cannot
# include a file); engine.pyx is their one user.


cdef req_t _occupy(Engine e, int64_t g, sec_t a_time, step_t a_step, int64_t next_turn, sec_t next_think,
                   bint opens) except -1 nogil:
    """A free slot for trace index ``g``, its request zeroed and pending, mapped in the window
    and, unless a finish sends it (``opens`` false), queued to arrive; the caller fills in the
    trace's fields.  The caller made room (slots, window) beforehand."""
    cdef req_t s
    cdef ReqC* r
    e.n_free -= 1
    s = e.free_slots[e.n_free]
    r = &e.reqs[s]
    memset(r, 0, sizeof(ReqC))
    r.trace_index = g
    r.status = ST_PENDING
    r.slot = -1
    r.sent_s = -1
    r.picked_up_s = -1
    r.first_sched_s = -1
    r.first_token_s = -1
    r.finish_s = -1
    e.slot_global[s] = g
    e.slot_time[s] = a_time
    e.slot_step[s] = a_step
    e.slot_next[s] = next_turn
    e.slot_next_think[s] = next_think
    e.slot_front[s] = 0
    e.win[g & (e.win_cap - 1)] = s
    if opens:
        if e.open_n == e.open_cap:
            _grow_open(e)
        e.open_q[(e.open_head + e.open_n) & (e.open_cap - 1)] = s
        e.open_n += 1
    return s


cdef int _grow_pool(Engine e, req_t need) except -1 nogil:
    """Room for ``need`` slots; the scheduler's per-request arrays grow with them.

    Slots keep their numbers (the arrays are reallocated, not renumbered),
    so every request index the scheduler, the batches and the heaps hold
    stays valid.  The FCFS waiting ring is laid out afresh from its head.
    """
    cdef req_t old = e.pool_cap
    cdef req_t new = old * 2 if old * 2 > need else need
    cdef req_t i
    cdef req_t* ring
    cdef SchedC* sc = &e.sched
    cdef int32_t cap
    mem_grow(<void**>&e.reqs, old, new, sizeof(ReqC))
    mem_grow(<void**>&e.free_slots, old, new, sizeof(req_t))
    # The new slots go under the free ones, lowest number on top of them.
    for i in range(e.n_free - 1, -1, -1):
        e.free_slots[i + (new - old)] = e.free_slots[i]
    for i in range(new - old):
        e.free_slots[i] = new - 1 - i
    e.n_free += new - old
    mem_grow(<void**>&e.slot_global, old, new, sizeof(int64_t))
    mem_grow(<void**>&e.slot_time, old, new, sizeof(sec_t))
    mem_grow(<void**>&e.slot_step, old, new, sizeof(step_t))
    mem_grow(<void**>&e.slot_next, old, new, sizeof(int64_t))
    mem_grow(<void**>&e.slot_next_think, old, new, sizeof(sec_t))
    mem_grow(<void**>&e.slot_front, old, new, sizeof(sec_t))
    mem_grow(<void**>&e.slot_pin, old, new, sizeof(flag_t))
    # vllm/v1/core/sched/scheduler.py keeps requests in dicts and lists that grow as they come;
    # the scheduler here sizes its arrays by the request count, so they grow with the slots.
    sc.reqs = e.reqs
    mem_grow(<void**>&sc.running, old, new, sizeof(req_t))
    mem_grow(<void**>&sc.skipped, old, new, sizeof(req_t))
    mem_grow(<void**>&sc.finished, old, new, sizeof(req_t))
    ring = <req_t*>mem_calloc(new + 1, sizeof(req_t))
    for i in range(sc.n_waiting):
        ring[i] = sc.waiting[(sc.w_head + i) % (old + 1)]
    mem_free(sc.waiting)
    sc.waiting = ring
    sc.w_head = 0
    if sc.conf.priority:
        mem_grow(<void**>&sc.wheap.a, sc.wheap.cap, new, sizeof(sc.wheap.a[0]))
        sc.wheap.cap = new
    sc.n_reqs = new
    # The batches (and a stretch's rows) hold every running request: as many as the slots, up to
    # max_num_seqs.
    cap = sched_cap(&sc.conf, new)
    if cap > sc.cap:
        batch_grow(&e.batches[0], sc.cap, cap)
        batch_grow(&e.batches[1], sc.cap, cap)
        _macro_grow(&e.macro, cap)
        sc.cap = cap
    if e.rel.cap < new:
        mem_grow(<void**>&e.rel.a, e.rel.cap, new, sizeof(e.rel.a[0]))
        e.rel.cap = new
    e.pool_cap = new
    return 0


cdef int _grow_window(Engine e, int64_t need) except -1 nogil:
    """Room to map ``need`` trace indices (from the oldest not retired) to their slots."""
    cdef int64_t new, g
    cdef req_t* w
    if need <= e.win_cap:
        return 0
    new = _pow2_at_least(need)
    w = <req_t*>mem_calloc(new, sizeof(req_t))
    for g in range(e.retired, e.loaded):
        w[g & (new - 1)] = e.win[g & (e.win_cap - 1)]
    mem_free(e.win)
    e.win = w
    e.win_cap = new
    return 0


cdef int _srv_push(Engine e, req_t s) except -1 nogil:
    """Request ``s``, sent, joins the API server's queue (its engine time in ``slot_time``)."""
    cdef int64_t new, i
    cdef req_t* q
    if e.srv_n == e.srv_cap:
        new = e.srv_cap * 2 if e.srv_cap > 0 else 64
        q = <req_t*>mem_calloc(new, sizeof(req_t))
        for i in range(e.srv_n):
            q[i] = e.srv_q[(e.srv_head + i) & (e.srv_cap - 1)]
        mem_free(e.srv_q)
        e.srv_q = q
        e.srv_cap = new
        e.srv_head = 0
    e.srv_q[(e.srv_head + e.srv_n) & (e.srv_cap - 1)] = s
    e.srv_n += 1
    return 0


cdef int _grow_open(Engine e) except -1 nogil:
    cdef int64_t new = e.open_cap * 2, i
    cdef req_t* q = <req_t*>mem_calloc(new, sizeof(req_t))
    for i in range(e.open_n):
        q[i] = e.open_q[(e.open_head + i) & (e.open_cap - 1)]
    mem_free(e.open_q)
    e.open_q = q
    e.open_cap = new
    e.open_head = 0
    return 0


cdef int _make_room(Engine e, ArenaC* a, bint accepts, int64_t need) except -1 nogil:
    """Room for ``need`` more entries in ``a`` (the segments, or with ``accepts`` the accept
    lists): the live requests' entries are packed into fresh columns (the retired ones'
    dropped), twice as large when they stay over half full.

    Between iterations only: the KV cache and the scheduler read the
    entries through each request's offset and the arena pointers, both
    updated here and by ``_point_at_arenas``.
    """
    cdef int64_t live = 0, cap, g, at = 0
    cdef int32_t k
    cdef req_t s
    cdef int32_t* off
    cdef int32_t cnt
    cdef void* fresh[3]
    cdef int64_t mask = e.win_cap - 1
    if a.n + need <= a.cap:
        return 0
    for g in range(e.retired, e.loaded):
        s = e.win[g & mask]
        live += e.reqs[s].acc_cnt if accepts else e.reqs[s].seg_cnt
    cap = a.cap if a.cap > 0 else 1
    if live == 0:  # a whole trace, or a fresh start: exactly what is needed
        cap = need if need > cap else cap
    while cap < live + need or (live > 0 and cap < 2 * (live + need)):
        cap *= 2
    for k in range(a.n_cols):
        fresh[k] = mem_calloc(cap, a.item[k])
    for g in range(e.retired, e.loaded):
        s = e.win[g & mask]
        off = &e.reqs[s].acc_off if accepts else &e.reqs[s].seg_off
        cnt = e.reqs[s].acc_cnt if accepts else e.reqs[s].seg_cnt
        for k in range(a.n_cols):
            if cnt:
                memcpy(<char*>fresh[k] + at * a.item[k], <char*>a.col[k] + off[0] * a.item[k], cnt * a.item[k])
        off[0] = <int32_t>at
        at += cnt
    for k in range(a.n_cols):
        mem_free(a.col[k])
        a.col[k] = fresh[k]
    a.cap = cap
    a.n = at
    _point_at_arenas(e)
    return 0


cdef void _point_at_arenas(Engine e) noexcept nogil:
    """The KV cache reads prompt segments, the scheduler accept lists, from the arenas."""
    e.kv.seg_stream = <hash_t*>e.segs.col[0]
    e.kv.seg_first = <tok_t*>e.segs.col[1]
    e.kv.seg_len = <tok_t*>e.segs.col[2]
    e.sched.conf.acc_list = <int64_t*>e.accs.col[0]
