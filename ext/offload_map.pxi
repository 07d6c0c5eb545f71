# Included by scheduler.pyx after offload.pxi: the CPU tier's key map (open addressing, probes
# fetched ahead) and the connector lookup's scan over it, kept while nothing it read changed
# (structs: ext/offload.pxd).


# ------------------------------------------------------------------ the tier's key map

cdef int32_t _off_find(const OffloadC* o, hash_t key) noexcept nogil:
    """The chunk holding ``key`` (LRUCachePolicy.get), or -1."""
    return _off_find_mixed(o, key, mix64(key))


cdef inline int32_t _off_find_mixed(const OffloadC* o, hash_t key, hash_t h) noexcept nogil:
    """_off_find of ``key`` whose mix is ``h``.  A bucket keeps 32 bits of the key's mix: the
    chunk's key is read only where they match (the chunk a hit returns)."""
    cdef uint32_t tag = <uint32_t>h
    cdef int64_t i = <int64_t>(h & <hash_t>o.map_mask)
    cdef int32_t c
    while True:
        c = o.map[i].chunk
        if c == OFF_EMPTY:
            return -1
        if o.map[i].tag == tag and o.chunks[c].key == key:
            return c
        i = (i + 1) & o.map_mask


cdef inline int32_t _off_find_next(const OffloadC* o, int32_t prev, hash_t key) noexcept nogil:
    """_off_find of ``key``, the key of the chunk position after the one whose key chunk ``prev``
    holds (-1: not known), asking first the chunk after ``prev``: a request's chunks are stored
    in consecutive chunks from the free stack, which eviction refills in the same order, so a run
    another request stored is usually there.  A chunk in use holding the key is the map's answer
    (a key is in at most one chunk; a chunk in use is in the map), as for a request's hint
    (_off_hinted)."""
    if _off_next_holds(o, prev, key):
        return prev + 1
    return _off_find(o, key)


cdef inline int32_t _off_find_next_mixed(const OffloadC* o, int32_t prev, hash_t key, hash_t h) noexcept nogil:
    # _off_find_next of a key whose mix ``h`` is known.
    if _off_next_holds(o, prev, key):
        return prev + 1
    return _off_find_mixed(o, key, h)


cdef inline bint _off_next_holds(const OffloadC* o, int32_t prev, hash_t key) noexcept nogil:
    # _off_find_next's first guess: the chunk after ``prev`` is in use and holds ``key``.
    return _off_hints_on and prev >= 0 and _off_holds(o, prev + 1, key)


cdef inline bint _off_holds(const OffloadC* o, int32_t c, hash_t key) noexcept nogil:
    # Chunk ``c``, a guess of any value (a hint, a neighbour), is in use and holds ``key``: then it
    # is the key map's answer (a key is in at most one chunk, a chunk in use holds one key).
    return c >= 0 and c < o.conf.cpu_chunks and o.chunks[c].used and o.chunks[c].key == key


cdef int32_t OFF_NO_PRIV = 0x3fffffff  # _off_priv_from: no chunk of the request is known private


