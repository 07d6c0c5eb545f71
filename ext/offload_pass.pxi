# Included into scheduler.pyx: Scheduler.schedule's waiting pass with the KV offload connector
# (vllm/v1/core/sched/scheduler.py, 0.34.0).  FCFS, one full-attention group, no drafts: the
# configuration refuses the rest (aisim/config/offload.py).

cdef int _admit(SchedC* s, BatchC* b, req_t ri, tok_t hit, tok_t n) except -1 nogil:
    """The request joins running with ``hit`` computed tokens and ``n`` scheduled (the end of the
    waiting loop's body)."""
    cdef ReqC* r = &s.reqs[ri]
    s.running[s.n_running] = ri
    s.n_running += 1
    if r.status == ST_WAITING:
        b.new_req[b.n_new] = ri
        b.new_computed[b.n_new] = hit
        b.n_new += 1
    else:
        b.res_req[b.n_resumed] = ri
        b.res_computed[b.n_resumed] = hit
        b.n_resumed += 1
    _emit(b, ri, n, False)
    r.status = ST_RUNNING
    r.num_computed = hit
    r.off_tlen = 0  # its whole block table is handed out this step (yield_req_data)
    if r.first_sched_s < 0:
        r.first_sched_s = b.start_s
    return 0


cdef int _off_admit_waiting(SchedC* s, BatchC* b, tok_t token_budget, tok_t input_budget,
                            tok_t lpt) except -1 nogil:
    """sched_admit_waiting with the connector (the engine's macro-steps): the step's records
    started as Scheduler.schedule starts them (``_schedule``), then its waiting pass."""
    s.off.n_recs = 0
    s.off.step_evicted = 0
    s.off.cur_step = b.step
    return _waiting_pass_off(s, b, token_budget, input_budget, lpt)


