# Included by scheduler.pyx after offload.pxi: the CPU tier's LRU policy (its order, the
# requests' accesses, eviction, the re-rank at a request's end) and the chunks each request's
# positions were last seen in (structs: ext/offload.pxd).

# ------------------------------------------------------------------ the LRU policy

# LRUCachePolicy (kv_offload/cpu/policies/lru.py) evicts the evictable chunks of smallest rank
# (_ranks: a request's rank and -position while it runs, a fresh rank (next, 0) once it
# finishes), popped from a lazy heap.  Every rank is either larger than all before it (a fresh
# rank, a new request's rank) or a running request's (rank, -position); so aisim keeps the chunks
# in one list in rank order: a fresh rank goes to the tail, a request's chunk after its rank's
# anchor (appended when the request took its rank), among that request's chunks by position.
# Pinned chunks stay in place (their rank is kept); eviction walks from the head.

cdef inline void _lru_unlink(OffloadC* o, int32_t x) noexcept nogil:
    o.lru[o.lru[x].prev].next = o.lru[x].next
    o.lru[o.lru[x].next].prev = o.lru[x].prev


cdef inline void _lru_after(OffloadC* o, int32_t p, int32_t x) noexcept nogil:
    o.lru[x].prev = p
    o.lru[x].next = o.lru[p].next
    o.lru[o.lru[p].next].prev = x
    o.lru[p].next = x


cdef inline void _lru_place(OffloadC* o, int32_t c, int32_t anchor) noexcept nogil:
    """Chunk ``c`` (not in the list) at its rank: the tail for a fresh rank, else among the
    chunks after ``anchor``, its request's rank anchor, that have the same rank and a smaller
    -position (usually none: a request reaches its chunks head first)."""
    cdef OffChunkC* ch = &o.chunks[c]
    if ch.rank_lo == 0:
        _lru_after(o, o.lru[o.conf.cpu_chunks].prev, c)
    elif _lru_stops(o, o.lru[anchor].next, ch.rank_hi, ch.rank_lo):
        _lru_after(o, anchor, c)
    else:
        _lru_walk(o, c, anchor)


cdef inline bint _lru_stops(const OffloadC* o, int32_t x, int64_t hi, int64_t lo) noexcept nogil:
    # Whether a chunk ranked (hi, lo), lo != 0, goes before node ``x`` in its request's run:
    # ``x`` is no chunk (an anchor, the root) or a chunk of another rank or a larger -position.
    return x >= o.conf.cpu_chunks or o.chunks[x].rank_hi != hi or o.chunks[x].rank_lo > lo


cdef void _lru_walk(OffloadC* o, int32_t c, int32_t anchor) noexcept nogil:
    # _lru_place past the chunks after ``anchor`` that go before ``c``.
    cdef int32_t p = anchor
    while not _lru_stops(o, o.lru[p].next, o.chunks[c].rank_hi, o.chunks[c].rank_lo):
        p = o.lru[p].next
    _lru_after(o, p, c)


cdef inline void _off_rerank(OffloadC* o, int32_t c, int64_t rank, int64_t lo, int32_t anchor) noexcept nogil:
    # LRUCachePolicy.on_request_access of chunk ``c`` in the tier: ranked (rank, lo) under the
    # request whose rank's anchor is ``anchor``, unless its rank is already higher.
    cdef OffChunkC* ch = &o.chunks[c]
    if ch.rank_hi > rank or (ch.rank_hi == rank and ch.rank_lo >= lo):
        return
    ch.rank_hi = rank
    ch.rank_lo = lo
    _lru_unlink(o, c)
    _lru_place(o, c, anchor)


cdef int _off_new_anchor(OffloadC* o) except -1 nogil:
    """An anchor node at the list's tail (for a rank larger than every rank so far)."""
    cdef int32_t base = o.conf.cpu_chunks + 1, old = o.anchor_cap, i, x
    if o.n_free_anchors == 0:
        mem_grow(<void**>&o.lru, base + old, base + 2 * old, sizeof(OffLinkC))
        mem_grow(<void**>&o.free_anchors, old, 2 * old, sizeof(int32_t))
        for i in range(2 * old - 1, old - 1, -1):
            o.free_anchors[o.n_free_anchors] = base + i
            o.n_free_anchors += 1
        o.anchor_cap = 2 * old
    o.n_free_anchors -= 1
    x = o.free_anchors[o.n_free_anchors]
    _lru_after(o, o.lru[o.conf.cpu_chunks].prev, x)
    return x


