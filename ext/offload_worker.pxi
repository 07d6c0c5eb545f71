# Included by scheduler.pyx after offload.pxi: the worker side of KV offload as the core plays it
# (the copies between the GPU and the CPU tier, on the step clock or the link's) and what its output
# tells the connector (structs: ext/offload.pxd).

cdef int _off_complete(SchedC* s, int32_t j) except -1 nogil:
    """OffloadingConnectorScheduler._update_connector_output for one completed job: a store makes its
    chunks loadable and evictable (complete_store), a load unpins its chunks (complete_load) and
    puts its request in finished_recving."""
    cdef OffloadC* o = s.off
    cdef OffJobC* jb = &o.jobs[j]
    cdef ReqC* r = &s.reqs[jb.req]
    cdef const int32_t* cids = jb.cids  # pinned or being stored since the job was issued: still its keys' chunks
    cdef int32_t i, c, n = jb.n_keys, n_free = 0
    cdef bint watched = False
    cdef OffChunkC* chunks = o.chunks
    cdef OffLinkC* links = o.lru
    cdef OffChunkC* ch
    # Each chunk's state and its node in the LRU list (its evictable flag), fetched ahead.
    for i in range(tmin(OFF_AHEAD, n)):
        _off_fetch_chunk(chunks, links, cids[i])
    # A store's chunks become stored, a load's are released (one loop each: the test is the job's).
    if jb.store:
        for i in range(n):
            if i + OFF_AHEAD < n:
                _off_fetch_chunk(chunks, links, cids[i + OFF_AHEAD])
            c = cids[i]
            ch = &chunks[c]
            watched |= ch.watch != 0
            if ch.ref < 0:
                ch.ref = 0
                n_free += 1
                _off_mark_evictable(links, c)
    else:
        for i in range(n):
            if i + OFF_AHEAD < n:
                _off_fetch_chunk(chunks, links, cids[i + OFF_AHEAD])
            c = cids[i]
            ch = &chunks[c]
            watched |= ch.watch != 0
            ch.ref -= 1
            ch.loading = 0
            if ch.ref == 0:
                n_free += 1
                _off_mark_evictable(links, c)
    o.n_evictable += n_free
    if watched:
        _off_memo_drop(o)  # the last lookup's scan found one of them (dropped once: nothing above reads it)
    off_unfence(o, jb)
    if jb.store and o.disk != NULL:
        disk_cascade(o, jb)  # TieringOffloadingManager.complete_store: on to the disk tier
    o.completed += 1
    _off_rec(o, OR_DONE, jb.req, jb.id, jb.store, 0)
    if not jb.store:
        o.recving += 1
        if r.off_park == 1:
            r.off_park = 2
        _off_rec(o, OR_RECV, jb.req, jb.id, 0, 0)
    r.off_jobs -= 1
    jb.active = 0
    o.n_jobs -= 1
    o.free_jobs[o.n_free_jobs] = j
    o.n_free_jobs += 1
    if r.off_hold == 2 and r.off_jobs == 0:
        _off_forget(s, r)
    return 0


cdef inline sec_t _off_submit(OffloadC* o, OffJobC* jb, sec_t at, sec_t* free_s) noexcept nogil:
    # Transfers on the clock: the copy starts when the link is free, lasts its bytes over the rate.
    cdef sec_t t0 = at if at > free_s[0] else free_s[0]
    free_s[0] = t0 + jb.n_keys * o.conf.chunk_bytes / o.conf.link_bps
    return free_s[0]


cdef inline bint _off_landed(const OffloadC* o, const OffJobC* jb, step_t step, sec_t end_s) noexcept nogil:
    if jb.flushed:
        # The worker waits for a flushed job in the step that flushed it (before its forward pass):
        # that step's output reports it, on either clock.  Asynchronous scheduling flushes in the
        # schedule() of step N + 1 before the output of step N is processed: not yet.
        return jb.due <= step
    if o.conf.link_bps > 0:
        return jb.due_s <= end_s
    return jb.due <= step


