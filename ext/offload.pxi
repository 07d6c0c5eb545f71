# Included by scheduler.pyx: KV offload behind the GPU cache (structs: ext/offload.pxd).
#
# The scheduler side of vLLM 0.34.0's OffloadingConnector with its CPU tier, one full-attention
# group: lookups at admission, asynchronous loads (the request waits in WAITING_FOR_REMOTE_KVS
# holding its blocks), stores issued at the end of every schedule(), LRU eviction in vLLM's order,
# and the worker's transfers on the step clock (a load issued in step N is reported by the output
# of step N + load_delay, a store by N + store_delay, a flushed job by the step that flushed it;
# stores then loads polled in submission order, stopping at the first unfinished one).
# Files below are relative to the vllm package.

cdef enum:
    OFF_EMPTY = -1               # an empty bucket of the key map
    OFF_AHEAD = 24               # probes fetched this far ahead of a run of them (a memory round trip)
    OFF_NEAR = 12                # what a fetched-ahead entry names, fetched this far ahead


cdef inline void _off_fetch_chunk(const OffChunkC* chunks, const OffLinkC* links, int32_t c) noexcept nogil:
    # Chunk ``c``'s state and its node in the LRU list, fetched ahead (the tier's arrays passed in
    # the caller's locals: a flag written through them may alias any field of the tier).
    __builtin_prefetch(&chunks[c])
    __builtin_prefetch(&links[c])


# ------------------------------------------------------------------ set-up

cdef int off_init(OffloadC* o, OffConfC conf, int32_t chunk_row, int32_t slots, int32_t jobs) except -1 nogil:
    """An empty CPU tier of ``conf.cpu_chunks`` chunks; ``chunk_row`` chunks a request can have,
    ``slots`` KV rows and ``jobs`` job slots to start with (all grown on demand)."""
    cdef int64_t m = 1
    cdef int64_t i
    cdef OffMapE empty
    memset(o, 0, sizeof(OffloadC))
    o.conf = conf
    o.chunks = <OffChunkC*>mem_calloc(conf.cpu_chunks, sizeof(OffChunkC))
    # The free stack and the key map are written whole here, once (not zeroed first).
    mem_resize(<void**>&o.free_chunks, conf.cpu_chunks if conf.cpu_chunks > 0 else 1, sizeof(int32_t))
    for i in range(conf.cpu_chunks):
        o.free_chunks[i] = <int32_t>(conf.cpu_chunks - 1 - i)
    o.n_free_chunks = conf.cpu_chunks
    while m < 2 * (<int64_t>conf.cpu_chunks):
        m *= 2  # at most half full
    o.map_mask = m - 1
    mem_resize(<void**>&o.map, m, sizeof(OffMapE))
    empty.tag = 0
    empty.chunk = OFF_EMPTY
    for i in range(m):
        o.map[i] = empty
    o.anchor_cap = 16
    o.lru = <OffLinkC*>mem_calloc(conf.cpu_chunks + 1 + o.anchor_cap, sizeof(OffLinkC))
    o.lru[conf.cpu_chunks].prev = conf.cpu_chunks
    o.lru[conf.cpu_chunks].next = conf.cpu_chunks
    o.free_anchors = <int32_t*>mem_calloc(o.anchor_cap, sizeof(int32_t))
    for i in range(o.anchor_cap):
        o.free_anchors[i] = conf.cpu_chunks + o.anchor_cap - i
    o.n_free_anchors = o.anchor_cap
    # An eviction's selection, written before it is read (_off_evict): not zeroed.
    mem_resize(<void**>&o.scratch, conf.cpu_chunks if conf.cpu_chunks > 0 else 1, sizeof(int32_t))
    o.chunk_row = chunk_row if chunk_row > 0 else 1
    o.seen_slots = slots if slots > 0 else 1
    o.seen = <flag_t*>mem_calloc(<size_t>o.seen_slots * o.chunk_row, sizeof(flag_t))
    # Not zeroed (_off_seen_room): a hint is checked against the chunk it names before it is
    # believed, and a request's dense ids are written at the connector's first sight of it
    # (_off_priv_from) before any is read.
    mem_resize(<void**>&o.hint, <size_t>o.seen_slots * o.chunk_row, sizeof(int32_t))
    mem_resize(<void**>&o.dense_id, <size_t>o.seen_slots * o.chunk_row, sizeof(int32_t))
    o.found = <int32_t*>mem_calloc(o.chunk_row, sizeof(int32_t))
    o.mixes = <hash_t*>mem_calloc(o.chunk_row, sizeof(hash_t))
    o.memo.chunks = <int32_t*>mem_calloc(o.chunk_row, sizeof(int32_t))
    o.parked_cap = 16
    o.parked = <req_t*>mem_calloc(o.parked_cap, sizeof(req_t))
    o.recs_cap = 64
    o.recs = <OffRecC*>mem_calloc(o.recs_cap, sizeof(OffRecC))
    _off_grow_jobs(o, jobs if jobs > 4 else 4)
    return 0