cdef inline void _off_mark_evictable(OffLinkC* links, int32_t c) noexcept nogil:
    # LRUCachePolicy.mark_evictable: the chunk keeps its place in the order (``links``: the tier's
    # list, o.lru).
    links[c].evictable = 1


cdef int64_t _off_req_rank(OffloadC* o, ReqC* r) except -1 nogil:
    # LRUCachePolicy._get_request_rank: one rank per request, taken at its first use.
    if r.off_rank == 0:
        o.next_rank += 1
        r.off_rank = o.next_rank
        r.off_node = _off_new_anchor(o)
    return r.off_rank


cdef int _off_access(SchedC* s, ReqC* r, int32_t a, int32_t b, const int32_t* found) except -1 nogil:
    """CPUOffloadingManager._record_request_cache_access over the request's chunks ``a`` .. ``b``
    (with ``found``, the chunk of each key from ``a`` on, prepare_store's: those not in the tier
    and those stored, not the ones another request is still storing): the ones it has not seen yet go to
    LRUCachePolicy.on_request_access, which ranks each chunk in the tier (request rank, -position)
    unless its rank is already higher."""
    cdef OffloadC* o = s.off
    cdef flag_t* seen = o.seen + <int64_t>r.slot * o.chunk_row
    cdef int32_t i, c
    cdef int64_t rank = 0
    for i in range(a, b):
        if seen[i]:
            continue
        if found == NULL:
            c = _off_hinted(s, r, i)
        else:
            c = found[i - a]
            if c >= 0 and o.chunks[c].ref < 0:
                continue
        _off_access_at(o, r, i, c, &rank)
    return 0


cdef inline int _off_access_at(OffloadC* o, ReqC* r, int32_t i, int32_t c, int64_t* rank) except -1 nogil:
    """_off_access of the request's unseen position ``i``, whose key chunk ``c`` holds (-1: not in
    the tier): seen from now on, the request ranked at its first access (``rank``: 0 until then; a
    rank is at least 1), and the chunk hinted and re-ranked (LRUCachePolicy.on_request_access)."""
    cdef int64_t at = <int64_t>r.slot * o.chunk_row + i
    o.seen[at] = 1
    if rank[0] == 0:
        rank[0] = _off_req_rank(o, r)
    if c >= 0:
        o.hint[at] = c
        _off_rerank(o, c, rank[0], -(<int64_t>i + 1) * o.conf.tokens_per_chunk, r.off_node)
    return 0


# Off only in tests: every chunk found through the key map, the reference the hints must match
# (tests/test_offload_hints.py).
cdef bint _off_hints_on = True


def _set_offload_hints(bint on):
    """Tests only: whether _off_hinted asks a request's hint before the key map (the results are
    byte-identical either way).  Returns the previous setting."""
    global _off_hints_on
    old = _off_hints_on
    _off_hints_on = on
    return old


# Off only in tests: every new chunk of a store placed by itself (_lru_place), the reference the
# run's splice must match (tests/test_offload_runs.py); and how many stores placed them so.
cdef bint _off_runs_on = True
cdef int64_t _off_runs_split = 0


def _set_offload_runs(bint on):
    """Tests only: whether a store links its new chunks after the request's anchor as one run when
    it may (the results are byte-identical either way).  Returns the previous setting."""
    global _off_runs_on
    old = _off_runs_on
    _off_runs_on = on
    return old


def _offload_runs_split():
    """Tests only: the stores so far (in this process) whose new chunks were placed one by one
    because the run's splice did not hold (_off_store_new)."""
    return _off_runs_split


