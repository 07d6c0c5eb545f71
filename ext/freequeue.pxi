# vLLM's free block queue as runs of consecutive block ids (included by blockpool.pyx).
#
# The order is exactly that of vLLM's doubly linked free list (vllm/v1/core/kv_cache_utils.py
# FreeKVCacheBlockQueue): the queue is the runs of BlockPoolC.runs, head to tail, each run the
# blocks first, first + step, ..., last.  A request's blocks are mostly allocated from one run
# and freed together, so a run holds hundreds of blocks: popping n blocks reads the run list
# once per run, and the blocks' own states at addresses known in advance, where the linked list
# had one dependent load per block.  A block's ``run`` names the run holding it, so touch
# (FreeKVCacheBlockQueue.remove) finds its place in one read and splits the run there; the
# shorter side of a split moves to a new run (each block is relabelled O(log n) times in all).
# Appending a block to the end of a run it continues (its id one step on) extends the run.


cdef block_id_t bp_head(const BlockPoolC* bp) noexcept nogil:
    """The head of the queue as a ``front`` cursor of bp_free_one (before every block)."""
    return bp.num_blocks


cdef Py_ssize_t bp_free_queue(const BlockPoolC* bp, block_id_t* out) noexcept nogil:
    """The free queue head to tail into ``out`` (room for ``num_free``); returns its length."""
    cdef int32_t r = bp.runs[RUN_HEAD].next
    cdef Py_ssize_t n = 0
    cdef block_id_t b
    while r != RUN_TAIL:
        b = bp.runs[r].first
        while True:
            out[n] = b
            n += 1
            if b == bp.runs[r].last:
                break
            b += bp.runs[r].step
        r = bp.runs[r].next
    return n


cdef void _runs_init(BlockPoolC* bp) noexcept nogil:
    # The queue 1 .. N-1 as one run (kv_cache_utils.py FreeKVCacheBlockQueue.__init__ links the
    # blocks in id order; block 0, the null block, is popped at once: BlockPool.__init__).
    cdef int32_t i, cap = bp.num_blocks + 2
    for i in range(2, cap):
        bp.runs[i].next = i + 1 if i + 1 < cap else -1
    bp.run_free = 2 if cap > 2 else -1
    bp.runs[RUN_HEAD].next = RUN_TAIL
    bp.runs[RUN_TAIL].prev = RUN_HEAD
    bp.runs[RUN_HEAD].prev = -1
    bp.runs[RUN_TAIL].next = -1
    for i in range(bp.num_blocks):
        bp.blk[i].run = -1
    if bp.num_blocks > 1:
        i = _run_new(bp, RUN_HEAD, 1)
        bp.runs[i].last = bp.num_blocks - 1
        for i in range(1, bp.num_blocks):
            bp.blk[i].run = bp.runs[RUN_HEAD].next
        bp.num_free = bp.num_blocks - 1


cdef inline int32_t _run_new(BlockPoolC* bp, int32_t after, block_id_t b) noexcept nogil:
    # A run of the one block ``b`` right after run ``after`` (never short: runs <= free blocks + 2).
    cdef int32_t r = bp.run_free
    cdef RunC* x = &bp.runs[r]
    cdef int32_t nxt = bp.runs[after].next
    bp.run_free = x.next
    x.first = b
    x.last = b
    x.step = 1
    x.prev = after
    x.next = nxt
    bp.runs[after].next = r
    bp.runs[nxt].prev = r
    return r


cdef inline void _run_drop(BlockPoolC* bp, int32_t r) noexcept nogil:
    # Unlink the emptied run ``r`` and return it to the unused ones.
    cdef RunC* x = &bp.runs[r]
    bp.runs[x.prev].next = x.next
    bp.runs[x.next].prev = x.prev
    x.next = bp.run_free
    bp.run_free = r