cdef void off_release(OffloadC* o) noexcept nogil:
    cdef int32_t i
    if o.jobs != NULL:
        for i in range(o.jobs_cap):
            mem_free(o.jobs[i].keys)
            mem_free(o.jobs[i].cids)
            mem_free(o.jobs[i].blocks)
    mem_free(o.alloc_mark)
    mem_free(o.jobs)
    mem_free(o.free_jobs)
    mem_free(o.store_q)
    mem_free(o.load_q)
    mem_free(o.deferred)
    mem_free(o.step_loads)
    mem_free(o.step_stores)
    mem_free(o.chunks)
    mem_free(o.free_chunks)
    mem_free(o.map)
    mem_free(o.found)
    mem_free(o.mixes)
    mem_free(o.memo.chunks)
    mem_free(o.lru)
    mem_free(o.free_anchors)
    mem_free(o.scratch)
    mem_free(o.seen)
    mem_free(o.hint)
    mem_free(o.dense_id)
    mem_free(o.dense)
    mem_free(o.parked)
    mem_free(o.recs)
    disk_release(o)
    memset(o, 0, sizeof(OffloadC))


cdef int _off_grow_jobs(OffloadC* o, int32_t new) except -1 nogil:
    """Job slots (and the rings over them) grown to ``new``; the rings are unrolled."""
    cdef int32_t old = o.jobs_cap
    cdef int32_t i
    cdef int32_t* q
    mem_grow(<void**>&o.jobs, old, new, sizeof(OffJobC))
    mem_grow(<void**>&o.free_jobs, old, new, sizeof(int32_t))
    for i in range(new - 1, old - 1, -1):
        o.free_jobs[o.n_free_jobs] = i
        o.n_free_jobs += 1
    q = <int32_t*>mem_calloc(new, sizeof(int32_t))
    for i in range(o.sq_n):
        q[i] = o.store_q[(o.sq_head + i) % old]
    mem_free(o.store_q)
    o.store_q = q
    o.sq_head = 0
    q = <int32_t*>mem_calloc(new, sizeof(int32_t))
    for i in range(o.lq_n):
        q[i] = o.load_q[(o.lq_head + i) % old]
    mem_free(o.load_q)
    o.load_q = q
    o.lq_head = 0
    mem_grow(<void**>&o.deferred, old, new, sizeof(int32_t))
    mem_grow(<void**>&o.step_loads, old, new, sizeof(int32_t))
    mem_grow(<void**>&o.step_stores, old, new, sizeof(int32_t))
    o.jobs_cap = new
    return 0


cdef int _off_seen_room(OffloadC* o, int32_t slots) except -1 nogil:
    # The seen rows follow the KV rows (kvcache grows them geometrically); only the seen flags
    # start zeroed: the hint and dense-id rows are written before they are read (off_init).
    cdef int32_t new = o.seen_slots
    if slots <= new:
        return 0
    while new < slots:
        new *= 2
    mem_grow(<void**>&o.seen, <size_t>o.seen_slots * o.chunk_row, <size_t>new * o.chunk_row, sizeof(flag_t))
    mem_resize(<void**>&o.hint, <size_t>new * o.chunk_row, sizeof(int32_t))
    mem_resize(<void**>&o.dense_id, <size_t>new * o.chunk_row, sizeof(int32_t))
    o.seen_slots = new
    return 0


cdef int _off_rec(OffloadC* o, int32_t kind, req_t req, int64_t id, int64_t a, int64_t b) except -1 nogil:
    if o.n_recs == o.recs_cap:
        mem_grow(<void**>&o.recs, o.recs_cap, 2 * o.recs_cap, sizeof(OffRecC))
        o.recs_cap *= 2
    o.recs[o.n_recs].kind = kind
    o.recs[o.n_recs].req = req
    o.recs[o.n_recs].id = id
    o.recs[o.n_recs].a = a
    o.recs[o.n_recs].b = b
    o.n_recs += 1
    return 0


# ------------------------------------------------------------------ keys of a request

