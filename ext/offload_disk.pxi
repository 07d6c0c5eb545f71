# Included by scheduler.pyx after offload_worker.pxi: the disk tier behind the CPU tier (structs:
# ext/offload.pxd, DiskC), as vLLM 0.34.0 runs a TieringOffloadingSpec with one `fs` secondary tier.
# Files below are relative to the vllm package.
#
# - Cascade (v1/kv_offload/tiering/manager.py, TieringOffloadingManager.complete_store,
#   create_store_job): when the worker reports a GPU -> CPU store, every chunk of the job is pinned
#   in the CPU tier (CPUPrimaryTierOffloadingManager.prepare_read: ref + 1, no recency change) and
#   written to disk; the pin goes when the write is reported (complete_read).  A chunk already on
#   disk is not written again (tiering/fs/io.py, _store_block).  Promoted chunks are not cascaded.
#   The write is issued where update_connector_output runs: asynchronous, a line after the step
#   whose output reported the store (off_worker_output sets out_step).
# - No eviction: the fs tier (tiering/fs/manager.py, FileSystemTierManager) never deletes a file.
# - Lookup (TieringOffloadingManager.lookup): the CPU tier first; on its miss the disk tier, whose
#   answer is asynchronous (tiering/async_lookup.py, AsyncLookupManager.lookup / flush /
#   drain_results): a key with no verdict answers RETRY, its probe goes out at the end of the step
#   and its verdict is there from the next step on, held while a request that asked for it lives
#   (cleanup at the request's finalization).  A verdict is the file's presence: a write reported
#   later turns a held "absent" into "present" (mark_present).
# - Promotion (_initiate_promotion, _flush_pending_promotions): a disk hit takes a CPU chunk at
#   once (prepare_write = CPUOffloadingManager.prepare_store of the one key: the request's access,
#   LRU eviction, the chunk being written, so the lookup answers HIT_PENDING); no room answers MISS.
#   The step's promotions go out as one read job per request at the end of schedule(); when the
#   read is reported the chunks are ready (complete_write), and the request's next lookup hits
#   the CPU tier and loads from it: disk -> CPU -> GPU.
# - Polling (_maybe_process_finished_jobs, prepare_store, on_schedule_end): finished disk jobs are
#   taken at the first manager call of a schedule(); every later call of that schedule() happens
#   at the same instant of the replay, so one poll per step is the same.
# - While a disk job is in flight the engine keeps stepping (TieringOffloadingManager.has_pending_work).

cdef int32_t DISK_MISS = -1
cdef int32_t DISK_RETRY = -2
cdef int32_t DISK_MEMOS = 8  # kept lookup scans (ScanMemoC; a chunk's watch counts up to this)


cdef int disk_init(OffloadC* o, DiskConfC conf, int32_t slots) except -1 nogil:
    cdef DiskC* d = <DiskC*>mem_calloc(1, sizeof(DiskC))
    cdef int32_t i
    d.conf = conf
    d.map_mask = 1023
    d.map = <DiskEntC*>mem_calloc(d.map_mask + 1, sizeof(DiskEntC))
    d.jobs_cap = 16
    d.jobs = <DiskJobC*>mem_calloc(d.jobs_cap, sizeof(DiskJobC))
    d.gather = <int32_t*>mem_calloc(d.jobs_cap, sizeof(int32_t))
    d.looked_slots = slots if slots > 0 else 1
    d.looked = <flag_t*>mem_calloc(<size_t>d.looked_slots * o.chunk_row, sizeof(flag_t))
    d.step = -1
    d.self_evict_step = -1
    d.memos = <ScanMemoC*>mem_calloc(DISK_MEMOS, sizeof(ScanMemoC))
    for i in range(DISK_MEMOS):
        d.memos[i].chunks = <int32_t*>mem_calloc(o.chunk_row, sizeof(int32_t))
    o.disk = d
    return 0


cdef void disk_release(OffloadC* o) noexcept nogil:
    cdef DiskC* d = o.disk
    cdef int32_t i
    if d == NULL:
        return
    for i in range(d.jobs_cap):
        mem_free(d.jobs[i].keys)
    mem_free(d.jobs)
    mem_free(d.gather)
    mem_free(d.map)
    mem_free(d.looked)
    for i in range(DISK_MEMOS):
        mem_free(d.memos[i].chunks)
    mem_free(d.memos)
    mem_free(d)
    o.disk = NULL


# ------------------------------------------------------------------ the keys the tier knows