cdef inline void _run_label(BlockPoolC* bp, block_id_t first, block_id_t last, int32_t step,
                            int32_t r) noexcept nogil:
    # Blocks first, first + step, ..., last now belong to run ``r``.
    cdef block_id_t b = first
    while True:
        bp.blk[b].run = r
        if b == last:
            return
        b += step


cdef void _run_split(BlockPoolC* bp, int32_t r, block_id_t b) noexcept nogil:
    # Split run ``r`` just before its block ``b`` (not its first): two runs, in the same order.
    # The shorter side moves to the new run.
    cdef RunC* x = &bp.runs[r]
    cdef int32_t st = x.step
    cdef block_id_t left = (b - x.first) * st           # blocks before b
    cdef block_id_t right = (x.last - b) * st + 1       # b and the blocks after it
    cdef int32_t y
    if right <= left:
        y = _run_new(bp, r, b)
        bp.runs[y].last = x.last
        bp.runs[y].step = st
        x.last = b - st
        _run_label(bp, b, bp.runs[y].last, st, y)
    else:
        y = _run_new(bp, x.prev, x.first)
        bp.runs[y].last = b - st
        bp.runs[y].step = st
        x.first = b
        _run_label(bp, bp.runs[y].first, b - st, st, y)


cdef inline int32_t _run_append(BlockPoolC* bp, int32_t r, block_id_t b) noexcept nogil:
    # Put block ``b`` into the queue right after the last block of run ``r`` (RUN_HEAD: first in
    # the queue): run ``r`` grows when ``b`` continues it, else a new run follows it.  Returns
    # the run holding ``b``.
    cdef RunC* x = &bp.runs[r]
    cdef block_id_t d = b - x.last
    if r != RUN_HEAD and (d == 1 or d == -1) and (x.first == x.last or d == x.step):
        x.step = d
        x.last = b
    else:
        r = _run_new(bp, r, b)
    bp.blk[b].run = r
    bp.num_free += 1
    return r


cdef inline void _unlink(BlockPoolC* bp, block_id_t b) noexcept nogil:
    # FreeKVCacheBlockQueue.remove: ``b`` leaves the queue wherever it sits, the others keep
    # their order.
    cdef int32_t r = bp.blk[b].run
    cdef RunC* x = &bp.runs[r]
    if bp.blk[b].key != 0:
        bp.cached_free -= 1
    if x.first == x.last:
        _run_drop(bp, r)
    elif b == x.first:
        x.first += x.step
    elif b == x.last:
        x.last -= x.step
    else:
        _run_split(bp, r, b)
        x = &bp.runs[bp.blk[b].run]
        x.first += x.step
    bp.blk[b].run = -1
    bp.num_free -= 1


cdef block_id_t bp_pop_free(BlockPoolC* bp) noexcept nogil:
    """Pop the head of the free queue, evicting its key; ref count becomes 1.

    The caller has checked that a free block exists.
    """
    cdef block_id_t b = bp.runs[bp.runs[RUN_HEAD].next].first
    _unlink(bp, b)
    _take(bp, b)
    return b


cdef inline void _take(BlockPoolC* bp, block_id_t b) noexcept nogil:
    # A block out of the free queue for reuse (unlinked, counts updated): one reference, and
    # its keys evicted now (vLLM's lazy eviction, BlockPool._maybe_evict_cached_block).
    cdef BlockC* k = &bp.blk[b]
    k.ref_cnt = 1
    if k.key != 0 and (k.tag == TAG_LAZY or k.tag == TAG_DEFER):
        # Cached lazily (bp_cache_lazily, bp_defer): evicted with no map entry to drop.
        if k.tag == TAG_DEFER:
            _undefer(bp, b)
        k.key = 0
        k.key_tokens = 0
        bp.evictions += 1
    elif k.key != 0 or k.sec_head != -1:
        if bp_remove_hashes(bp, b) > 0:
            bp.evictions += 1


