# Included into engine.pyx: an Engine as one replica of a deployment (deploy.pyx).  The deployment
# feeds it one routed request at a time (replica_add) and steps it one iteration at a time
# (replica_step) on the deployment's clock, then ends it (replica_end).  Free functions over the
# Engine's C fields, declared in engine.pxd for deploy.pyx.


cdef req_t replica_add(Engine e, const TraceC* t, int64_t i, sec_t at, bint front) except -1 nogil:
    """Feed request ``i`` of a deployment's trace ``t`` (open loop, sent at ``at``); its slot.

    ``front``: the request passes this replica's API server first (``t.frontend_s``; each replica
    is one ``vllm serve`` with its own server): it reaches the engine when the server's serial
    queue hands it over (aisim/perf/frontend.py), else at ``at``.

    What ``Engine.feed`` does for one request of a chunk, read from borrowed C arrays: its
    segments (and accept list) are copied into the arenas, so nothing is allocated per request
    but the arenas' and slots' geometric growth.  Between iterations only; the caller may
    adjust the slot's request (a disaggregated deployment's pools) before the next iteration.
    """
    cdef int32_t n_seg = t.seg_cnt[i]
    cdef int32_t n_acc = t.acc_cnt[i] if t.acc_cnt != NULL else 0
    cdef int32_t so = t.seg_off[i]
    cdef int64_t g = e.loaded
    cdef req_t s
    cdef ReqC* r
    cdef sec_t sent = at
    if front and t.frontend_s != NULL:
        if e.front_free > at:
            at = e.front_free
        at += t.frontend_s[i]
        e.front_free = at
    replica_wake(e, at)
    if e.n_free < 1:
        _grow_pool(e, <req_t>(e.pool_cap - e.n_free + 1))
    _grow_window(e, e.loaded + 1 - e.retired)
    _make_room(e, &e.segs, False, n_seg)
    _make_room(e, &e.accs, True, n_acc)
    if n_seg:
        memcpy(<hash_t*>e.segs.col[0] + e.segs.n, &t.seg_stream[so], n_seg * sizeof(hash_t))
        memcpy(<tok_t*>e.segs.col[1] + e.segs.n, &t.seg_first[so], n_seg * sizeof(tok_t))
        memcpy(<tok_t*>e.segs.col[2] + e.segs.n, &t.seg_len[so], n_seg * sizeof(tok_t))
    if n_acc:
        memcpy(<int64_t*>e.accs.col[0] + e.accs.n, &t.acc_values[t.acc_off[i]], n_acc * sizeof(int64_t))
    s = _occupy(e, g, at, 0, -1, 0, True)
    r = &e.reqs[s]
    r.next_turn = -1
    r.prompt_len = t.prompt_len[i]
    r.max_tokens = t.max_tokens[i]
    r.priority = t.priority[i]
    r.arrival_key = t.arrival_key[i]
    r.id_rank = t.id_rank[i]
    r.seg_off = <int32_t>e.segs.n
    r.seg_cnt = n_seg
    r.acc_off = <int32_t>e.accs.n
    r.acc_cnt = n_acc
    r.out_stream = t.out_stream[i]
    r.lazy_keys = t.private_req[i] if t.private_req != NULL and kv_lazy_ok(&e.kv) else 0
    r.sent_s = sent
    e.segs.n += n_seg
    e.accs.n += n_acc
    e.loaded += 1
    if e.open_n == 1 and not sched_has_requests(&e.sched) and e.q_len == 0 \
            and at > e.clock:
        e.clock = at  # an idle engine jumps to the arrival
    return s


cdef int replica_wake(Engine e, sec_t at) except -1 nogil:
    """Something reaches the replica at ``at``: a request, or (a prefill replica) the end of a
    transfer that frees its held blocks.  When its last iteration computed nothing and polled for
    a KV offload copy on the clock past ``at``, that poll ends at ``at`` (or at its forward pass's
    end), as the next arrival of its share ends a single engine's (Engine._end_sync_step): vLLM's
    engine polls in a loop and its next schedule() sees the change.  The deployment handles an
    event only once every iteration starting before it has run, so the poll is the last row."""
    cdef sec_t end
    if e.poll_floor < 0 or at >= e.clock:
        return 0
    end = at if at > e.poll_floor else e.poll_floor
    _put_f64(&e.cols, SC_DURATION, e.cols.n - 1, end - e.last_start)
    e.clock = end
    e.poll_floor = -1
    return 0


cdef int replica_step(Engine e, sec_t until) except -1 nogil:
    """One iteration of a busy replica at its clock: the arrivals fed so far (all due by now, the
    deployment's event order guarantees it) are added first, as ``Engine._run`` adds them.  With
    macro-steps, a quiet stretch instead: every iteration of it starts before ``until`` (the
    deployment's next event that could reach this replica or read its state)."""
    cdef req_t r_new
    if e.stalled > STALL_LIMIT:
        with gil:
            raise RuntimeError(_stall_reason(e.sched.off, e.step, e.sched.n_running, e.sched.n_waiting))
    e._retire(False)
    if e.open_n > 0 and not sched_has_requests(&e.sched) and e.q_len == 0 \
            and e.slot_time[e.open_q[e.open_head]] > e.clock:
        e.clock = e.slot_time[e.open_q[e.open_head]]  # idle until its API server hands one over
    while _open_due(e):
        r_new = e.open_q[e.open_head]
        e.open_head = (e.open_head + 1) & (e.open_cap - 1)
        e.open_n -= 1
        e._add_request(r_new)
        e.in_flight += 1
    # A stretch adds no arrivals: it ends before the next one its API server hands over.
    if e.open_n > 0 and e.slot_time[e.open_q[e.open_head]] < until:
        until = e.slot_time[e.open_q[e.open_head]]
    if e.macro.period == 0 or until <= e.clock or _stretch(e, until) == 0:
        e._iterate()
    return 0


cdef int replica_end(Engine e) except -1 nogil:
    """The deployment has ended: write out every request fed."""
    e._retire(True)
    e.finished = True
    return 0