cdef DiskEntC* _disk_ent(DiskC* d, hash_t key) except NULL nogil:
    """The entry of ``key``, made when new (an entry is never removed: files are never deleted)."""
    cdef int64_t i, old, j
    cdef DiskEntC* m
    if 2 * (d.n_ent + 1) > d.map_mask + 1:
        old = d.map_mask + 1
        m = d.map
        d.map_mask = 2 * old - 1
        d.map = <DiskEntC*>mem_calloc(2 * old, sizeof(DiskEntC))
        for j in range(old):
            if m[j].used:
                i = <int64_t>(mix64(m[j].key) & <hash_t>d.map_mask)
                while d.map[i].used:
                    i = (i + 1) & d.map_mask
                d.map[i] = m[j]
        mem_free(m)
    i = <int64_t>(mix64(key) & <hash_t>d.map_mask)
    while d.map[i].used:
        if d.map[i].key == key:
            return &d.map[i]
        i = (i + 1) & d.map_mask
    d.map[i].used = 1
    d.map[i].key = key
    d.n_ent += 1
    return &d.map[i]


cdef int32_t _disk_new_job(DiskC* d, bint promote) except -1 nogil:
    cdef int32_t j, old
    for j in range(d.jobs_cap):
        if not d.jobs[j].active:
            break
    else:
        old = d.jobs_cap
        mem_grow(<void**>&d.jobs, old, 2 * old, sizeof(DiskJobC))
        mem_grow(<void**>&d.gather, old, 2 * old, sizeof(int32_t))
        d.jobs_cap = 2 * old
        j = old
    d.jobs[j].active = 1
    d.jobs[j].promote = promote
    d.jobs[j].owner = NULL
    d.jobs[j].n_keys = 0
    d.jobs[j].due = 0
    d.jobs[j].due_s = 0
    d.n_jobs += 1
    return j


cdef int _disk_job_key(DiskJobC* jb, hash_t key) except -1 nogil:
    if jb.n_keys == jb.keys_cap:
        mem_grow(<void**>&jb.keys, jb.keys_cap, 2 * jb.keys_cap if jb.keys_cap > 0 else 16, sizeof(hash_t))
        jb.keys_cap = 2 * jb.keys_cap if jb.keys_cap > 0 else 16
    jb.keys[jb.n_keys] = key
    jb.n_keys += 1
    return 0


# ------------------------------------------------------------------ polling

cdef int _disk_finish(OffloadC* o, int32_t j) except -1 nogil:
    """TieringOffloadingManager._process_finished_jobs for one job: a cascade unpins its CPU chunks
    (complete_read) and its keys are on disk (FileSystemTierManager.get_finished_jobs,
    mark_present); a promotion makes its chunks ready and evictable (_complete_promotion:
    complete_write, the CPU tier's complete_store)."""
    cdef DiskC* d = o.disk
    cdef DiskJobC* jb = &d.jobs[j]
    cdef DiskEntC* e
    cdef OffChunkC* ch
    cdef int32_t i, c
    for i in range(jb.n_keys):
        c = _off_find(o, jb.keys[i])
        if jb.promote:
            if c >= 0 and o.chunks[c].ref < 0:
                if o.chunks[c].watch:
                    _off_memo_drop(o)  # a kept scan found it being written (HIT_PENDING)
                o.chunks[c].ref = 0
                o.n_evictable += 1
                _off_mark_evictable(o.lru, c)
            continue
        if c >= 0:
            ch = &o.chunks[c]
            ch.ref -= 1
            if ch.ref == 0:
                o.n_evictable += 1
                _off_mark_evictable(o.lru, c)
        e = _disk_ent(d, jb.keys[i])
        e.writing = 0
        if not e.on_disk:
            e.on_disk = 1
            d.on_disk += 1
            if o.memo.on and disk_memo_missed(o, jb.keys[i]):
                _off_memo_drop(o)  # a kept scan stopped at its "absent" verdict
    jb.active = 0
    d.n_jobs -= 1
    return 0


cdef int disk_poll(OffloadC* o, step_t step, sec_t now) except -1 nogil:
    """The first manager call of the schedule() of ``step`` at ``now``: the disk jobs landed by then
    are taken (all of them, in submission order of each direction)."""
    cdef DiskC* d = o.disk
    cdef bint timed = o.conf.link_bps > 0
    cdef int32_t j
    if d.step == step:
        return 0
    d.step = step
    if d.n_jobs == 0:
        return 0
    for j in range(d.jobs_cap):
        if d.jobs[j].active and d.jobs[j].owner == NULL and (
                (timed and d.jobs[j].due_s <= now) or (not timed and d.jobs[j].due <= step)):
            _disk_finish(o, j)
    return 0