cdef void bp_pop_n(BlockPoolC* bp, block_id_t* out, Py_ssize_t n) noexcept nogil:
    """FreeKVCacheBlockQueue.popleft_n (BlockPool.get_new_blocks): the first ``n`` free blocks
    into ``out``, as ``bp_pop_free`` pops them one by one.  The caller has checked that ``n``
    are free."""
    cdef Py_ssize_t i = 0, m
    cdef int32_t r
    cdef RunC* x
    cdef block_id_t b
    cdef int32_t st
    cdef BlockC* k
    # Whole runs from the head, the last one cut where the n blocks end.
    while i < n:
        r = bp.runs[RUN_HEAD].next
        x = &bp.runs[r]
        b = x.first
        st = x.step
        m = (x.last - b) * st + 1
        if m > n - i:
            m = n - i
            x.first = b + <block_id_t>m * st
        else:
            _run_drop(bp, r)
        while m > 0:
            out[i] = b
            b += st
            i += 1
            m -= 1
    # The blocks leave the queue, fetching the map slot of every key to evict; a second pass
    # takes them in the same order, evicting their keys from slots already in cache.
    for i in range(n):
        k = &bp.blk[out[i]]
        k.run = -1
        if k.key != 0:
            bp.cached_free -= 1
            if k.tag != TAG_LAZY and k.tag != TAG_DEFER:
                bp_prefetch_key(bp, k.key)
    for i in range(n):
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
    # ``front``: the block freed last to the head in this call (bp_head: none yet).
    cdef int32_t r
    if b == 0:
        return
    bp.blk[b].ref_cnt -= 1
    if bp.blk[b].ref_cnt != 0:
        return
    if bp.blk[b].key == 0 or not bp.caching:
        if front[0] == bp.num_blocks:
            r = RUN_HEAD
        else:
            r = bp.blk[front[0]].run
            if bp.runs[r].last != front[0]:
                # A block appended to the tail continued front's run: cut it after front.
                _run_split(bp, r, front[0] + bp.runs[r].step)
                r = bp.blk[front[0]].run
        _run_append(bp, r, b)
        front[0] = b
    else:
        _run_append(bp, bp.runs[RUN_TAIL].prev, b)
        bp.cached_free += 1


cdef void bp_free_reversed(BlockPoolC* bp, const block_id_t* blocks, Py_ssize_t n) noexcept nogil:
    """Free ``blocks[n-1], ..., blocks[0]`` in that eviction order.

    vLLM passes a request's table reversed to ``BlockPool.free_blocks``.
    """
    cdef Py_ssize_t i
    cdef block_id_t b
    cdef int32_t front = RUN_HEAD
    cdef bint tail = False
    # vLLM's free_blocks: the blocks reaching ref count 0 without a key go first in the queue
    # (prepend_n), in this order; those with a key go last (append_n), in this order.  The first
    # pass places the former and marks each of the latter with where it reached 0 (run -2 - i: a
    # block listed twice goes where its second entry is), the second pass appends them.
    for i in range(n - 1, -1, -1):
        b = blocks[i]
        if b == 0:
            continue
        bp.blk[b].ref_cnt -= 1
        if bp.blk[b].ref_cnt != 0:
            continue
        if bp.blk[b].key == 0 or not bp.caching:
            front = _run_append(bp, front, b)
        else:
            bp.blk[b].run = <int32_t>(-2 - i)
            tail = True
    if not tail:
        return
    for i in range(n - 1, -1, -1):
        b = blocks[i]
        if b != 0 and bp.blk[b].run == <int32_t>(-2 - i):
            _run_append(bp, bp.runs[RUN_TAIL].prev, b)
            bp.cached_free += 1


cdef void bp_free_ordered(BlockPoolC* bp, const block_id_t* blocks, Py_ssize_t n) noexcept nogil:
    """Free ``blocks[0], ..., blocks[n-1]`` in that eviction order."""
    cdef Py_ssize_t i
    cdef block_id_t front = bp_head(bp)
    for i in range(n):
        bp_free_one(bp, blocks[i], &front)
