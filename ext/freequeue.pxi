# vLLM's free block queue as a ring of block ids with stale slots (included by blockpool.pyx).
#
# The order is exactly that of vLLM's doubly linked free list (vllm/v1/core/kv_cache_utils.py
# FreeKVCacheBlockQueue): the blocks of the live slots of BlockPoolC.queue from q_head to q_tail.
# A block's ``qpos`` names its live slot; a block leaving the queue from the middle (touch,
# FreeKVCacheBlockQueue.remove) only clears its ``qpos``, leaving its slot stale, so it reads no
# neighbour; popping from the head (popleft_n) reads the ring in order and skips stale slots,
# so the blocks' states are loads at addresses known in advance, where following the linked list
# made each block's load wait for the one before.  Block ids scatter through the queue as it
# serves requests (a queue of 8,192 blocks settles into runs of one or two consecutive ids), so
# the queue keeps ids, not runs.  When the ring is full its live slots are packed in order; the
# ring holds twice the blocks, so packing is rare.


cdef block_id_t bp_head(const BlockPoolC* bp) noexcept nogil:
    """The head of the queue as a ``front`` cursor of bp_free_one (before every block)."""
    return bp.num_blocks


cdef inline bint _live(const BlockPoolC* bp, int64_t pos) noexcept nogil:
    # Whether the slot at ``pos`` holds its block's place in the queue.
    cdef int32_t s = <int32_t>(pos & bp.q_mask)
    return bp.blk[bp.queue[s]].qpos == s


cdef Py_ssize_t bp_free_queue(const BlockPoolC* bp, block_id_t* out) noexcept nogil:
    """The free queue head to tail into ``out`` (room for ``num_free``); returns its length."""
    cdef int64_t pos
    cdef Py_ssize_t n = 0
    for pos in range(bp.q_head, bp.q_tail):
        if _live(bp, pos):
            out[n] = bp.queue[pos & bp.q_mask]
            n += 1
    return n


cdef int _queue_init(BlockPoolC* bp) except -1 nogil:
    # The queue 1 .. N-1 (kv_cache_utils.py FreeKVCacheBlockQueue.__init__ links the blocks in id
    # order; block 0, the null block, is popped at once: BlockPool.__init__).
    cdef int64_t cap = 16
    cdef block_id_t b
    while cap < 2 * (<int64_t>bp.num_blocks + 1):
        cap <<= 1
    bp.queue = <int32_t*>mem_calloc(cap, sizeof(int32_t))
    bp.q_mask = cap - 1
    bp.q_head = 0
    bp.q_tail = 0
    bp.blk[0].qpos = -1
    for b in range(1, bp.num_blocks):
        bp.queue[bp.q_tail] = b
        bp.blk[b].qpos = <int32_t>bp.q_tail
        bp.q_tail += 1
    bp.num_free = bp.num_blocks - 1 if bp.num_blocks > 1 else 0
    return 0


cdef void _pack(BlockPoolC* bp) noexcept nogil:
    # The live slots moved to the front of the ring, in order (a write never passes a read).
    cdef int64_t pos, w = bp.q_head
    cdef int32_t s, b
    for pos in range(bp.q_head, bp.q_tail):
        s = <int32_t>(pos & bp.q_mask)
        b = bp.queue[s]
        if bp.blk[b].qpos == s:
            s = <int32_t>(w & bp.q_mask)
            bp.queue[s] = b
            bp.blk[b].qpos = s
            w += 1
    bp.q_tail = w


cdef inline void _room(BlockPoolC* bp, int64_t k) noexcept nogil:
    # Room for ``k`` more slots (k <= blocks not in the queue, so packing always makes it).
    if bp.q_tail - bp.q_head + k > bp.q_mask + 1:
        _pack(bp)


cdef inline void _put(BlockPoolC* bp, int64_t pos, block_id_t b) noexcept nogil:
    cdef int32_t s = <int32_t>(pos & bp.q_mask)
    bp.queue[s] = b
    bp.blk[b].qpos = s