cdef sec_t disk_next_landing(const OffloadC* o, sec_t t) noexcept nogil:
    """``t`` (the next CPU transfer's landing, -1: none) or the next disk job's, whichever is first."""
    cdef const DiskC* d = o.disk
    cdef int32_t j
    if d == NULL or d.n_jobs == 0 or o.conf.link_bps <= 0:
        return t
    for j in range(d.jobs_cap):
        if d.jobs[j].active and d.jobs[j].owner == NULL and (t < 0 or d.jobs[j].due_s < t):
            t = d.jobs[j].due_s
    return t


# ------------------------------------------------------------------ lookup and promotion

cdef int _disk_looked_room(OffloadC* o, int32_t slots) except -1 nogil:
    cdef DiskC* d = o.disk
    cdef int32_t new = d.looked_slots
    if slots <= new:
        return 0
    while new < slots:
        new *= 2
    mem_grow(<void**>&d.looked, <size_t>d.looked_slots * o.chunk_row, <size_t>new * o.chunk_row, sizeof(flag_t))
    d.looked_slots = new
    return 0


cdef int32_t _disk_promote(SchedC* s, ReqC* r, int32_t i, hash_t key) except -3 nogil:
    """TieringOffloadingManager._initiate_promotion of the request's chunk ``i``: the CPU tier's
    prepare_store of the one key (the request's access recorded first, then LRU eviction of one
    chunk when the tier is full, the chunk inserted being written at the request's rank); the
    chunk, or DISK_MISS when nothing can be evicted.  The key joins the request's read job of
    this step (one job per request, flushed at the end of schedule())."""
    cdef OffloadC* o = s.off
    cdef DiskC* d = o.disk
    cdef int32_t c, k, j = -1
    cdef int32_t none = -1
    cdef OffChunkC* ch
    _off_access(s, r, i, i + 1, &none)
    if o.conf.cpu_chunks - o.n_used < 1:
        if o.n_evictable < 1 or _off_evict(o, 1) == 0:
            d.promote_failed += 1
            return DISK_MISS
        # The chunk just evicted (o.scratch[0]) was ranked under this request: one of its own
        # hits, older than any finished request's chunk, goes first (LRUCachePolicy.evict
        # protects only the promoted key).  Once in a while this is harmless; every step with
        # nothing running, each promotion evicts a hit the last step read back and the
        # request's lookup never ends, in vLLM too (the stall error names it: _stall_reason).
        if o.chunks[o.scratch[0]].rank_hi == r.off_rank:
            d.self_evict_step = d.step
    o.n_free_chunks -= 1
    c = o.free_chunks[o.n_free_chunks]
    ch = &o.chunks[c]
    ch.key = key
    ch.ref = -1
    ch.watch = 0
    ch.used = 1
    o.lru[c].mapped = 1
    o.lru[c].evictable = 0
    ch.loading = 0
    o.lru[c].mark = 0
    ch.rank_hi = _off_req_rank(o, r)
    ch.rank_lo = -(<int64_t>i + 1) * o.conf.tokens_per_chunk
    _lru_place(o, c, r.off_node)
    _off_map_put(o, key, c)
    o.n_used += 1
    for k in range(d.n_gather):
        if d.jobs[d.gather[k]].owner == <void*>r:
            j = d.gather[k]
            break
    if j < 0:
        j = _disk_new_job(d, True)
        d.jobs[j].owner = <void*>r
        d.gather[d.n_gather] = j
        d.n_gather += 1
    _disk_job_key(&d.jobs[j], key)
    d.promoted_chunks += 1
    d.st_read += 1
    r.off_disk_read += 1
    return c


cdef int32_t disk_lookup(SchedC* s, ReqC* r, int32_t i) except -3 nogil:
    """The disk tier's answer for the request's chunk ``i``, missing from the CPU tier
    (TieringOffloadingManager.lookup past the primary tier; FileSystemTierManager.lookup with
    AsyncLookupManager.lookup): DISK_RETRY while its verdict is not known (a new probe is known
    from the next step on), DISK_MISS when it is not on disk or the CPU tier has no room, else
    the CPU chunk its promotion took (being written: HIT_PENDING)."""
    cdef OffloadC* o = s.off
    cdef DiskC* d = o.disk
    cdef hash_t key = _off_key(s, r, i)
    cdef DiskEntC* e = _disk_ent(d, key)
    cdef flag_t* looked
    _disk_looked_room(o, s.kv.cap_slots)
    looked = d.looked + <int64_t>r.slot * o.chunk_row
    d.queries += 1
    d.st_queries += 1
    if e.refs == 0:
        e.ready = d.step + 1  # a new LookupState: its probe goes out with this step's flush
    if not looked[i]:
        looked[i] = 1
        e.refs += 1
    if d.step < e.ready:
        d.retries += 1
        return DISK_RETRY
    if not e.on_disk:
        return DISK_MISS
    d.hits += 1
    d.st_hits += 1
    return _disk_promote(s, r, i, key)