cdef inline int32_t _off_hinted(SchedC* s, ReqC* r, int32_t i) noexcept nogil:
    """_off_find of the key of the request's chunk ``i`` (LRUCachePolicy.get), asking first the chunk
    the request last found it in: a key is in at most one chunk and a chunk in use holds one key, so
    a chunk in use holding the key is the map's answer."""
    cdef OffloadC* o = s.off
    cdef int64_t at = <int64_t>r.slot * o.chunk_row + i
    cdef hash_t key = _off_key(s, r, i)
    cdef int32_t c = o.hint[at]
    if _off_hints_on and _off_holds(o, c, key):
        return c
    if i >= _off_priv_from(s, r):
        return -1  # a private key is only where the hint names (_off_own)
    if o.dense_id[at] >= 0:
        c = _off_dense_chunk(o, o.dense_id[at])  # its dense id (_off_dense_fill)
    else:
        c = _off_find(o, key)
    if c >= 0:
        o.hint[at] = c
    return c


cdef enum:
    OFF_EVICT_AHEAD = 128  # chunks an eviction's walk and removal fetch ahead (their flags and buckets)
    OFF_WALK_AHEAD = 64   # nodes an eviction's walk fetches ahead


cdef extern from *:
    """
    /* The node an eviction's walk visits after ``x``, whose next link is ``q``: ``x - 1`` when that
       is ``q`` (the likely way), taken by a branch the processor predicts, so that its walk runs on
       before the link arrives from memory; the empty asm keeps the compiler from using ``q`` for
       ``x - 1`` there (they are equal). */
    static inline int32_t aisim_off_walk_next(int32_t x, int32_t q) {
        if (__builtin_expect(q == x - 1, 1)) {
            __asm__("" : "+r"(x));
            return x - 1;
        }
        return q;
    }
    """
    int32_t aisim_off_walk_next(int32_t x, int32_t q) noexcept nogil


cdef inline void _off_evict_fetch(const OffloadC* o, const OffLinkC* lru, int32_t x) noexcept nogil:
    # What removing the selected chunk ``x`` reads: its flags and, when mapped, its key's bucket
    # (or its dense id's entry).
    __builtin_prefetch(&o.chunks[x])
    if lru[x].mapped == 1:
        __builtin_prefetch(&o.map[lru[x].tag & <uint32_t>o.map_mask])
    elif lru[x].mapped:
        __builtin_prefetch(&o.dense[lru[x].tag])


cdef int _off_evict(OffloadC* o, int32_t n) except -1 nogil:
    """LRUCachePolicy.evict: the ``n`` evictable chunks of lowest rank that are not protected
    (``mark`` 1), or none when there are not enough (returns 0).  The chosen ones (``scratch``, in
    rank order) leave the list a stretch of consecutive nodes at a time (what unlinking each in
    turn does) and the key map with their buckets fetched ahead."""
    # The tier's arrays in locals: a flag written through them may alias any field of ``o``.
    cdef OffLinkC* lru = o.lru
    cdef OffChunkC* chunks = o.chunks
    cdef int32_t* sel = o.scratch
    cdef int32_t root = o.conf.cpu_chunks
    cdef int32_t n_sel = 0, i, x = lru[root].next, p = -1, q
    # The walk's likely way: a request's chunks, taken from the free stack in the order eviction
    # returned them, lie at descending indices, usually next to each other: the nodes below the
    # head, and then as many below each node visited, are fetched ahead.
    for i in range(4, tmin(OFF_WALK_AHEAD, n), 4):
        if x >= i and x < root:
            __builtin_prefetch(&lru[x - i])
    while x != root and n_sel < n:
        if x >= OFF_WALK_AHEAD:
            __builtin_prefetch(&lru[x - OFF_WALK_AHEAD])
        if x < root and lru[x].evictable and lru[x].mark == 0:
            sel[n_sel] = x
            if n_sel < OFF_EVICT_AHEAD:
                _off_evict_fetch(o, lru, x)
            n_sel += 1
        x = aisim_off_walk_next(x, lru[x].next)
    if n_sel < n:
        return 0
    for i in range(n_sel):
        x = sel[i]
        if i + OFF_EVICT_AHEAD < n_sel:
            _off_evict_fetch(o, lru, sel[i + OFF_EVICT_AHEAD])
        if p < 0:
            p = lru[x].prev  # a stretch starts: the node before it (kept, or the root)
        q = lru[x].next
        if i + 1 == n_sel or q != sel[i + 1]:
            # The stretch ends at x: out of the list at once.
            lru[p].next = q
            lru[q].prev = p
            p = -1
        if lru[x].mapped == 1:
            _off_map_del(o, x)
        elif lru[x].mapped:
            _off_dense_set(o, <int32_t>lru[x].tag, -1)  # out of the dense key array
        if o.memo.on and chunks[x].watch:  # (a chunk is watched only while a scan is kept)
            _off_memo_drop(o)  # the last lookup's scan found this chunk
        chunks[x].used = 0  # a request's hint to it is stale from now on (_off_hinted)
        lru[x].evictable = 0
    # The chosen chunks go on the free stack in their order (a promotion's eviction: one).
    if n_sel == 1:
        o.free_chunks[o.n_free_chunks] = sel[0]
    else:
        memcpy(o.free_chunks + o.n_free_chunks, sel, n_sel * sizeof(int32_t))
    o.n_free_chunks += n_sel
    o.n_used -= n_sel
    o.n_evictable -= n_sel
    o.step_evicted += n_sel
    o.evicted += n_sel
    return 1