cdef int off_worker_output(SchedC* s, step_t step, sec_t start_s, sec_t end_s) except -1 nogil:
    """What the worker reports in the output of ``step`` (``start_s`` .. ``end_s``) (offloading/worker.py,
    handle_preemptions, start_kv_transfers, get_finished; the timing of the recorded scenarios): stores
    deferred from the last step and this step's flushed stores are submitted before the forward pass,
    this step's loads after it; the rest of its stores wait for the next step.  Stores, then loads,
    are polled in submission order up to the first unfinished one.  A job lands ``load_delay`` /
    ``store_delay`` steps after it was issued, a flushed one at once; or, with a link rate, when its
    bytes have crossed the link (one copy at a time per direction).

    The worker runs the steps in order and sees only the jobs of each step's metadata.  With
    asynchronous scheduling (EngineCore.step_with_batch_queue) the schedule() of step N + 1 runs
    before the output of step N is processed: the jobs it issued (``issued`` > ``step``) stay for the
    output of their own step."""
    cdef OffloadC* o = s.off
    cdef bint timed = o.conf.link_bps > 0
    cdef int32_t i, j, n_keep = 0, n_later = 0
    cdef OffJobC* jb
    if o.disk != NULL:
        # The engine line processing this output: the write a reported store cascades to
        # (TieringOffloadingManager.complete_store, called from update_connector_output) is issued
        # there, and the schedule() calls after it poll it.  Asynchronous, the output of step N is
        # processed in line N + 1 (after the schedule() of step N + 1: EngineCore.step_with_batch_queue).
        o.disk.out_step = step + 1 if s.conf.async_scheduling else step
        o.disk.out_s = end_s
    if o.n_deferred == 0 and o.n_step_stores == 0 and o.n_step_loads == 0 and o.sq_n == 0 and o.lq_n == 0:
        return 0  # no job to submit or poll (most steps)
    for i in range(o.n_deferred):
        j = o.deferred[i]
        if timed and not o.jobs[j].flushed:
            o.jobs[j].due_s = _off_submit(o, &o.jobs[j], start_s, &o.store_free_s)
        o.store_q[(o.sq_head + o.sq_n) % o.jobs_cap] = j
        o.sq_n += 1
    o.n_deferred = 0
    for i in range(o.n_step_stores):
        j = o.step_stores[i]
        jb = &o.jobs[j]
        if jb.issued > step:
            o.step_stores[n_later] = j
            n_later += 1
        elif jb.flushed:
            o.store_q[(o.sq_head + o.sq_n) % o.jobs_cap] = j
            o.sq_n += 1
        else:
            jb.due = step + o.conf.store_delay
            o.deferred[n_keep] = j
            n_keep += 1
    o.n_deferred = n_keep
    o.n_step_stores = n_later
    n_later = 0
    for i in range(o.n_step_loads):
        j = o.step_loads[i]
        if o.jobs[j].issued > step:
            o.step_loads[n_later] = j
            n_later += 1
            continue
        o.jobs[j].due = step + o.conf.load_delay
        if timed:
            o.jobs[j].due_s = _off_submit(o, &o.jobs[j], end_s, &o.load_free_s)
        o.load_q[(o.lq_head + o.lq_n) % o.jobs_cap] = j
        o.lq_n += 1
    o.n_step_loads = n_later
    while o.sq_n > 0 and _off_landed(o, &o.jobs[o.store_q[o.sq_head]], step, end_s):
        j = o.store_q[o.sq_head]
        o.sq_head = (o.sq_head + 1) % o.jobs_cap
        o.sq_n -= 1
        _off_complete(s, j)
    while o.lq_n > 0 and _off_landed(o, &o.jobs[o.load_q[o.lq_head]], step, end_s):
        j = o.load_q[o.lq_head]
        o.lq_head = (o.lq_head + 1) % o.jobs_cap
        o.lq_n -= 1
        _off_complete(s, j)
    return 0


cdef sec_t off_next_landing(const OffloadC* o) noexcept nogil:
    """Transfers on the clock: when the next submitted transfer that blocks the polling lands
    (-1: none, or transfers counted in steps)."""
    cdef sec_t t = -1
    cdef sec_t d
    if o.conf.link_bps <= 0:
        return -1
    if o.sq_n > 0:
        t = o.jobs[o.store_q[o.sq_head]].due_s
    if o.lq_n > 0:
        d = o.jobs[o.load_q[o.lq_head]].due_s
        if t < 0 or d < t:
            t = d
    return disk_next_landing(o, t)
