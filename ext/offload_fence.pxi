# Included by scheduler.pyx after offload.pxi: the flush of a finished request's in-flight stores
# whose GPU blocks are handed to a request again (vllm/distributed/kv_transfer/kv_connector/v1/
# offloading/scheduler.py, 0.34.0).  A store job keeps the GPU blocks it copies from
# (_build_store_jobs: deferred_fence_block_ids, full attention); request_finished registers them in
# _block_id_to_pending_jobs once the request finished (its blocks go back to the pool at once:
# request_finished answers delay_free_blocks = False); _build_connector_meta flushes every
# registered job one of whose blocks this step's scheduler output hands out
# (_current_batch_allocated_block_ids: the whole block table of a new or resumed request, the new
# blocks of a running one), and a finished request's store created in this step at once when its
# blocks are among them; update_connector_output forgets a job when it is reported.


cdef int off_stamp_allocated(SchedC* s, BatchC* b) except -1 nogil:
    """_update_req_states: the blocks this step's scheduler output hands out (yield_req_data: a new
    or resumed request's whole table, a running request's blocks past its last schedule()), the null
    block aside, stamped with the step."""
    cdef OffloadC* o = s.off
    cdef int32_t i, x, n
    cdef const block_id_t* row
    cdef block_id_t blk
    cdef ReqC* r
    if o.alloc_n < s.kv.pool.num_blocks:
        mem_grow(<void**>&o.alloc_mark, o.alloc_n, s.kv.pool.num_blocks, sizeof(int64_t))
        o.alloc_n = s.kv.pool.num_blocks
    for i in range(b.n):
        r = &s.reqs[b.req[i]]
        n = _off_table_len(s.kv, 0, r)
        row = kv_table(s.kv, 0, r.slot)
        for x in range(r.off_tlen, n):
            blk = row[x]
            if blk != 0:
                o.alloc_mark[blk] = b.step + 1
        r.off_tlen = n
    return 0


cdef bint _off_job_handed_out(const OffloadC* o, const OffJobC* jb, step_t step) noexcept nogil:
    cdef int32_t k
    for k in range(jb.n_blocks):
        if o.alloc_mark[jb.blocks[k]] == step + 1:
            return True
    return False


cdef int _off_flush_job(OffloadC* o, int32_t k, step_t step) except -1 nogil:
    """Job slot ``k`` goes into this step's jobs_to_flush (a set: once a step).  The worker waits for
    it in ``step``, so that step's output reports it at the latest; a job already due earlier keeps
    its step (asynchronous scheduling flushes before the output of the step before is processed),
    a copy already on the link its landing time.  Asynchronous, a job flushed in the step before is
    still in flight and listed again if its blocks are handed out again."""
    cdef OffJobC* jb = &o.jobs[k]
    if jb.listed == step:
        return 0
    jb.listed = step
    jb.flushed = 1
    if jb.due > step:
        jb.due = step
    o.flushed += 1
    _off_rec(o, OR_FLUSH, jb.req, jb.id, 0, 0)
    return 0


cdef int off_flush_fenced(SchedC* s, step_t step) except -1 nogil:
    """_build_connector_meta, "Flush jobs that contain re-allocated blocks"."""
    cdef OffloadC* o = s.off
    cdef int32_t k
    if o.n_fenced == 0:
        return 0
    for k in range(o.jobs_cap):
        if o.jobs[k].active and o.jobs[k].fenced and _off_job_handed_out(o, &o.jobs[k], step):
            _off_flush_job(o, k, step)
    return 0


cdef int _off_fence(OffloadC* o, int32_t k) except -1 nogil:
    if not o.jobs[k].fenced:
        o.jobs[k].fenced = 1
        o.n_fenced += 1
    return 0


cdef int off_fence_new(SchedC* s, int32_t k, step_t step) except -1 nogil:
    """_build_store_jobs for a finished request: its new store's blocks are watched at once, and it
    is flushed in this step when one of them is handed out in it."""
    _off_fence(s.off, k)
    if _off_job_handed_out(s.off, &s.off.jobs[k], step):
        _off_flush_job(s.off, k, step)
    return 0


cdef int off_fence_finished(SchedC* s, req_t ri) except -1 nogil:
    """OffloadingConnectorScheduler.request_finished: the request's stores in flight have their source
    blocks watched from now on."""
    cdef OffloadC* o = s.off
    cdef int32_t k
    if s.reqs[ri].off_jobs == 0:
        return 0
    for k in range(o.jobs_cap):
        if o.jobs[k].active and o.jobs[k].req == ri and o.jobs[k].store:
            _off_fence(o, k)
    return 0


cdef void off_unfence(OffloadC* o, OffJobC* jb) noexcept nogil:
    # update_connector_output -> _remove_pending_job: a reported job is forgotten.
    if jb.fenced:
        jb.fenced = 0
        o.n_fenced -= 1