cdef inline void _lru_run_to_tail(OffloadC* o, int32_t a, int32_t b) noexcept nogil:
    """The nodes ``a`` .. ``b`` (``b`` reached from ``a`` by next links) moved, in their order, to
    the list's tail: what moving each to the tail in turn does (_lru_place of a fresh rank)."""
    cdef int32_t root = o.conf.cpu_chunks
    cdef int32_t p = o.lru[a].prev, q = o.lru[b].next, t
    if q == root:
        return  # already the tail
    o.lru[p].next = q
    o.lru[q].prev = p
    t = o.lru[root].prev
    o.lru[t].next = a
    o.lru[a].prev = t
    o.lru[b].next = root
    o.lru[root].prev = b


cdef inline void _off_fetch_hinted(const OffloadC* o, const flag_t* seen, const int32_t* hint,
                                   const hash_t* key, int32_t i) noexcept nogil:
    # The chunk a seen position was last found in and the position's key (``key``), fetched ahead
    # of _off_hinted.
    cdef int32_t c = hint[i]
    if seen[i] and c >= 0 and c < o.conf.cpu_chunks:
        _off_fetch_chunk(o.chunks, o.lru, c)
        __builtin_prefetch(key)


cdef int _off_finished(SchedC* s, ReqC* r) except -1 nogil:
    """CPUOffloadingManager.on_request_finished with LRUCachePolicy.on_request_finished: every chunk
    the request saw that is still in the tier gets a fresh rank, tail first, so its head is the most
    recently used; then the request's state goes once no job of it is in flight."""
    cdef OffloadC* o = s.off
    cdef flag_t* seen = o.seen + <int64_t>r.slot * o.chunk_row
    cdef const int32_t* hint = o.hint + <int64_t>r.slot * o.chunk_row
    cdef int32_t hpc = o.conf.hashes_per_chunk
    cdef const hash_t* keys = s.kv.hashes + <int64_t>r.slot * s.kv.hash_row + hpc - 1  # _off_key: keys[i * hpc]
    cdef int32_t i, c
    cdef int32_t n = <int32_t>tmin(o.chunk_row, num_tokens(r) // o.conf.tokens_per_chunk + 1)
    cdef int32_t a = -1, b = -1
    cdef int64_t rank = o.next_rank  # LRUCachePolicy._next_rank, written back once
    # The seen chunks, tail first: each one's chunk (the hint checked, else the map asked; the
    # chunks hinted OFF_AHEAD positions on fetched ahead) gets a fresh rank and goes to the list's
    # tail, in this order.  Chunks that follow each other in the list keep their order when moved
    # one by one, so a run of them (the request's own chunks sit after its anchor tail first) moves
    # at once, when the next chunk does not follow it.
    for i in range(n - 1, tmax(n - 1 - OFF_AHEAD, -1), -1):
        _off_fetch_hinted(o, seen, hint, keys + <int64_t>i * hpc, i)
    for i in range(n - 1, -1, -1):
        if i >= OFF_AHEAD:
            _off_fetch_hinted(o, seen, hint, keys + <int64_t>(i - OFF_AHEAD) * hpc, i - OFF_AHEAD)
        if not seen[i]:
            continue
        # _off_hinted, its usual answer (the hint holds) without recomputing the row's addresses.
        c = hint[i]
        if not (_off_hints_on and _off_holds(o, c, keys[<int64_t>i * hpc])):
            c = _off_hinted(s, r, i)
            if c < 0:
                continue
        rank += 1  # LRUCachePolicy.on_request_finished: (next rank, 0), larger than every rank so far
        o.chunks[c].rank_hi = rank
        o.chunks[c].rank_lo = 0
        if a >= 0 and o.lru[b].next == c:
            b = c
            continue
        if a >= 0:
            _lru_run_to_tail(o, a, b)
        a = b = c
    if a >= 0:
        _lru_run_to_tail(o, a, b)
    o.next_rank = rank
    if r.off_rank > 0 and r.off_node >= 0:
        # No chunk takes this request's rank any more: its anchor goes back.
        _lru_unlink(o, r.off_node)
        o.free_anchors[o.n_free_anchors] = r.off_node
        o.n_free_anchors += 1
        r.off_node = -1
    r.off_hold = 2
    if r.off_jobs == 0:
        _off_forget(s, r)
    return 0


def _evict_probe(int32_t n_chunks, order, keys, pinned, protected, private, int32_t n, watched=None):
    """Tests only: _off_evict of ``n`` chunks from a CPU tier of ``n_chunks`` chunks, every one
    holding a key: chunk ``order[k]`` holds ``keys[k]``, the list in ``order`` (head first); the
    chunks in ``pinned`` not evictable, those in ``protected`` protected (``mark`` 1, as a store
    protects the chunks it offers), those in ``private`` out of the key map.  Returns whether it
    evicted, the list after it head first and tail first, the chunks it freed (in the order pushed)
    and the chunk the key map finds for each key (-1: none).  With ``watched`` (chunks a kept lookup
    scan found, in its order) also whether the scan is still kept after it and each one's watch."""
    cdef OffloadC o
    cdef OffConfC conf
    cdef int32_t k, c, x, root = n_chunks
    memset(&conf, 0, sizeof(conf))
    conf.cpu_chunks = n_chunks
    conf.tokens_per_chunk = 16
    conf.hashes_per_chunk = 1
    off_init(&o, conf, max(4, len(watched or ())), 1, 4)
    try:
        o.n_free_chunks = 0
        for k in range(n_chunks):
            c = order[k]
            o.chunks[c].key = keys[k]
            o.chunks[c].used = 1
            o.lru[c].evictable = c not in pinned
            o.n_evictable += o.lru[c].evictable
            o.n_used += 1
            _lru_after(&o, o.lru[root].prev, c)
            o.lru[c].mapped = c not in private
            if o.lru[c].mapped:
                _off_map_put(&o, o.chunks[c].key, c)
        for c in protected:
            o.lru[c].mark = 1
        if watched is not None:
            for k, c in enumerate(watched):
                o.memo.chunks[k] = c
                o.chunks[c].watch = 1
            o.memo.hits = len(watched)
            o.memo.on = 1
        done = _off_evict(&o, n)
        ahead, back = [], []
        x = o.lru[root].next
        while x != root:
            ahead.append(x)
            x = o.lru[x].next
        x = o.lru[root].prev
        while x != root:
            back.append(x)
            x = o.lru[x].prev
        out = (done, ahead, back, [o.free_chunks[k] for k in range(o.n_free_chunks)],
               [_off_find(&o, key) for key in keys])
        if watched is not None:
            out += (bool(o.memo.on), [o.chunks[c].watch for c in watched])
        return out
    finally:
        off_release(&o)
