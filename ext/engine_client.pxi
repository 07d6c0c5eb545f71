# Included into engine.pyx: the client and the API server in front of the engine.  Open-loop
# requests are sent in trace order (held by the client's max_concurrency cap), closed-loop turns
# when a finish releases them; a sent request reaches the engine at once or through the API
# server's serial queue (aisim/perf/frontend.py).  Free functions over the Engine's C fields (a
# class body cannot include a file); engine.pyx and its other included files are their users.


cdef bint _open_due(Engine e) noexcept nogil:
    # The next open-loop request (trace order) has arrived by this clock / engine step, and the
    # client may send it: vllm/benchmarks/serve.py (benchmark, limited_request_func) holds a
    # request until fewer than max_concurrency are in flight (an asyncio.Semaphore: in order).
    cdef req_t s
    if e.open_n == 0 or (e.max_conc and e.in_flight >= e.max_conc):
        return False
    s = e.open_q[e.open_head]
    if e.timed:
        return e.slot_time[s] <= e.clock
    return e.slot_step[s] <= e.step


cdef req_t _pop_release(Engine e) noexcept nogil:
    """The next closed-loop turn due: its slot, its arrival key the release time."""
    cdef sec_t t = e.rel.a[0].key
    cdef int64_t g = heap_pop(&e.rel)
    cdef req_t s = e.win[g & (e.win_cap - 1)]
    e.reqs[s].arrival_key = t
    return s


cdef int _release_next_turns(Engine e) except -1 nogil:
    """The finished requests leave the client's in-flight count; closed loop: a finished turn
    sends its session's next turn after its think time."""
    cdef int32_t i
    cdef req_t f
    cdef int64_t nx
    cdef sec_t t
    if e.max_conc:
        # The client's cap learns of them when this iteration ends (_add_arrivals: the clock
        # then), as a deployment's client does (deploy.pyx _release).
        e.cap_pending += e.sched.n_finished
    else:
        e.in_flight -= e.sched.n_finished
    for i in range(e.sched.n_finished):
        f = e.sched.finished[i]
        nx = e.slot_next[f]
        if nx >= 0:
            t = e.reqs[f].finish_s + e.slot_next_think[f]
            if e.rel.n == e.rel.cap:
                mem_grow(<void**>&e.rel.a, e.rel.cap, e.rel.cap * 2 + 1, sizeof(e.rel.a[0]))
                e.rel.cap = e.rel.cap * 2 + 1
            # (0, release time, trace index): the tie is the turn's place in the trace.
            heap_push(&e.rel, 0, t, nx, <req_t>nx)
    return 0


cdef bint _release_due(Engine e) noexcept nogil:
    # A closed-loop turn released by a finish is due by this clock.
    return e.rel.n > 0 and e.rel.a[0].key <= e.clock


cdef bint _input_needed(Engine e) noexcept nogil:
    # The next arrival may be in the input not fed yet.
    return not e.ended and (e.open_n == 0 or (_release_due(e) and e.rel.a[0].tie >= e.loaded))


cdef sec_t _next_input_s(Engine e, bint handover) noexcept nogil:
    # When the next request can reach a timed engine (INF_TIME: none known): the next open-loop send
    # while the client's cap has room, closed-loop release, or hand-over by the API server.  With
    # ``handover``, the open-loop send's own hand-over (the server's queue is serial: it takes the
    # request at its send or when free); a replica's open queue holds hand-overs already.
    cdef sec_t t = INF_TIME
    cdef req_t r
    if e.open_n > 0 and not (e.max_conc and e.in_flight >= e.max_conc):
        r = e.open_q[e.open_head]
        t = e.slot_time[r]
        if handover and e.front and not e.replica:
            if e.front_free > t:
                t = e.front_free
            t += e.slot_front[r]
    if e.rel.n > 0 and e.rel.a[0].key < t:
        t = e.rel.a[0].key
    if e.srv_n > 0 and e.slot_time[e.srv_q[e.srv_head]] < t:
        t = e.slot_time[e.srv_q[e.srv_head]]
    return t


cdef int _add_arrivals(Engine e) except -1 nogil:
    """Send the requests due by now: open-loop requests in trace order, merged with closed-loop
    turns released by a finish, ordered by (time, trace index); and add the requests that have
    reached the engine: at once, or, with the API server in front, once its serial queue has
    handed them over (aisim/perf/frontend.py).  Returns ADV_INPUT when the next one may be in
    the input not fed yet, else 0."""
    cdef req_t r_open, r_new
    cdef sec_t sent
    while True:
        if _input_needed(e):
            return ADV_INPUT
        if e.cap_pending:
            # Requests due before this clock were sent under the cap as it stood before the
            # finishes the last iteration reported; then those release it, at this clock.
            if e.timed and _open_due(e) and e.slot_time[e.open_q[e.open_head]] < e.clock:
                r_new = e.open_q[e.open_head]
                e.open_head = (e.open_head + 1) & (e.open_cap - 1)
                e.open_n -= 1
                _send(e, r_new, e.slot_time[r_new])
                continue
            if e.in_flight >= e.max_conc:
                e.cap_free_s = e.clock
            e.in_flight -= e.cap_pending
            e.cap_pending = 0
        if _open_due(e):
            r_open = e.open_q[e.open_head]
            if _release_due(e) and (
                    e.rel.a[0].key < e.slot_time[r_open]
                    or (e.rel.a[0].key == e.slot_time[r_open]
                        and e.rel.a[0].tie < e.slot_global[r_open])):
                sent = e.rel.a[0].key
                r_new = _pop_release(e)
            else:
                r_new = r_open
                e.open_head = (e.open_head + 1) & (e.open_cap - 1)
                e.open_n -= 1
                # Sent at its arrival, or when the client's full cap let it go
                # (vllm/benchmarks/serve.py limited_request_func: the semaphore's release).
                sent = e.slot_time[r_new] if e.timed else e.clock
                if e.timed and e.cap_free_s > sent:
                    sent = e.cap_free_s
        elif _release_due(e):
            sent = e.rel.a[0].key
            r_new = _pop_release(e)
        elif e.srv_n > 0 and e.slot_time[e.srv_q[e.srv_head]] <= e.clock:
            r_new = e.srv_q[e.srv_head]
            e.srv_head = (e.srv_head + 1) & (e.srv_cap - 1)
            e.srv_n -= 1
            e._add_request(r_new)
            continue
        else:
            return 0
        _send(e, r_new, sent)


cdef int _send(Engine e, req_t r, sec_t sent) except -1 nogil:
    """The client sends request ``r`` at ``sent``: the engine adds it now, or, with the API
    server in front, once the server's queue hands it over."""
    e.reqs[r].sent_s = sent
    e.in_flight += 1
    if not e.front:
        return e._add_request(r)
    # One server, first come first served: it takes the request when free and hands it to the
    # engine its service time later (tokenization, then AsyncLLM.add_request).
    if e.front_free > sent:
        sent = e.front_free
    e.front_free = sent + e.slot_front[r]
    e.slot_time[r] = e.front_free
    return _srv_push(e, r)
