# Included into scheduler.pyx: Scheduler.schedule's waiting pass (vllm/v1/core/sched/scheduler.py),
# on its own so that the engine's macro-steps can run it after their own running pass
# (sched_admit_waiting); schedule() runs it after the running pass, when nothing was preempted.

cdef int _waiting_pass(SchedC* s, BatchC* b, tok_t token_budget, tok_t input_budget, tok_t lpt,
                       bint prefill_scheduled, int32_t n_running_sched, spec_mode* mode) except -1 nogil:
    """Scheduler.schedule's waiting pass: admit waiting requests into ``b`` while the budgets
    (what the running pass left) and the KV cache allow."""
    cdef bint spec = spec_mode is spec_on_t
    cdef SchedConfC* c = &s.conf
    cdef tok_t draft_slots = c.draft_slots if spec else 0
    cdef tok_t k = c.num_spec_tokens if spec else 0
    cdef tok_t n, hit, req_budget
    cdef int32_t i, n_skipped = 0
    cdef req_t ri
    cdef ReqC* r
    cdef bint ok, pad
    if s.off != NULL:
        # A KV offload tier: the connector's pass (a quiet step of the engine's macro-steps comes
        # here through sched_admit_waiting; Scheduler.schedule goes there itself).
        return _off_admit_waiting(s, b, token_budget, input_budget, lpt)
    if c.aware_window > 0:
        _reorder_by_cached_prefix(s)
    while token_budget > 0:
        if s.n_waiting == 0 or input_budget <= draft_slots:
            break
        if s.n_running >= c.max_num_active_reqs:
            break
        ri = _wq_peek(s)
        r = &s.reqs[ri]
        if r.num_stale > 0:
            # Its preempted in-flight output is still to be delivered.
            s.skipped[n_skipped] = _wq_pop(s)
            n_skipped += 1
            continue
        if r.remote != 0:
            # Its prompt's KV comes from a prefill replica (a deployment's decode pool).
            ok = _remote_kv(s, b, r, b.start_s)
            if not ok:
                if r.remote == 1:
                    break  # allocate_slots returned None: the waiting pass stops
                s.skipped[n_skipped] = _wq_pop(s)
                n_skipped += 1
                continue
        if r.num_computed > 0:
            # The transfer landed: num_computed_tokens is set, no lookup
            # (Scheduler.schedule, the num_computed_tokens > 0 branch).
            hit = r.num_computed
        else:
            kv_acquire_slot(s.kv, r)
            # New or preempted request: local prefix-cache lookup.
            hit = kv_get_computed_blocks(s.kv, r)
        req_budget = tmin(token_budget, input_budget - draft_slots)
        n = num_tokens(r) - hit
        pad = False
        if spec and n == 1 and not prefill_scheduled and (n_running_sched > 0 or hit > 0):
            # A one-token admission is padded to the uniform 1 + k decode
            # shape with -1 drafts, when the sampled token still fits; if the
            # padded request does not fit the budget the pass stops.
            if hit + 1 + k + 1 <= c.max_model_len:
                if 1 + k > req_budget:
                    break
                n = 1 + k
                pad = True
        if 0 < lpt < n:
            n = lpt
        if not c.chunked_prefill and n > req_budget:
            break
        n = tmin(n, req_budget)
        if c.mamba_split:
            n = _mamba_block_aligned_split(s, r, n, hit)
            if n == 0:
                break
            if pad and n != 1 + k:
                # Alignment clipped the padding rows: drop the padding.
                n = 1
                pad = False
        if kv_allocate_slots(s.kv, r, n, hit if r.num_computed == 0 else 0, c.reserve_full_isl,
                             s.n_running > 0, c.num_lookahead, False) == 0:
            break
        # record_prefix_cache_stats, once per successful admission (a remote
        # request's lookup was recorded when it was admitted to wait).
        if s.kv.caching and r.num_computed == 0:
            if r.num_preemptions > 0:
                b.p_requests += 1
                b.p_queries += num_tokens(r)
                b.p_hits += hit
            else:
                b.requests += 1
                b.queries += num_tokens(r)
                b.hits += hit
        _wq_pop(s)
        s.running[s.n_running] = ri
        s.n_running += 1
        if r.num_computed == 0:
            r.cached_total += hit
        if r.status == ST_WAITING:
            b.new_req[b.n_new] = ri
            b.new_computed[b.n_new] = hit
            b.n_new += 1
            if r.num_computed == 0:
                r.cached_first = hit
        else:
            b.res_req[b.n_resumed] = ri
            b.res_computed[b.n_resumed] = hit
            b.n_resumed += 1
        _emit(b, ri, n, spec)
        if pad:
            b.spec_m[b.n - 1] = k
            b.padded[b.n - 1] = 1
        token_budget -= n
        input_budget -= n + draft_slots
        r.status = ST_RUNNING
        r.num_computed = hit
        if r.first_sched_s < 0:
            r.first_sched_s = b.start_s
    # Skipped requests go back to the head in their original order.
    for i in range(n_skipped - 1, -1, -1):
        _wq_push_front(s, s.skipped[i])
    return 0


cdef int _reorder_by_cached_prefix(SchedC* s) except -1 nogil:
    """Scheduler._reorder_waiting_by_cached_prefix (cache_aware_admission_window): once KV usage
    reaches the threshold, the plain waiting requests (WAITING, no computed tokens) among the
    first ``window`` of the queue take their places again ordered by cached prefix, longest
    first, ties in queue order; every other request keeps its place.  The cached prefix is the
    lookup of admission without its side effects (KVCacheManager.get_num_cached_tokens)."""
    cdef const SchedConfC* c = &s.conf
    cdef int32_t n, i, j, k, n_slots = 0
    cdef req_t ri
    cdef ReqC* r
    cdef tok_t cached
    if s.n_waiting < 2:
        return 0
    if bp_usage(&s.kv.pool) < c.aware_threshold:
        return 0
    n = c.aware_window if c.aware_window < s.n_waiting else s.n_waiting
    for i in range(n):
        ri = s.waiting[_ring(s, i)]
        r = &s.reqs[ri]
        if r.status == ST_WAITING and r.num_computed == 0 and r.remote == 0:
            s.aware_pos[n_slots] = i
            s.aware_reqs[n_slots] = ri
            n_slots += 1
    if n_slots < 2:
        return 0
    for k in range(n_slots):
        r = &s.reqs[s.aware_reqs[k]]
        kv_acquire_slot(s.kv, r)
        s.aware_cached[k] = kv_get_computed_blocks(s.kv, r)
    # sorted(slots, key=(-cached, slot)): a stable insertion sort, longest first.
    for k in range(1, n_slots):
        ri = s.aware_reqs[k]
        cached = s.aware_cached[k]
        j = k - 1
        while j >= 0 and s.aware_cached[j] < cached:
            s.aware_reqs[j + 1] = s.aware_reqs[j]
            s.aware_cached[j + 1] = s.aware_cached[j]
            j -= 1
        s.aware_reqs[j + 1] = ri
        s.aware_cached[j + 1] = cached
    for k in range(n_slots):
        s.waiting[_ring(s, s.aware_pos[k])] = s.aware_reqs[k]
    return 0
