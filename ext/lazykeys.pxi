# Lazy keys: blocks cached without their keys until another request may share them (included by
# kvcache.pyx).

cdef bint kv_lazy_ok(const KVCacheC* kv) noexcept nogil:
    """Whether the blocks of a request that no other request shares may be keyed lazily here.

    The keys of a request's blocks past the tokens it has in common with any other request
    (ReqC.key_blocks; all of a private request's) can only ever be found by its own lookup after
    a preemption, so those blocks are cached without them (bp_cache_lazily: the free queue, the counts and evictions see
    a cached block) and keyed when it is preempted (kv_key_lazy), or when a window or a local
    chunk frees one of them before that (_remove_skipped).  On only where nothing else reads a
    key: attention groups (full, sliding window, chunked local; ring buffers cache nothing) with
    blocks of the hash block (no partial entries, no copied blocks), no state groups, no
    speculative-decoding key rules, no router reading key events.
    """
    cdef int32_t gi
    cdef const GroupSpecC* g
    if not kv.caching or kv.fine or kv.eagle or kv.hash_lookahead > 0 or kv.pool.log_keys:
        return False
    for gi in range(kv.n_groups):
        g = &kv.groups[gi].spec
        if g.kind == GK_RING or not g.cacheable:
            continue
        if (g.kind != GK_FULL and g.kind != GK_SWA and g.kind != GK_CHUNKED) or g.block_size != kv.hash_block_size:
            return False
    return True


cdef inline int _key_lazy_block(KVCacheC* kv, int32_t gi, ReqC* r, int32_t i, block_id_t blk) except -1 nogil:
    # Block i of group gi of a lazily keyed request gets its key (its hash computed by the caller).
    if blk != 0 and kv.pool.blk[blk].key != 0 and kv.pool.blk[blk].tag == TAG_LAZY:
        bp_key_lazy(&kv.pool, blk, group_key(kv_hashes(kv, r.slot)[i], gi))
    elif blk != 0 and kv.pool.blk[blk].key != 0 and kv.pool.blk[blk].tag <= TAG_DEFER:
        bp_key_deferred(&kv.pool, blk)
    return 0


cdef int kv_key_lazy(KVCacheC* kv, ReqC* r) except -1 nogil:
    """``r`` is preempted: its re-admission will look up its own blocks, so those it cached
    without keys get them now, the keys they would have had since they were cached."""
    cdef slot_t s = r.slot
    cdef int32_t gi, i, n = 0
    cdef block_id_t* table
    if not r.lazy_keys:
        return 0
    r.lazy_keys = 0
    if s < 0:
        return 0
    for gi in range(kv.n_groups):
        if kv.groups[gi].num_cached[s] > n:
            n = kv.groups[gi].num_cached[s]
    if n == 0:
        return 0
    hash_extend(kv, r, n)
    for gi in range(kv.n_groups):
        table = kv_table(kv, gi, s)
        for i in range(kv.groups[gi].num_cached[s]):
            _key_lazy_block(kv, gi, r, i, table[i])
    return 0


cdef int kv_arrive(KVCacheC* kv, ReqC* r) except -1 nogil:
    """``r`` enters the engine (Scheduler.add_request): from now on its lookups may probe the keys
    of the runs it shares, so the blocks deferred there get their keys, and while it is in the
    engine no block of those runs is deferred (_cache_group)."""
    cdef int32_t m, node
    if kv.pool.n_nodes == 0:
        return 0
    for m in range(r.node_n):
        node = kv.run_node[r.node_off + m]
        kv.pool.node_present[node] += 1
        if kv.pool.node_head[node] != -1:
            bp_materialize(&kv.pool, node)
    return 0


cdef int kv_node_hashes(KVCacheC* kv, int32_t n_nodes, const int32_t* longest) except -1 nogil:
    """Room for the hashes of the blocks ending in each node's run (hashing's _extend_shared):
    at most longest // hash_block_size + 2 of them."""
    cdef int32_t i
    mem_grow(<void**>&kv.node_hash_base, 0, n_nodes + 1, sizeof(int64_t))
    mem_grow(<void**>&kv.node_hash_n, 0, n_nodes, sizeof(int32_t))
    for i in range(n_nodes):
        kv.node_hash_base[i + 1] = kv.node_hash_base[i] + longest[i] // kv.hash_block_size + 2
    mem_resize(<void**>&kv.node_hash, kv.node_hash_base[n_nodes], sizeof(hash_t))  # read below node_hash_n only
    return 0


cdef void kv_depart(KVCacheC* kv, ReqC* r) noexcept nogil:
    """``r`` finished: it never looks anything up again."""
    cdef int32_t m
    if kv.pool.n_nodes == 0:
        return
    for m in range(r.node_n):
        kv.pool.node_present[kv.run_node[r.node_off + m]] -= 1