cdef inline void _unlink(BlockPoolC* bp, block_id_t b) noexcept nogil:
    # FreeKVCacheBlockQueue.remove: ``b`` leaves the queue wherever it sits (its slot goes stale),
    # the others keep their order.
    if bp.blk[b].key != 0:
        bp.cached_free -= 1
    bp.blk[b].qpos = -1
    bp.num_free -= 1


cdef block_id_t bp_pop_free(BlockPoolC* bp) noexcept nogil:
    """Pop the head of the free queue, evicting its key; ref count becomes 1.

    The caller has checked that a free block exists.
    """
    cdef block_id_t b
    while not _live(bp, bp.q_head):
        bp.q_head += 1
    b = bp.queue[bp.q_head & bp.q_mask]
    bp.q_head += 1
    _unlink(bp, b)
    _take(bp, b)
    return b


cdef inline void _take(BlockPoolC* bp, block_id_t b) noexcept nogil:
    # A block out of the free queue for reuse (unlinked, counts updated): one reference, and
    # its keys evicted now (vLLM's lazy eviction, BlockPool._maybe_evict_cached_block).
    cdef BlockC* k = &bp.blk[b]
    k.ref_cnt = 1
    if k.key == 0:
        return  # no primary key: no secondary one either
    if k.tag <= TAG_LAZY:
        _drop_outside(bp.blk, bp.node_head, bp.node_tail, k)
        bp.evictions += 1
    elif bp_remove_hashes(bp, b) > 0:
        bp.evictions += 1


cdef inline void _drop_outside(BlockC* blk, block_id_t* node_head, block_id_t* node_tail,
                               BlockC* k) noexcept nogil:
    # Evict a key the map never held (cached lazily, bp_cache_lazily, or deferred, bp_defer_run):
    # no map entry to drop; a deferred block leaves its node's list.
    if k.tag <= TAG_DEFER:
        _unlink_deferred(blk, node_head, node_tail, k)
    k.key = 0
    k.key_tokens = 0


cdef void bp_pop_n(BlockPoolC* bp, block_id_t* out, Py_ssize_t n) noexcept nogil:
    """FreeKVCacheBlockQueue.popleft_n (BlockPool.get_new_blocks): the first ``n`` free blocks
    into ``out``, as ``bp_pop_free`` pops them one by one.  The caller has checked that ``n``
    are free.

    One read of the ring from the head takes the live slots' blocks out of the queue and for
    reuse, evicting their keys, with the pool's fields in locals (a store to a block cannot move
    them) and only a key in the map (BlockPoolC.far_map: past the near caches) left to a call.
    With a map past the near caches the read fetches the map slot of every such key and a
    second pass over the span of those takes them, in the same order.
    """
    cdef Py_ssize_t i = 0, lo = n
    cdef int64_t pos = bp.q_head
    cdef int64_t mask = bp.q_mask
    cdef const int32_t* q = bp.queue
    cdef BlockC* blk = bp.blk
    cdef block_id_t* node_head = bp.node_head
    cdef block_id_t* node_tail = bp.node_tail
    cdef bint far = bp.far_map
    cdef int32_t s
    cdef block_id_t b, keyed = 0
    cdef int64_t evicted = 0
    cdef BlockC* k
    while i < n:
        s = <int32_t>(pos & mask)
        pos += 1
        b = q[s]
        k = &blk[b]
        if k.qpos != s:
            continue
        k.qpos = -1
        out[i] = b
        i += 1
        if k.key == 0:
            k.ref_cnt = 1  # no primary key: no secondary one either
            continue
        keyed += 1
        if k.tag <= TAG_LAZY:
            k.ref_cnt = 1
            _drop_outside(blk, node_head, node_tail, k)
            evicted += 1
        elif far:
            bp_prefetch_key(bp, k.key)  # taken in the second pass
            if lo == n:
                lo = i - 1
        else:
            k.ref_cnt = 1
            if bp_remove_hashes(bp, b) > 0:
                evicted += 1
    bp.q_head = pos
    bp.cached_free -= keyed
    bp.evictions += evicted
    for i in range(lo, n):
        if blk[out[i]].ref_cnt == 0:
            _take(bp, out[i])
    bp.num_free -= <block_id_t>n