cdef inline int32_t _off_n_keys(SchedC* s, ReqC* r) noexcept nogil:
    """RequestOffloadState.update_offload_keys: one key per chunk of the request's known tokens
    (the block hash of the chunk's last hash block), every full hash block hashed first."""
    cdef tok_t h = s.kv.hash_block_size
    hash_extend(s.kv, r, <int32_t>(num_tokens(r) // h))
    return <int32_t>(num_tokens(r) // h // s.off.conf.hashes_per_chunk)


cdef inline hash_t _off_key(const SchedC* s, const ReqC* r, int32_t i) noexcept nogil:
    # make_offload_key(block_hashes[hashes_per_chunk * (i + 1) - 1], group 0)
    return s.kv.hashes[<int64_t>r.slot * s.kv.hash_row + (<int64_t>i + 1) * s.off.conf.hashes_per_chunk - 1]


# ------------------------------------------------------------------ the connector's lookup

cdef tok_t off_lookup(SchedC* s, ReqC* r, tok_t local) except -2 nogil:
    """OffloadingConnectorScheduler.get_num_new_matched_tokens (offloading/scheduler.py) with
    _lookup_complete_chunks for one full-attention group: the tokens the CPU tier offers past the
    local hit ``local`` (whole chunks, consecutive from the chunk where the local hit ends, up to
    the request's keyed tokens), 0 for less than a chunk, -1 (None: ask again next step) when a
    hit chunk is still being stored or being loaded by another request, or the request has
    transfers of its own in flight."""
    cdef OffloadC* o = s.off
    cdef tok_t tpc = o.conf.tokens_per_chunk
    cdef tok_t max_hit, new
    cdef int32_t n_keys, start, end, hits
    cdef bint pending, loading
    o.lookups += 1
    r.off_next = 0  # restarting at token 0: every chunk is offered again
    if r.off_jobs > 0:
        o.lookups_deferred += 1
        return -1
    r.off_local = local
    _off_seen_room(o, s.kv.cap_slots)
    _off_dense_room(s)
    n_keys = _off_n_keys(s, r)
    max_hit = tmin(num_tokens(r), <tok_t>n_keys * tpc)
    if max_hit - local < tpc:
        return 0
    end = <int32_t>tmin(cdiv(max_hit, tpc), n_keys)
    start = <int32_t>(local // tpc)
    if o.disk == NULL:
        # _maximal_prefix_lookup over the CPU tier alone (_off_scan: kept while nothing it read
        # changed).
        _off_scan(s, r, start, end)
    else:
        # ... and the disk tier behind it (disk_scan: kept while asking again changes no tier).
        disk_scan(s, r, start, end)
    if o.disk == NULL:
        hits = o.memo.hits
        pending = o.memo.pending
        loading = o.memo.loading
    else:
        hits = o.disk.memos[o.disk.memo_cur].hits
        pending = o.disk.memos[o.disk.memo_cur].pending
        loading = o.disk.memos[o.disk.memo_cur].loading
    if pending:
        o.lookups_deferred += 1
        return -1
    if hits == 0:
        return 0
    max_hit = tmin(max_hit, tpc * (start + hits))
    new = max_hit - local
    if new < tpc:
        return 0
    # A hit chunk another request is loading right now delays this one.  The chunks up to
    # cdiv(local + new, tpc) are exactly the hit ones (end <= cdiv(max_hit, tpc)): the scan above
    # saw them all.
    if loading:
        o.lookups_deferred += 1
        return -1
    o.lookups_hit += 1
    return new


cdef int _off_new_job(OffloadC* o, ReqC* r, req_t ri, bint store) except -1 nogil:
    """A job slot for a new job of request ``ri`` (its id from the shared counter)."""
    cdef int32_t j
    if o.n_free_jobs == 0:
        _off_grow_jobs(o, 2 * o.jobs_cap)
    o.n_free_jobs -= 1
    j = o.free_jobs[o.n_free_jobs]
    o.jobs[j].id = o.next_job
    o.next_job += 1
    o.jobs[j].req = ri
    o.jobs[j].store = store
    o.jobs[j].flushed = 0
    o.jobs[j].issued = o.cur_step
    o.jobs[j].due = (<step_t>1) << 62  # set when its step's output is processed (or a flush)
    o.jobs[j].due_s = -1
    o.jobs[j].active = 1
    o.jobs[j].n_keys = 0
    o.jobs[j].n_blocks = 0
    o.jobs[j].fenced = 0
    o.jobs[j].listed = -1
    o.n_jobs += 1
    r.off_jobs += 1
    return j


cdef inline int _off_job_key(OffloadC* o, int32_t j, hash_t key, int32_t c) except -1 nogil:
    cdef OffJobC* jb = &o.jobs[j]
    if jb.n_keys == jb.keys_cap:
        _off_job_keys_grow(jb)
    jb.keys[jb.n_keys] = key
    jb.cids[jb.n_keys] = c
    jb.n_keys += 1
    return 0


cdef int _off_job_room(OffJobC* jb, int32_t n_keys, int32_t bpc) except -1 nogil:
    """Room in store job ``jb`` for ``n_keys`` more keys (and chunks) and their ``bpc`` GPU blocks
    each."""
    cdef int32_t new
    while jb.n_keys + n_keys > jb.keys_cap:
        _off_job_keys_grow(jb)
    if jb.n_blocks + n_keys * bpc > jb.blocks_cap:
        new = jb.blocks_cap * 2 if jb.blocks_cap > 0 else 16
        while new < jb.n_blocks + n_keys * bpc:
            new *= 2
        mem_grow(<void**>&jb.blocks, jb.blocks_cap, new, sizeof(block_id_t))
        jb.blocks_cap = new
    return 0


cdef int _off_job_keys_grow(OffJobC* jb) except -1 nogil:
    # _off_job_key's rare growth, out of its inlined path.
    cdef int32_t new = 2 * jb.keys_cap if jb.keys_cap > 0 else 16
    mem_grow(<void**>&jb.keys, jb.keys_cap, new, sizeof(hash_t))
    mem_grow(<void**>&jb.cids, jb.keys_cap, new, sizeof(int32_t))
    jb.keys_cap = new
    return 0


cdef int off_load(SchedC* s, ReqC* r, req_t ri, tok_t ext, step_t step) except -1 nogil:
    """OffloadingConnectorScheduler.update_state_after_alloc with ``ext`` external tokens: the
    chunks from the block where the local hit ends to ``local + ext`` are pinned
    (CPUOffloadingManager.prepare_load) and read by one load job; with the chunk-level policy the
    request's stores restart after them."""
    cdef OffloadC* o = s.off
    cdef tok_t tpc = o.conf.tokens_per_chunk
    cdef tok_t cached = r.off_local + ext
    cdef int32_t start = <int32_t>(r.off_local // s.kv.sched_block_size * s.kv.sched_block_size // tpc)
    cdef int32_t end = <int32_t>cdiv(cached, tpc)
    cdef int32_t i, c, j
    cdef OffChunkC* ch
    j = _off_new_job(o, r, ri, False)
    for i in range(start, end):
        c = _off_hinted(s, r, i)
        ch = &o.chunks[c]
        if ch.watch:
            _off_memo_drop(o)
        if ch.ref == 0:
            o.lru[c].evictable = 0  # mark_non_evictable
            o.n_evictable -= 1
        ch.ref += 1
        ch.loading = 1
        _off_job_key(o, j, ch.key, c)
    _off_access(s, r, start, end, NULL)
    r.off_next = end
    o.step_loads[o.n_step_loads] = j
    o.n_step_loads += 1
    o.loads += 1
    o.load_tokens += ext
    o.load_chunks += end - start
    r.off_n_loads += 1
    r.off_loaded += ext
    _off_rec(o, OR_LOAD, ri, o.jobs[j].id, ext, end - start)
    return 0


# ------------------------------------------------------------------ stores (build_connector_meta)

cdef inline bint _off_store_due(const SchedC* s, const ReqC* r, tok_t after, int32_t n_blocks) noexcept nogil:
    """Whether _off_store has a chunk to offer: its computed tokens ``after`` (clamped as there)
    and its ``n_blocks`` blocks both reach past chunk next_stored_chunk_idx (most calls: decodes
    do not; checked without a division)."""
    cdef tok_t need = (<tok_t>r.off_next + 1) * s.off.conf.tokens_per_chunk
    cdef tok_t offloadable = tmin(after, num_tokens(r))
    if s.off.conf.prompt_only:
        offloadable = tmin(offloadable, r.prompt_len)
    return offloadable >= need and <tok_t>n_blocks * s.kv.sched_block_size >= need


cdef int64_t off_quiet_bound(const SchedC* s, const ReqC* r) noexcept nogil:
    """Quiet steps (the engine's macro-steps) running request ``r`` can take from the step about to
    be scheduled before _off_store_due may hold for it (1 << 62: never).  In each quiet step it is
    scheduled one decode token: at step k its offloadable tokens are min(num_computed + 1,
    num_tokens) + k (synchronous: num_computed + 1 == num_tokens; asynchronous: num_computed ==
    num_tokens, its placeholder in flight), clamped to its prompt with offload_prompt_only
    (distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py, _build_store_jobs and
    _calc_num_offloadable_tokens: a decoding request past its prompt never stores then).  Its block
    table always covers num_computed + 1 tokens, so the table's reach is not what holds a store
    back; ignoring it can only end a stretch early."""
    cdef tok_t need = (<tok_t>r.off_next + 1) * s.off.conf.tokens_per_chunk
    cdef tok_t base = tmin(r.num_computed + 1, num_tokens(r))
    if s.off.conf.prompt_only and r.prompt_len < need:
        return <int64_t>1 << 62
    return need - base if need > base else 0


cdef int off_stamp_one(SchedC* s, ReqC* r, step_t step) except -1 nogil:
    """off_stamp_allocated for one running request scheduled in ``step``: its blocks past its last
    schedule() stamped (a quiet step's only requests whose table grows are the ones whose decode
    takes a block)."""
    cdef OffloadC* o = s.off
    cdef int32_t x, n = _off_table_len(s.kv, 0, r)
    cdef const block_id_t* row
    if r.off_tlen >= n:
        return 0
    if o.alloc_n < s.kv.pool.num_blocks:
        mem_grow(<void**>&o.alloc_mark, o.alloc_n, s.kv.pool.num_blocks, sizeof(int64_t))
        o.alloc_n = s.kv.pool.num_blocks
    row = kv_table(s.kv, 0, r.slot)
    for x in range(r.off_tlen, n):
        if row[x] != 0:
            o.alloc_mark[row[x]] = step + 1
    r.off_tlen = n
    return 0


cdef int _off_store(SchedC* s, ReqC* r, req_t ri, tok_t after, int32_t n_blocks) except -1 nogil:
    """OffloadingConnectorScheduler._build_store_jobs for one request: the chunks newly covered by
    its computed tokens ``after`` this step (its prompt only, with offload_prompt_only), from
    next_stored_chunk_idx on, are offered to CPUOffloadingManager.prepare_store.  Chunks already in
    the tier are not written again; new ones evict unpinned chunks when the tier is full; when not
    enough can be evicted the store is dropped and offered again next step."""
    cdef OffloadC* o = s.off
    cdef tok_t tpc = o.conf.tokens_per_chunk
    cdef tok_t offloadable = tmin(after, num_tokens(r))
    cdef int32_t n_chunks, start, n, m, k, c, x, n_new = 0, n_evict
    cdef int32_t priv, hpc = o.conf.hashes_per_chunk
    cdef const hash_t* keys
    cdef hash_t* mixes = o.mixes
    cdef int32_t* found = o.found
    cdef flag_t* seen
    cdef const int32_t* drow
    cdef const int32_t* dense
    cdef int64_t rank = 0
    if o.conf.prompt_only:
        offloadable = tmin(offloadable, r.prompt_len)
    n_chunks = <int32_t>(offloadable // tpc)
    n_chunks = <int32_t>tmin(n_chunks, n_blocks * s.kv.sched_block_size // tpc)
    start = r.off_next
    if n_chunks <= start:
        return 0  # nothing new (most calls: decodes), without hashing
    n_chunks = <int32_t>tmin(n_chunks, _off_n_keys(s, r))
    if n_chunks <= start:
        return 0
    n = n_chunks - start
    # The key of chunk start + k is keys[k * hpc] (_off_key; the row hashed by _off_n_keys above),
    # the first m of them asked of the dense key array by their dense ids (drow) or else of the key
    # map, each mixed once (the rest private: _off_priv_from).
    keys = s.kv.hashes + <int64_t>r.slot * s.kv.hash_row + (<int64_t>start + 1) * hpc - 1
    _off_dense_room(s)
    priv = _off_priv_from(s, r)
    m = <int32_t>tmax(0, tmin(n, <int64_t>priv - start))
    seen = o.seen + <int64_t>r.slot * o.chunk_row + start
    drow = o.dense_id + <int64_t>r.slot * o.chunk_row + start
    dense = o.dense
    # prepare_store: new keys, and the seen record of new and stored ones (not of chunks another
    # request is still storing): _record_request_cache_access (_off_access) chunk by chunk as each
    # is looked up (a lookup reads no rank, no list link, no other position's seen record or hint:
    # all the access writes).
    # A position with a dense id has its entry fetched OFF_AHEAD positions on, and the chunk that
    # entry names (read by its access) OFF_NEAR positions on.
    for k in range(tmin(OFF_AHEAD, m)):
        _off_offer_ahead(o, keys, drow, dense, mixes, hpc, k)
    c = -1
    for k in range(n):
        if k + OFF_AHEAD < m:
            _off_offer_ahead(o, keys, drow, dense, mixes, hpc, k + OFF_AHEAD)
        if k + OFF_NEAR < m and drow[k + OFF_NEAR] >= 0:
            x = _off_dense_chunk(o, drow[k + OFF_NEAR])
            if x >= 0:
                _off_fetch_chunk(o.chunks, o.lru, x)
        if k >= m:
            c = _off_own(o, r, start + k, keys[<int64_t>k * hpc])
        elif drow[k] >= 0:
            c = _off_dense_chunk(o, drow[k])
        else:
            c = _off_find_next_mixed(o, c, keys[<int64_t>k * hpc], mixes[k])
        found[k] = c
        if c < 0:
            n_new += 1
        if not seen[k] and (c < 0 or o.chunks[c].ref >= 0):
            _off_access_at(o, r, start + k, c, &rank)
    if n_new == 0:
        r.off_next = n_chunks
        return 0
    n_evict = n_new - (o.conf.cpu_chunks - o.n_used)
    if n_evict > 0:
        if n_evict > o.n_evictable:
            return 0
        # The keys offered are protected from this eviction (the ones in the tier: none when all
        # are new).  (Eviction takes none of them, so ``found`` stays true.)
        if n_new < n:
            _off_mark_found(o, n, 1)
        c = _off_evict(o, n_evict)
        if n_new < n:
            _off_mark_found(o, n, 0)
        if c == 0:
            return 0
    _off_store_new(s, r, ri, start, n, m, n_new)
    r.off_next = n_chunks
    return 0


cdef inline void _off_offer_ahead(const OffloadC* o, const hash_t* keys, const int32_t* drow,
                                  const int32_t* dense, hash_t* mixes, int32_t hpc, int32_t k) noexcept nogil:
    # What _off_store's lookup of offered position ``k`` reads, fetched ahead: the entry of its
    # dense id, or else its key's bucket (the key mixed once, into ``mixes[k]``).
    if drow[k] < 0:
        mixes[k] = mix64(keys[<int64_t>k * hpc])
        _off_prefetch_mixed(o, mixes[k])
    elif dense != NULL:
        __builtin_prefetch(&dense[drow[k]])


cdef inline void _off_mark_found(OffloadC* o, int32_t n, flag_t mark) noexcept nogil:
    # The chunks in ``found[:n]`` (the ones in the tier) marked for an eviction.
    cdef int32_t k
    for k in range(n):
        if o.found[k] >= 0:
            o.lru[o.found[k]].mark = mark


cdef int _off_store_new(SchedC* s, ReqC* r, req_t ri, int32_t start, int32_t n, int32_t m,
                        int32_t n_new) except -1 nogil:
    """The end of prepare_store for _off_store's ``n`` chunks from ``start`` (``found``: -1 for the
    ``n_new`` new ones; ``mixes``: the first ``m`` keys' mixes, the rest private): each new key takes
    a free chunk, being stored, at the request's rank, and joins one store job with its GPU blocks (a
    finished request's table keeps them until its KV row goes back: _off_forget).  Done in passes
    over the new chunks: their state, the key map, the LRU list, the kept scans (the map and the
    scans read no rank or link, the list no map entry: the order of the passes changes nothing)."""
    global _off_runs_split, _off_dense_stored
    cdef OffloadC* o = s.off
    cdef tok_t tpc = o.conf.tokens_per_chunk
    cdef int32_t hpc = o.conf.hashes_per_chunk
    cdef int32_t bpc = <int32_t>(tpc // s.kv.groups[0].spec.block_size)
    cdef const hash_t* keys = s.kv.hashes + <int64_t>r.slot * s.kv.hash_row + (<int64_t>start + 1) * hpc - 1
    cdef const block_id_t* row = kv_table(s.kv, 0, r.slot) + <int64_t>start * bpc
    cdef const int32_t* found = o.found
    cdef const hash_t* mixes = o.mixes
    cdef int32_t* hint = o.hint + <int64_t>r.slot * o.chunk_row + start
    cdef const int32_t* drow = o.dense_id + <int64_t>r.slot * o.chunk_row + start
    cdef int64_t rank = _off_req_rank(o, r)
    cdef int32_t anchor = r.off_node
    cdef int32_t j = _off_new_job(o, r, ri, True)
    cdef OffJobC* jb = &o.jobs[j]
    cdef int32_t k, x, c, q, first = 0
    cdef int64_t lo
    cdef bint run
    cdef OffChunkC* ch
    cdef OffChunkC* chunks = o.chunks
    cdef OffLinkC* links
    cdef const int32_t* free_top
    cdef hash_t* out_keys
    cdef int32_t* out_cids
    cdef block_id_t* out_blocks
    _off_job_room(jb, n_new, bpc)
    links = o.lru  # grown only by _off_req_rank (above)
    free_top = o.free_chunks + o.n_free_chunks  # popped below, the count written back after
    out_keys = jb.keys + jb.n_keys
    out_cids = jb.cids + jb.n_keys
    out_blocks = jb.blocks + jb.n_blocks
    while found[first] >= 0:
        first += 1
    # Each new key takes a free chunk: being stored (ref -1, not evictable), ranked (rank,
    # -position), hinted for the request, and the job's next key with its GPU blocks (the job's
    # fence, offload_fence.pxi; one block a chunk unless the tier's chunks span several).
    # The free chunks' state and list nodes, written below, fetched OFF_NEAR chunks ahead.
    for q in range(tmin(OFF_NEAR, n_new)):
        _off_fetch_chunk(chunks, links, free_top[-1 - q])
    q = 0
    lo = -(<int64_t>start + first + 1) * tpc
    for k in range(first, n):
        if found[k] < 0:
            if q + OFF_NEAR < n_new:
                _off_fetch_chunk(chunks, links, free_top[-1 - q - OFF_NEAR])
            c = free_top[-1 - q]
            ch = &chunks[c]
            ch.key = keys[<int64_t>k * hpc]
            ch.ref = -1
            ch.loading = 0
            ch.watch = 0
            ch.used = 1
            ch.rank_hi = rank
            ch.rank_lo = lo
            links[c].evictable = 0
            links[c].mark = 0
            if k < m and drow[k] >= 0:
                links[c].mapped = 2  # its key's dense id (_off_dense_fill)
                links[c].tag = <uint32_t>drow[k]
                _off_dense_set(o, drow[k], c)
                _off_dense_stored += 1
            else:
                links[c].mapped = k < m
            hint[k] = c
            out_keys[q] = ch.key
            out_cids[q] = c
            if bpc == 1:
                out_blocks[q] = row[k]
            else:
                for x in range(bpc):
                    out_blocks[<int64_t>q * bpc + x] = row[<int64_t>k * bpc + x]
            q += 1
        lo -= tpc
    o.n_free_chunks -= n_new
    # The key map takes the mapped ones without a dense id (of the first m positions), their
    # buckets fetched ahead.
    q = 0
    for k in range(first, m):
        if k + OFF_AHEAD < m and found[k + OFF_AHEAD] < 0 and drow[k + OFF_AHEAD] < 0:
            _off_prefetch_mixed(o, mixes[k + OFF_AHEAD])
        if found[k] < 0:
            if drow[k] < 0:
                _off_map_put_mixed(o, out_cids[q], mixes[k])
            q += 1
    # LRUCachePolicy ranks each new chunk (rank, -position): _lru_place puts it after the request's
    # anchor, past the chunks there of the same rank and a higher position.  The new chunks come in
    # rising position, so once the first is right after the anchor (no such chunk follows the anchor:
    # _lru_stops), each next one goes right after the anchor too, before the one placed last (whose
    # position is lower).  The run is then linked at once: anchor, the last new chunk, ..., the first,
    # the anchor's old next.  Otherwise (a request storing again below its chunks still in the tier)
    # each is placed by itself.
    x = links[anchor].next
    run = _lru_stops(o, x, rank, -(<int64_t>start + first + 1) * tpc)
    if not run:
        _off_runs_split += 1
    if run and _off_runs_on:
        for q in range(n_new):
            c = out_cids[q]
            links[c].next = x
            links[x].prev = c
            x = c
        links[anchor].next = x
        links[x].prev = anchor
    else:
        for q in range(n_new):
            _lru_place(o, out_cids[q], anchor)
    # The last lookup's scan stopped at one of the new keys: it would go further now.  (None of the
    # new chunks is one the scan found: evicting one of those dropped it already.)
    if o.memo.on and (o.memo.missed or o.disk != NULL):
        for q in range(n_new):
            if _off_memo_stops_at(o, out_keys[q], links[out_cids[q]].mapped):
                _off_memo_drop(o)
                break
    jb.n_keys += n_new
    jb.n_blocks += n_new * bpc
    o.n_used += n_new
    o.step_stores[o.n_step_stores] = j
    o.n_step_stores += 1
    o.stores += 1
    o.store_chunks += n_new
    r.off_store_chunks += n_new
    _off_rec(o, OR_STORE, ri, jb.id, 0, n_new)
    return 0


cdef int _off_forget(SchedC* s, ReqC* r) except -1 nogil:
    """The connector drops a finished request's state: its KV row (keys) goes back."""
    if s.off.disk != NULL:
        disk_forget(s, r)
    memset(s.off.seen + <int64_t>r.slot * s.off.chunk_row, 0,
           tmin(s.off.chunk_row, num_tokens(r) // s.off.conf.tokens_per_chunk + 1) * sizeof(flag_t))
    if not r.held:  # a prefill replica's request keeps its blocks for the transfer (sched_free_held)
        kv_release_slot(s.kv, r)
    r.off_hold = 0
    return 0


cdef int off_build_meta(SchedC* s, BatchC* b) except -1 nogil:
    """OffloadingConnectorScheduler.build_connector_meta at the end of schedule(), before
    _update_after_schedule: jobs of requests preempted in this step are flushed; store jobs for
    every scheduled request (scheduling order), then for the requests finished by the last update;
    then the finished requests are signalled to the manager."""
    cdef OffloadC* o = s.off
    cdef int32_t i, k
    cdef ReqC* r
    cdef req_t ri
    if o.disk != NULL:
        disk_poll(o, b.step, b.start_s)
    o.cur_step = b.step
    off_stamp_allocated(s, b)
    # Flush the in-flight jobs of preempted requests (their stores only: a running request has
    # no load).
    for i in range(b.n_preempted):
        ri = b.preempted[i]
        if s.reqs[ri].off_jobs == 0:
            continue
        for k in range(o.jobs_cap):
            _off_flush_if(o, k, ri, b.step)
    # Then the finished requests' stores whose GPU blocks this step hands out (offload_fence.pxi).
    off_flush_fenced(s, b.step)
    for i in range(b.n):
        r = &s.reqs[b.req[i]]
        if _off_store_due(s, r, r.num_computed + b.tokens[i], _off_table_len(s.kv, 0, r)):
            _off_store(s, r, b.req[i], r.num_computed + b.tokens[i], _off_table_len(s.kv, 0, r))
    return _off_meta_end(s, b)


cdef int off_quiet_meta(SchedC* s, BatchC* b) except -1 nogil:
    """build_connector_meta of a quiet step (the engine's macro-steps, ext/engine_macro.pxi): ``b``
    schedules one decode token for each running request, none preempted, none admitted, no store of
    them due (off_quiet_bound) and their new blocks already stamped (off_stamp_one).  Everything
    else of off_build_meta runs as in any step: the disk tier's poll, the fenced flushes, the stores
    of the requests finished by the last update, the manager's finish signals."""
    if s.off.disk == NULL and s.off.n_fenced == 0 and not s.finished_pending and s.off.n_parked == 0:
        s.off.cur_step = b.step
        return 0  # most quiet steps: nothing to poll, flush, store, signal or count
    if s.off.disk != NULL:
        disk_poll(s.off, b.step, b.start_s)
    s.off.cur_step = b.step
    off_flush_fenced(s, b.step)
    return _off_meta_end(s, b)


cdef int _off_meta_end(SchedC* s, BatchC* b) except -1 nogil:
    """The end of build_connector_meta: store jobs for the requests finished by the last update,
    then the finished requests signalled to the manager (request_finished, in the order of
    _off_finish_order), the high-water mark of parked requests, the disk tier's on_schedule_end."""
    cdef OffloadC* o = s.off
    cdef int32_t i, k
    cdef ReqC* r
    if s.finished_pending:
        for i in range(s.n_finished):
            r = &s.reqs[s.finished[i]]
            # Clamped to the GPU prefix cache's commit point: the last sampled token has no KV.
            k = o.n_step_stores
            _off_store(s, r, s.finished[i], tmin(r.num_computed, tmax(r.prompt_len, num_tokens(r) - 1)),
                       r.off_nblocks)
            if o.n_step_stores > k:
                off_fence_new(s, o.step_stores[k], b.step)
        _off_finish_order(s)
        for i in range(s.n_finished):
            _off_finished(s, &s.reqs[s.skipped[i]])
    k = 0
    for i in range(o.n_parked):
        if s.reqs[o.parked[i]].off_park == 1 or s.reqs[o.parked[i]].off_park == 2:
            k += 1
    if k > o.max_wait:
        o.max_wait = k
    if o.disk != NULL:
        disk_flush(o, b.step, b.start_s)  # on_schedule_end, the manager's last call of the step
    return 0


cdef void _off_finish_order(SchedC* s) noexcept nogil:
    """The finished requests in the order the manager is told of them, into ``s.skipped``: vLLM
    iterates ``scheduler_output.finished_req_ids``, a set of request ids; aisim takes them in
    request-id order (the recorded logs agree)."""
    cdef int32_t i, j
    cdef req_t x
    for i in range(s.n_finished):
        x = s.finished[i]
        j = i - 1
        while j >= 0 and s.reqs[s.skipped[j]].id_rank > s.reqs[x].id_rank:
            s.skipped[j + 1] = s.skipped[j]
            j -= 1
        s.skipped[j + 1] = x


cdef int _off_flush_if(OffloadC* o, int32_t k, req_t ri, step_t step) except -1 nogil:
    """Job slot ``k``, in flight for request ``ri``, is flushed: the worker waits for it in
    ``step``, so that step's output reports it."""
    cdef OffJobC* jb = &o.jobs[k]
    if not jb.active or jb.req != ri or jb.flushed:
        return 0
    return _off_flush_job(o, k, step)


# ------------------------------------------------------------------ the scheduler's side

cdef inline int32_t _off_table_len(const KVCacheC* kv, int32_t gi, const ReqC* r) noexcept nogil:
    return kv.groups[gi].table_len[r.slot] if r.slot >= 0 else 0


cdef inline int32_t _off_remaining(const SchedC* s, const ReqC* r) noexcept nogil:
    """Scheduler._request_remaining_blocks (one full-attention group): blocks the request still
    needs to hold its whole sequence."""
    cdef tok_t n = tmin(num_tokens(r), s.conf.max_model_len)
    cdef int32_t need = <int32_t>cdiv(n, s.kv.groups[0].spec.block_size) - _off_table_len(s.kv, 0, r)
    return need if need > 0 else 0


cdef void _off_reserve_parked(SchedC* s, ReqC* r) noexcept nogil:
    # Scheduler._reserve_parked
    cdef int32_t blocks = _off_remaining(s, r)
    s.off.parked_reserved += blocks - r.off_reserved
    r.off_reserved = blocks


cdef void _off_unreserve_parked(SchedC* s, ReqC* r) noexcept nogil:
    # Scheduler._unreserve_parked
    s.off.parked_reserved -= r.off_reserved
    r.off_reserved = 0


cdef int64_t _off_reserved_blocks(const SchedC* s) noexcept nogil:
    """Scheduler._inflight_prefill_reserved_blocks: what in-flight prefills (requests admitted that
    have not finished their prefill) and parked loads still need, kept free from an async load."""
    cdef int64_t total = s.off.parked_reserved
    cdef int32_t i
    cdef const ReqC* r
    for i in range(s.n_running):
        r = &s.reqs[s.running[i]]
        if r.off_inflight:
            total += _off_remaining(s, r)
    return total


cdef int _off_park(SchedC* s, req_t ri) except -1 nogil:
    # step_started_kv_loads: appended to Scheduler.kv_holding_waiting after the waiting pass.
    cdef OffloadC* o = s.off
    if o.n_parked == o.parked_cap:
        mem_grow(<void**>&o.parked, o.parked_cap, 2 * o.parked_cap, sizeof(req_t))
        o.parked_cap *= 2
    o.parked[o.n_parked] = ri
    o.n_parked += 1
    return 0


# The CPU tier's LRU policy (vLLM's cpu/policies/lru.py), in the same module.
include "offload_lru.pxi"