cdef inline int32_t _off_priv_from(SchedC* s, ReqC* r) noexcept nogil:
    """The first of the request's chunks whose key no other request of the trace has: the chunk
    whose last hash block lies past the leading blocks it shares (ReqC.key_blocks, while its
    blocks are keyed lazily; all of a private request's).  Such a key is found only by the
    request's own lookups and stores, so its chunk stays out of the key map (``mapped`` 0) and is
    found through the request's hint (_off_own).  Fixed at the connector's first sight of the
    request (a preemption ends its lazy keys, not what it shares), with the dense ids of the
    chunks before it (_off_dense_fill); none with a disk tier (its jobs find chunks by key) or
    with the hints off (tests: every chunk through the map)."""
    cdef OffloadC* o = s.off
    cdef int64_t b = OFF_NO_PRIV
    if r.off_priv == 0:
        if r.lazy_keys and o.disk == NULL and _off_hints_on:
            b = tmin(r.key_blocks // o.conf.hashes_per_chunk, OFF_NO_PRIV)
        r.off_priv = <int32_t>b + 1
        _off_dense_fill(s, r, <int32_t>tmin(b, o.chunk_row))
    return r.off_priv - 1


# ------------------------------------------------------------------ the dense key array
# A chunk position whose key other requests of the trace may have is found through a dense id
# instead of the key map: the trace's prefix nodes number every run that several requests hold
# (ReqC.node_off / node_n, KVCacheC.run_node), and KVCacheC.node_hash_base[node] + k names the
# k-th block counted from the block holding the run's first token, of the blocks ending in the
# run (hashing.pyx, _extend_shared).  The dense id of chunk position i, whose key is the hash of
# its last hash block j = (i + 1) * hashes_per_chunk - 1, is that of block j when j ends in one
# of the request's leading node_n runs, and none otherwise (or past the node's room).
#
# The id names the key exactly.  Same id, same key: the same node is the same start of a run (the
# runs before it, its stream and first offset), so every holder has the same tokens before the run
# and, up to its own length, in it; block j ends in the run for both at the same offset k from the
# same first block, so both hash the same tokens in the same runs (_extend_shared shares these
# hashes between holders on the same ground).  Same key, same id: two requests with one key have
# every token of block j and before it in the same runs (hashing.pxd: segments canonical), so the
# run holding block j's last token starts alike for both and, being held by both, is a node of
# both, as is every run before it (node_n counts leading runs several requests hold); the same
# node and offset give the same id.  Hence a key stored under its id is found by every request
# with that key, and a key with no id (past a request's node runs) is found through the map by
# every request with it (none has an id for it).  The chunk positions a request asks by id are
# those below _off_priv_from (its shared blocks lie inside its node runs: shared_prefix_tokens
# stops at the first run no other request holds); its private ones keep going through its hint.
# Not used with a disk tier (its jobs find chunks by key), hash lookahead (a block's key then
# folds the tokens after it) or no nodes (a trace fed in chunks): every position then has none.

cdef bint _off_dense_on = True
cdef int64_t _off_dense_stored = 0  # tests: chunks stored under a dense id (this process)


def _offload_dense(bint on):
    """Tests only: whether chunk positions with a dense id use the dense key array (else every
    shared chunk goes through the key map); returns the previous setting."""
    global _off_dense_on
    old = _off_dense_on
    _off_dense_on = on
    return old


def _offload_dense_stored():
    """Tests only: the chunks stored under a dense id so far (in this process)."""
    return _off_dense_stored


cdef inline bint _off_dense_ok(const SchedC* s) noexcept nogil:
    # Whether this replay gives chunk positions dense ids (fixed for the replay).
    cdef const KVCacheC* kv = s.kv
    return (_off_dense_on and s.off.disk == NULL and kv.node_hash != NULL and kv.pool.n_nodes > 0
            and kv.hash_lookahead == 0 and kv.node_hash_base[kv.pool.n_nodes] <= 0x7fffffff)


cdef int _off_dense_room(SchedC* s) except -1 nogil:
    """The dense key array, made at the tier's first lookup or store (every id empty)."""
    cdef OffloadC* o = s.off
    if o.dense != NULL or not _off_dense_ok(s):
        return 0
    o.n_dense = s.kv.node_hash_base[s.kv.pool.n_nodes]
    o.dense = <int32_t*>mem_calloc(o.n_dense, sizeof(int32_t))  # zero pages: touched only where used
    return 0


cdef inline int32_t _off_dense_chunk(const OffloadC* o, int32_t d) noexcept nogil:
    # The chunk holding the key of dense id ``d`` (-1: none).  An entry is 1 + the chunk, so the
    # array's fresh zero pages read as empty.
    return o.dense[d] - 1 if o.dense != NULL else -1


cdef inline void _off_dense_set(OffloadC* o, int32_t d, int32_t c) noexcept nogil:
    # Chunk ``c`` holds the key of dense id ``d`` from now on (-1: no chunk does).
    o.dense[d] = c + 1


cdef inline tok_t _off_run_len(const KVCacheC* kv, const ReqC* r, int32_t m) noexcept nogil:
    # The length of the request's run m (a prompt segment; the output stream: open-ended, its
    # blocks keyed only once their tokens exist).
    if m < r.seg_cnt:
        return kv.seg_len[r.seg_off + m]
    return <tok_t>1 << 50


cdef void _off_dense_fill(SchedC* s, ReqC* r, int32_t n) noexcept nogil:
    """The dense ids of the request's chunk positions 0 .. ``n`` - 1 into its row (-1: none), by
    _extend_shared's walk over its node runs a run at a time: the positions whose last hash block
    ends in run m are those from the last run's up to run_end // size // hashes_per_chunk (the
    block ends before the run does), their ids consecutive (hashes_per_chunk apart)."""
    cdef OffloadC* o = s.off
    cdef const KVCacheC* kv = s.kv
    cdef int32_t* row = o.dense_id + <int64_t>r.slot * o.chunk_row
    cdef int64_t hpc = o.conf.hashes_per_chunk, size = kv.hash_block_size, k, base, room, e
    cdef int32_t i = 0, m = 0, node
    cdef tok_t run_start = 0, run_end
    if n <= 0:
        return
    if r.node_n > 0 and _off_dense_ok(s):
        run_end = _off_run_len(kv, r, 0)
        while True:
            e = tmin(n, run_end // size // hpc)
            if e > i:
                node = kv.run_node[r.node_off + m]
                base = kv.node_hash_base[node]
                room = kv.node_hash_base[node + 1] - base
                k = (i + 1) * hpc - 1 - run_start // size  # from the block holding the run's first token
                while i < e:
                    row[i] = <int32_t>(base + k) if k < room else -1
                    k += hpc
                    i += 1
            m += 1
            if i >= n or m >= r.node_n:
                break
            run_start = run_end
            run_end += _off_run_len(kv, r, m)
    if i < n:
        memset(row + i, 0xff, (n - i) * sizeof(int32_t))


cdef inline int32_t _off_own(const OffloadC* o, const ReqC* r, int32_t i, hash_t key) noexcept nogil:
    """_off_find of ``key``, the key of the request's private chunk position ``i``
    (_off_priv_from): only this request stores it, each time into the chunk its hint then names,
    so the chunk is in the tier only if the request has seen the position and the chunk its hint
    names still holds the key."""
    cdef int64_t at = <int64_t>r.slot * o.chunk_row + i
    cdef int32_t c
    if not o.seen[at]:
        return -1
    c = o.hint[at]
    if _off_holds(o, c, key):
        return c
    return -1


cdef inline void _off_prefetch(const OffloadC* o, hash_t key) noexcept nogil:
    _off_prefetch_mixed(o, mix64(key))


cdef inline void _off_prefetch_mixed(const OffloadC* o, hash_t h) noexcept nogil:
    # The bucket of the key whose mix is ``h`` and the next fetched ahead of its probe (a probe or
    # a deletion's shift usually reads both): a run of probes then overlaps its memory misses.
    cdef int64_t i = <int64_t>(h & <hash_t>o.map_mask)
    __builtin_prefetch(&o.map[i])
    __builtin_prefetch(&o.map[(i + 1) & o.map_mask])


cdef void _off_map_put(OffloadC* o, hash_t key, int32_t chunk) noexcept nogil:
    """``chunk`` (its key already ``key``) holds ``key`` from now on."""
    if _off_memo_stops_at(o, key, True):
        _off_memo_drop(o)  # the last lookup's scan stopped here: it would go further now
    _off_map_put_mixed(o, chunk, mix64(key))


cdef inline bint _off_memo_stops_at(const OffloadC* o, hash_t key, bint mapped) noexcept nogil:
    """Whether a kept lookup scan stopped at ``key`` (a chunk storing it from now on drops the
    scan): the CPU tier's, or with a disk tier one of its kept scans (only mapped keys there)."""
    return o.memo.on and ((o.memo.missed and o.memo.miss == key)
                          or (mapped and o.disk != NULL and disk_memo_missed(o, key)))


cdef inline void _off_map_put_mixed(OffloadC* o, int32_t chunk, hash_t h) noexcept nogil:
    """``chunk`` holds the key whose mix is ``h`` from now on (the kept scans already checked:
    _off_memo_stops_at)."""
    cdef int64_t i = <int64_t>(h & <hash_t>o.map_mask)
    while o.map[i].chunk != OFF_EMPTY:
        i = (i + 1) & o.map_mask
    o.map[i].chunk = chunk
    o.map[i].tag = <uint32_t>h
    o.lru[chunk].tag = <uint32_t>h  # an eviction's walk fetches the bucket with the node


cdef void _off_map_del(OffloadC* o, int32_t chunk) noexcept nogil:
    # Linear probing with backward-shift deletion: no tombstones.  An entry's home bucket is its
    # tag's low bits (at most 2^32 buckets: off_init sizes the map from an int32 count).
    cdef OffMapE* m = o.map
    cdef uint32_t mask = <uint32_t>o.map_mask
    cdef uint32_t i = o.lru[chunk].tag & mask
    cdef uint32_t j, mv
    cdef OffMapE e, h
    while m[i].chunk != chunk:
        i = (i + 1) & mask
    j = (i + 1) & mask
    e = m[j]
    while e.chunk != OFF_EMPTY:
        # The entry at j moves into the hole at i unless its home lies cyclically in (i, j]: unless
        # it is nearer j than i is.  Chosen by masks, without a branch (its outcome is a coin toss).
        mv = -<uint32_t>(((j - e.tag) & mask) >= ((j - i) & mask))
        h = m[i]
        m[i].tag = (e.tag & mv) | (h.tag & ~mv)
        m[i].chunk = <int32_t>((<uint32_t>e.chunk & mv) | (<uint32_t>h.chunk & ~mv))
        i = (j & mv) | (i & ~mv)
        j = (j + 1) & mask
        e = m[j]
    m[i].chunk = OFF_EMPTY


cdef inline bint memo_of(const ScanMemoC* mm, req_t ri, const ReqC* r) noexcept nogil:
    """Whether the kept scan ``mm`` is the request's: the same engine slot, KV row, arrival and id rank."""
    return mm.req == ri and mm.slot == r.slot and mm.arrival == r.arrival_key and mm.rank == r.id_rank


cdef inline void memo_begin(ScanMemoC* mm, req_t ri, const ReqC* r, int32_t start, int32_t end) noexcept nogil:
    """``mm`` starts a scan of the request's chunks ``start`` .. ``end`` - 1, nothing found yet."""
    mm.req = ri
    mm.slot = r.slot
    mm.arrival = r.arrival_key
    mm.rank = r.id_rank
    mm.start = start
    mm.end = end
    mm.hits = 0
    mm.pending = 0
    mm.loading = 0
    mm.missed = 0


cdef void _off_memo_drop(OffloadC* o) noexcept nogil:
    """The last lookup's scan is forgotten (its chunks no longer watched)."""
    cdef int32_t i
    if not o.memo.on:
        return
    for i in range(o.memo.hits):
        o.chunks[o.memo.chunks[i]].watch = 0
    if o.disk != NULL:
        disk_memo_drop(o)  # every kept scan through both tiers
    o.memo.on = 0


# ------------------------------------------------------------------ the lookup's scan

cdef inline void _off_scan_fetch(SchedC* s, ReqC* r, const int32_t* drow, int32_t i) noexcept nogil:
    # What _off_scan reads of the request's shared position ``i``: its key's bucket, or the state
    # of the chunk its dense id names (the dense entries of a run are read in order).
    cdef int32_t c
    if drow[i] < 0:
        _off_prefetch(s.off, _off_key(s, r, i))
    else:
        c = _off_dense_chunk(s.off, drow[i])
        if c >= 0:
            __builtin_prefetch(&s.off.chunks[c])


cdef int _off_scan(SchedC* s, ReqC* r, int32_t start, int32_t end) except -1 nogil:
    """_maximal_prefix_lookup from chunk ``start`` to ``end``: the consecutive chunks present (one
    being stored or loaded defers the lookup), into ``memo.hits``, ``memo.pending`` and
    ``memo.loading``; the last scan's answer when it asked the same of the same request and none of
    the chunks it read changed since."""
    cdef OffloadC* o = s.off
    cdef req_t ri = <req_t>(r - s.reqs)
    cdef int32_t i, c, d = OFF_AHEAD
    cdef int32_t priv = _off_priv_from(s, r)
    cdef const int32_t* drow = o.dense_id + <int64_t>r.slot * o.chunk_row
    cdef hash_t key
    if o.memo.on and memo_of(&o.memo, ri, r) and o.memo.start == start and o.memo.end == end:
        return 0
    _off_memo_drop(o)
    memo_begin(&o.memo, ri, r, start, end)
    for i in range(start, tmin(tmin(start + d, end), priv)):
        _off_scan_fetch(s, r, drow, i)
    c = -1
    for i in range(start, end):
        if i + d < end and i + d < priv:
            _off_scan_fetch(s, r, drow, i + d)
        key = _off_key(s, r, i)
        if i >= priv:
            c = _off_own(o, r, i, key)
        elif drow[i] >= 0:
            c = _off_dense_chunk(o, drow[i])  # the key's dense id (_off_dense_fill)
        else:
            c = _off_find_next(o, c, key)
        if c < 0:
            o.memo.missed = 1
            o.memo.miss = key
            break
        o.memo.chunks[o.memo.hits] = c
        o.hint[<int64_t>r.slot * o.chunk_row + i] = c  # the load that may follow reads it (_off_hinted)
        o.memo.hits += 1
        o.chunks[c].watch = 1
        if o.chunks[c].ref < 0:
            o.memo.pending = 1
        if o.chunks[c].loading:
            o.memo.loading = 1
    o.memo.on = 1
    return 0