cdef void bp_touch(BlockPoolC* bp, block_id_t b) noexcept nogil:
    """A prefix hit takes a reference (BlockPool.touch: out of the free queue at ref count 0)."""
    if b == 0:
        return
    if bp.blk[b].ref_cnt == 0:
        _unlink(bp, b)
    bp.blk[b].ref_cnt += 1


cdef void bp_free_one(BlockPoolC* bp, block_id_t b, block_id_t* front) noexcept nogil:
    # BlockPool.free_blocks: blocks reaching ref count 0 without a key go to the head after the
    # ones freed before them in this call (prepend_n), blocks with a key to the tail (append_n).
    # ``front``: the block freed last to the head in this call (bp_head: none yet); the blocks
    # freed to the head in this call hold the first slots, q_head to front's, and move down one.
    cdef int64_t pos, end
    if b == 0:
        return
    bp.blk[b].ref_cnt -= 1
    if bp.blk[b].ref_cnt != 0:
        return
    _room(bp, 1)
    if bp.blk[b].key == 0 or not bp.caching:
        if front[0] == bp.num_blocks:
            end = bp.q_head
        else:
            end = bp.q_head + ((bp.blk[front[0]].qpos - bp.q_head) & bp.q_mask) + 1
        for pos in range(bp.q_head, end):
            _put(bp, pos - 1, bp.queue[pos & bp.q_mask])
        bp.q_head -= 1
        _put(bp, end - 1, b)
        front[0] = b
    else:
        _put(bp, bp.q_tail, b)
        bp.q_tail += 1
        bp.cached_free += 1
    bp.num_free += 1


cdef void bp_free_reversed(BlockPoolC* bp, const block_id_t* blocks, Py_ssize_t n) noexcept nogil:
    """Free ``blocks[n-1], ..., blocks[0]`` in that eviction order.

    vLLM passes a request's table reversed to ``BlockPool.free_blocks``.
    """
    cdef Py_ssize_t i, lo = n, hi = -1
    cdef block_id_t b, front
    cdef int64_t n_front = 0, pos, tail
    cdef int32_t s
    cdef block_id_t added = 0, keyed = 0
    cdef BlockC* k
    cdef BlockC* blk = bp.blk
    cdef int32_t* q
    cdef int64_t mask = bp.q_mask
    cdef bint caching = bp.caching
    # vLLM's free_blocks: the blocks reaching ref count 0 with a key go last in the queue
    # (append_n), in this order: written at once; those without one go first (prepend_n), in this
    # order: counted and marked with where they reached 0 (qpos -2 - i: a block listed twice
    # goes where its second entry is), then written in front of the head.  Counts in locals.
    if n == 1:
        # One block (a Mamba state retired): the general moves, without their bookkeeping.
        front = bp_head(bp)
        bp_free_one(bp, blocks[0], &front)
        return
    _room(bp, n if n < bp.num_blocks else bp.num_blocks)
    q = bp.queue
    tail = bp.q_tail
    for i in range(n - 1, -1, -1):
        b = blocks[i]
        if b == 0:
            continue
        k = &blk[b]
        k.ref_cnt -= 1
        if k.ref_cnt != 0:
            continue
        added += 1
        if k.key == 0 or not caching:
            k.qpos = <int32_t>(-2 - i)
            n_front += 1
            lo = i
            if hi < 0:
                hi = i
        else:
            s = <int32_t>(tail & mask)
            q[s] = b
            k.qpos = s
            tail += 1
            keyed += 1
    bp.q_tail = tail
    bp.cached_free += keyed
    bp.num_free += added
    if n_front == 0:
        return
    pos = bp.q_head - n_front
    bp.q_head = pos
    for i in range(hi, lo - 1, -1):
        b = blocks[i]
        if b != 0 and bp.blk[b].qpos == <int32_t>(-2 - i):
            _put(bp, pos, b)
            pos += 1


cdef void bp_free_ordered(BlockPoolC* bp, const block_id_t* blocks, Py_ssize_t n) noexcept nogil:
    """Free ``blocks[0], ..., blocks[n-1]`` in that eviction order."""
    cdef Py_ssize_t i
    cdef block_id_t front = bp_head(bp)
    for i in range(n):
        bp_free_one(bp, blocks[i], &front)