# Off only in tests: every lookup with a disk tier scans anew, the reference the kept scan must
# match (tests/test_offload_disk_memo.py).
cdef bint _disk_memo_on = True


def _set_offload_disk_memo(bint on):
    """Tests only: whether a lookup with a disk tier may answer from the last lookup's scan (the
    results are byte-identical either way).  Returns the previous setting."""
    global _disk_memo_on
    old = _disk_memo_on
    _disk_memo_on = on
    return old


cdef int disk_scan(SchedC* s, ReqC* r, int32_t start, int32_t end) except -1 nogil:
    """_maximal_prefix_lookup from chunk ``start`` to ``end`` through TieringOffloadingManager.lookup
    (the CPU tier, then the disk tier on its miss), into the ScanMemoC ``d.memo_cur`` (hits counted
    past a RETRY too: the lookup is deferred anyway).  A CPU miss asks the disk tier (disk_lookup):
    RETRY defers without a hit and the scan goes on; a disk hit's promotion is a chunk being
    written; MISS stops the scan.

    The scan is kept (DiskC.memos: one a request, the oldest replaced past DISK_MEMOS) when its
    every chunk was a CPU hit up to ``end`` or up to one key whose held verdict is "absent": asking
    again then changes nothing but the disk tier's query counters, which are replayed.  In vLLM a primary HIT or HIT_PENDING returns before the secondary
    tiers are asked (v1/kv_offload/tiering/manager.py, TieringOffloadingManager.lookup); a held
    verdict is returned as is, the request already among its holders (tiering/async_lookup.py,
    AsyncLookupManager.lookup: request_ids is a set), and "absent" without a promotion changes no
    tier (tiering/fs/manager.py, FileSystemTierManager.lookup).  The verdict turns "present" only
    when a write of the key is reported (mark_present: _disk_finish drops the scan), and the request
    holds it until its finalization (AsyncLookupManager.cleanup).  A scan that met a RETRY, a
    promotion or a promotion without room (its eviction and access record) is not kept."""
    cdef OffloadC* o = s.off
    cdef DiskC* d = o.disk
    cdef req_t ri = <req_t>(r - s.reqs)
    cdef int32_t i, c, m = -1, free_m = -1
    cdef int64_t failed
    cdef bint keep = _disk_memo_on
    cdef hash_t key
    cdef ScanMemoC* mm
    for i in range(DISK_MEMOS):
        mm = &d.memos[i]
        if not mm.on:
            if free_m < 0:
                free_m = i
        elif memo_of(mm, ri, r):
            m = i
            break
    if m >= 0 and keep and d.memos[m].start == start and d.memos[m].end == end:
        d.memo_cur = m
        if d.memos[m].missed:
            d.queries += 1  # the stop's query, answered "absent" again
            d.st_queries += 1
        return 0
    if m < 0:
        m = free_m
    if m < 0:
        m = d.memo_next
        d.memo_next = (m + 1) % DISK_MEMOS
    _disk_memo_clear(o, m)
    d.memo_cur = m
    mm = &d.memos[m]
    memo_begin(mm, ri, r, start, end)
    for i in range(start, tmin(start + OFF_AHEAD, end)):
        _off_prefetch(o, _off_key(s, r, i))
    c = -1
    for i in range(start, end):
        if i + OFF_AHEAD < end:
            _off_prefetch(o, _off_key(s, r, i + OFF_AHEAD))
        key = _off_key(s, r, i)
        c = _off_find_next(o, c, key)
        if c < 0:
            failed = d.promote_failed
            c = disk_lookup(s, r, i)
            if c == DISK_RETRY:
                mm.pending = 1
                keep = False
                continue
            if c < 0:
                if d.promote_failed != failed:
                    keep = False
                mm.missed = 1
                mm.miss = key
                break
            keep = False  # a promotion
        mm.chunks[mm.hits] = c
        mm.hits += 1
        if o.chunks[c].ref < 0:
            mm.pending = 1
        if o.chunks[c].loading:
            mm.loading = 1
    if keep:
        for i in range(mm.hits):
            o.chunks[mm.chunks[i]].watch += 1
        mm.on = 1
        o.memo.on = 1
    return 0


