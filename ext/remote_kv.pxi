# Included by scheduler.pyx: a decode replica admitting a request whose prompt KV a prefill
# replica sends, and a prefill replica freeing the blocks it held for the transfer.

cdef bint _remote_kv(SchedC* s, BatchC* b, ReqC* r, sec_t now) except -1 nogil:
    """A decode replica's waiting request whose prompt KV a prefill replica sends; True when it
    can be scheduled now (the transfer landed by ``now``, the start of this step).

    First visit (vllm/v1/core/sched/scheduler.py, Scheduler.schedule waiting loop with a KV
    connector; kv_connector/v1/nixl: get_num_new_matched_tokens): the local prefix hit L is looked
    up, the connector loads the other ``prompt - L`` tokens asynchronously, allocate_slots takes
    blocks for the whole prompt with num_external_computed_tokens and delay_cache_blocks (no block
    is cached before the KV is there), num_computed_tokens = prompt, and the request waits in
    WAITING_FOR_REMOTE_KVS holding its blocks.  When the transfer has landed,
    _update_waiting_for_remote_kv caches its blocks and it is scheduled like any request with
    num_computed_tokens > 0: its first token after the prompt is computed locally (the request
    carries the prefill replica's first token, so num_computed_tokens < num_tokens already; the
    ``num_computed_tokens == num_tokens`` backoff never triggers).
    """
    cdef tok_t hit
    if r.remote == 1:
        kv_acquire_slot(s.kv, r)
        hit = kv_get_computed_blocks(s.kv, r)
        if kv_allocate_slots(s.kv, r, r.prompt_len - hit, hit, s.conf.reserve_full_isl, s.n_running > 0,
                             0, True) == 0:
            return False
        if s.kv.caching:
            b.requests += 1
            b.queries += num_tokens(r)
            b.hits += hit
        r.cached_first = hit
        r.cached_total += hit
        r.num_computed = r.prompt_len
        r.remote = 2
    if r.remote_s > now:
        return False
    # _update_waiting_for_remote_kv: cache the blocks now that their KV is valid.
    kv_cache_blocks(s.kv, r, r.num_computed)
    r.remote = 0
    s.n_remote -= 1
    return True


cdef void sched_free_held(SchedC* s, req_t ri) noexcept nogil:
    """A prefill replica's transfer of request ``ri`` landed: its held blocks are freed as a finish
    frees them (vllm/v1/core/sched/scheduler.py, _update_from_kv_xfer_finished: finished_sending ->
    _free_blocks, after request_finished returned delay_free_blocks).  With a KV offload tier the
    replica runs vLLM's MultiConnector (distributed/kv_transfer/kv_connector/v1/multi_connector.py,
    _aggregate_request_finished): only the NixlConnector asks to delay the free (the
    OffloadingConnector's request_finished answers False), so the free waits for the transfer
    alone; the slot goes back once the offload connector has dropped the request too."""
    cdef ReqC* r = &s.reqs[ri]
    kv_free(s.kv, r)
    if r.off_hold == 0:
        kv_release_slot(s.kv, r)
    r.held = 0


cdef sec_t sched_next_landing(const SchedC* s) noexcept nogil:
    """The earliest landing among the waiting requests that wait for a transfer (-1: none)."""
    cdef int32_t i
    cdef sec_t t = -1
    cdef const ReqC* r
    if s.n_remote == 0:
        return -1
    if s.conf.priority:
        for i in range(s.wheap.n):
            r = &s.reqs[s.wheap.a[i].item]
            if r.remote != 0 and (t < 0 or r.remote_s < t):
                t = r.remote_s
        return t
    for i in range(s.n_waiting):
        r = &s.reqs[s.waiting[_ring(s, i)]]
        if r.remote != 0 and (t < 0 or r.remote_s < t):
            t = r.remote_s
    return t