cdef int _waiting_pass_off(SchedC* s, BatchC* b, tok_t token_budget, tok_t input_budget,
                           tok_t lpt) except -1 nogil:
    """Scheduler.schedule's waiting pass with a KV connector.  Requests holding blocks (loads
    started, kv_holding_waiting) are drained first, in order: one whose load has not been reported
    is skipped; one whose load was reported is promoted (_handle_blocked_waiting_request,
    _update_waiting_for_remote_kv: its blocks cached, num_computed_tokens = local + loaded, one
    less when that covers every token) and scheduled without a new lookup.  Then the waiting
    queue: the local prefix hit, then the connector's lookup (get_num_new_matched_tokens; None
    skips the request this step); an offered hit is an asynchronous load: allocate_slots for the
    local and external tokens only, keeping free what in-flight prefills still need
    (reserved_blocks), the load issued (update_state_after_alloc) and the request parked in
    WAITING_FOR_REMOTE_KVS holding its blocks, behind the parked ones."""
    cdef SchedConfC* c = &s.conf
    cdef OffloadC* o = s.off
    cdef int32_t pi = 0, i, j, n_skipped = 0, first_started = o.n_parked
    cdef int32_t n_started = 0
    cdef tok_t n, hit, ext, req_budget
    cdef req_t ri
    cdef ReqC* r
    cdef bint ok
    if o.disk != NULL:
        disk_poll(o, b.step, b.start_s)  # the first manager call of the step polls the disk tier
    while True:
        # loads_only (no running slot or token budget left): only async_kv_waiting goes on, the
        # queue of requests whose connector may_load_async; the OffloadingConnector keeps the base
        # answer (do_remote_prefill), so its requests are in `waiting` and the pass ends here.
        if s.n_running >= c.max_num_active_reqs or token_budget <= 0:
            break
        if input_budget <= 0:
            break
        if pi < first_started:
            # kv_holding_waiting first.
            ri = o.parked[pi]
            r = &s.reqs[ri]
            if r.off_park == 1:
                pi += 1  # still in WAITING_FOR_REMOTE_KVS
                continue
            if r.off_park == 2:
                kv_cache_blocks(s.kv, r, r.num_computed)
                if r.num_computed == num_tokens(r):
                    r.num_computed -= 1
                _off_reserve_parked(s, r)
                r.off_park = 3
            hit = r.num_computed
            req_budget = tmin(token_budget, input_budget)
            n = num_tokens(r) - hit
            if 0 < lpt < n:
                n = lpt
            if not c.chunked_prefill and n > req_budget:
                break
            n = tmin(n, req_budget)
            if kv_allocate_slots(s.kv, r, n, 0, c.reserve_full_isl, s.n_running > 0, 0, False) == 0:
                break
            # Out of kv_holding_waiting.
            for j in range(pi, o.n_parked - 1):
                o.parked[j] = o.parked[j + 1]
            o.n_parked -= 1
            first_started -= 1
            r.off_park = 0
            r.off_inflight = 1  # a promoted load stays an in-flight prefill until scheduled to its end
            _off_unreserve_parked(s, r)
            _admit(s, b, ri, hit, n)
            token_budget -= n
            input_budget -= n
            continue
        if s.n_waiting == 0:
            break
        ri = _wq_peek(s)
        r = &s.reqs[ri]
        kv_acquire_slot(s.kv, r)
        hit = kv_get_computed_blocks(s.kv, r)
        # The connector sees the local hit rounded down to a block.
        hit = hit // s.kv.sched_block_size * s.kv.sched_block_size
        ext = off_lookup(s, r, hit)
        _off_rec(o, OR_LOOKUP, ri, 0, hit, ext)
        if ext < 0:
            s.skipped[n_skipped] = _wq_pop(s)
            n_skipped += 1
            continue
        if ext > 0:
            # --max-num-inflight-kv-loads (_admits_inflight_kv_load: loads in progress or reported
            # and not yet scheduled): past the cap the request waits at the head of `waiting` and
            # the pass stops (Scheduler.schedule's `break`; only async_kv_waiting, empty here, would
            # go on past it).
            if o.conf.max_inflight_loads > 0 and o.n_parked >= o.conf.max_inflight_loads:
                break
            s.kv.reserved = <block_id_t>_off_reserved_blocks(s)
            ok = kv_allocate_slots(s.kv, r, ext, hit, c.reserve_full_isl, s.n_running > 0, 0, True) != 0
            s.kv.reserved = 0
            if not ok:
                break
            off_load(s, r, ri, ext, b.step)
            _off_connector_stats(s, r, hit, ext)
            if s.kv.caching:
                _prefix_stats(s, b, r, hit)
            r.cached_total += hit
            if r.num_preemptions == 0:
                r.cached_first = hit
                r.off_hit_first = ext
            r.num_computed = hit + ext
            r.off_park = 1
            _off_reserve_parked(s, r)
            _wq_pop(s)
            _off_park(s, ri)
            n_started += 1
            continue
        req_budget = tmin(token_budget, input_budget)
        n = num_tokens(r) - hit
        if 0 < lpt < n:
            n = lpt
        if not c.chunked_prefill and n > req_budget:
            break
        n = tmin(n, req_budget)
        if kv_allocate_slots(s.kv, r, n, hit, c.reserve_full_isl, s.n_running > 0, 0, False) == 0:
            break
        _off_connector_stats(s, r, hit, 0)
        if s.kv.caching:
            _prefix_stats(s, b, r, hit)
        _wq_pop(s)
        r.cached_total += hit
        if r.status == ST_WAITING:
            r.cached_first = hit
        if hit + n < num_tokens(r):
            r.off_inflight = 1
        _admit(s, b, ri, hit, n)
        token_budget -= n
        input_budget -= n
    # Skipped requests go back to the head in their original order.
    for i in range(n_skipped - 1, -1, -1):
        _wq_push_front(s, s.skipped[i])
    return 0


cdef inline void _prefix_stats(SchedC* s, BatchC* b, const ReqC* r, tok_t hit) noexcept nogil:
    # KVCacheManager.record_prefix_cache_stats, once per admission.
    if r.num_preemptions > 0:
        b.p_requests += 1
        b.p_queries += num_tokens(r)
        b.p_hits += hit
    else:
        b.requests += 1
        b.queries += num_tokens(r)
        b.hits += hit


cdef inline void _off_connector_stats(SchedC* s, const ReqC* r, tok_t local, tok_t ext) noexcept nogil:
    # connector_prefix_cache_stats.record at admission (queries: the tokens past the local hit).
    cdef OffloadC* o = s.off
    cdef tok_t q = num_tokens(r) - local
    if q == 0:
        return
    if r.num_preemptions > 0:
        o.conn_p_requests += 1
        o.conn_p_queries += q
        o.conn_p_hits += ext
    else:
        o.conn_requests += 1
        o.conn_queries += q
        o.conn_hits += ext