cdef void _disk_memo_clear(OffloadC* o, int32_t m) noexcept nogil:
    """Kept scan ``m`` is forgotten (its chunks watched by one scan fewer)."""
    cdef ScanMemoC* mm = &o.disk.memos[m]
    cdef int32_t i
    if not mm.on:
        return
    for i in range(mm.hits):
        o.chunks[mm.chunks[i]].watch -= 1
    mm.on = 0


cdef void disk_memo_drop(OffloadC* o) noexcept nogil:
    """_off_memo_drop with a disk tier: every kept scan is forgotten."""
    cdef int32_t m
    for m in range(DISK_MEMOS):
        _disk_memo_clear(o, m)


cdef bint disk_memo_missed(const OffloadC* o, hash_t key) noexcept nogil:
    """Whether a kept scan stopped at ``key`` (its held verdict "absent")."""
    cdef int32_t m
    for m in range(DISK_MEMOS):
        if o.disk.memos[m].on and o.disk.memos[m].missed and o.disk.memos[m].miss == key:
            return True
    return False


cdef int disk_forget(SchedC* s, ReqC* r) except -1 nogil:
    """AsyncLookupManager.cleanup at the request's finalization (on_request_finished once its
    stores are reported): the verdicts it held are dropped when no other request holds them."""
    cdef OffloadC* o = s.off
    cdef DiskC* d = o.disk
    cdef flag_t* looked
    cdef int32_t i
    cdef int32_t n = <int32_t>tmin(o.chunk_row, num_tokens(r) // o.conf.tokens_per_chunk + 1)
    for i in range(DISK_MEMOS):
        if d.memos[i].on and d.memos[i].req == <req_t>(r - s.reqs) and d.memos[i].slot == r.slot:
            _disk_memo_clear(o, i)  # its kept scan is never asked for again
    if r.slot < 0 or r.slot >= d.looked_slots:
        return 0
    looked = d.looked + <int64_t>r.slot * o.chunk_row
    for i in range(n):
        if looked[i]:
            looked[i] = 0
            _disk_ent(d, _off_key(s, r, i)).refs -= 1
    return 0


cdef int disk_flush(OffloadC* o, step_t step, sec_t now) except -1 nogil:
    """TieringOffloadingManager.on_schedule_end: this step's promotions go out, one read job per
    request in the order of their first promotion (_flush_pending_promotions)."""
    cdef DiskC* d = o.disk
    cdef DiskJobC* jb
    cdef int32_t k
    cdef sec_t t0
    for k in range(d.n_gather):
        jb = &d.jobs[d.gather[k]]
        jb.owner = NULL
        jb.due = step + d.conf.read_delay
        if o.conf.link_bps > 0:
            t0 = now if now > d.read_free_s else d.read_free_s
            d.read_free_s = t0 + jb.n_keys * o.conf.chunk_bytes / d.conf.read_bps
            jb.due_s = d.read_free_s
        d.promotions += 1
    d.n_gather = 0
    return 0


# ------------------------------------------------------------------ cascade

cdef int disk_cascade(OffloadC* o, const OffJobC* sj) except -1 nogil:
    """TieringOffloadingManager.complete_store after the CPU tier's: every chunk of the reported
    store job ``sj`` is pinned (create_store_job, prepare_read) and written to disk by one job
    (FileSystemTierManager.submit_store), taking the write side of the disk from the output's
    time; chunks on disk or being written cost no bytes (_store_block skips an existing file)."""
    cdef DiskC* d = o.disk
    cdef int32_t j = _disk_new_job(d, False)
    cdef DiskJobC* jb = &d.jobs[j]
    cdef int32_t i, c, n_write = 0
    cdef DiskEntC* e
    cdef OffChunkC* ch
    cdef sec_t t0
    for i in range(sj.n_keys):
        c = _off_find(o, sj.keys[i])
        if c < 0:
            continue
        ch = &o.chunks[c]
        if ch.ref == 0:
            o.lru[c].evictable = 0  # mark_non_evictable
            o.n_evictable -= 1
        ch.ref += 1
        _disk_job_key(jb, sj.keys[i])
        e = _disk_ent(d, sj.keys[i])
        if not e.on_disk and not e.writing:
            e.writing = 1
            n_write += 1
    jb.due = d.out_step + d.conf.write_delay
    jb.due_s = d.out_s
    if o.conf.link_bps > 0 and n_write > 0:
        t0 = d.out_s if d.out_s > d.write_free_s else d.write_free_s
        d.write_free_s = t0 + n_write * o.conf.chunk_bytes / d.conf.write_bps
        jb.due_s = d.write_free_s
    d.cascades += 1
    d.cascade_chunks += jb.n_keys
    d.written_chunks += n_write
    d.st_written += n_write
    return 0
