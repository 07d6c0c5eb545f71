"""vLLM's KV-cache block pool as a C struct and free functions.

Rules reproduced (vLLM 0.31/0.32, ``vllm/v1/core/block_pool.py`` and
``vllm/v1/core/kv_cache_utils.py``):

* block 0 is the null block: popped at start, never free, never counted;
* the free queue is a doubly linked list, initially ``1 .. N-1``; allocation
  pops from the head (``FreeKVCacheBlockQueue.popleft_n``);
* a popped block that still carries a key is evicted from the map first
  (``BlockPool._maybe_evict_cached_block``): eviction is lazy;
* ``touch`` pulls a ref-count-0 block out of the queue wherever it sits;
* ``free_blocks`` takes blocks in eviction order (callers pass a request's
  table reversed): blocks reaching ref count 0 without a key are prepended to
  the head in that order, blocks with a key are appended to the tail in that
  order;
* the map never de-duplicates: a key may map to several blocks, and a lookup
  returns the earliest inserted one still cached (``BlockHashToBlockMap``).

The free queue is intrusive (index arrays, sentinels HEAD = N, TAIL = N + 1)
and the map is open addressing with linear probing and backward-shift deletion
(no tombstones), sized to a power of two at least twice the block count so the
load factor stays at or below one half.
"""

from cpython.mem cimport PyMem_RawCalloc, PyMem_RawFree
from libc.string cimport memset

from aisim._core.types cimport block_id_t, hash_t


cdef inline block_id_t _head(const BlockPoolC* bp) noexcept nogil:
    return bp.num_blocks


cdef inline block_id_t _tail(const BlockPoolC* bp) noexcept nogil:
    return bp.num_blocks + 1


cdef inline void _unlink(BlockPoolC* bp, block_id_t b) noexcept nogil:
    cdef block_id_t p = bp.prev_free[b]
    cdef block_id_t n = bp.next_free[b]
    bp.next_free[p] = n
    bp.prev_free[n] = p
    bp.prev_free[b] = -1
    bp.next_free[b] = -1
    bp.num_free -= 1


cdef inline void _insert_after(BlockPoolC* bp, block_id_t at, block_id_t b) noexcept nogil:
    cdef block_id_t n = bp.next_free[at]
    bp.prev_free[b] = at
    bp.next_free[b] = n
    bp.next_free[at] = b
    bp.prev_free[n] = b
    bp.num_free += 1


cdef int bp_init(BlockPoolC* bp, block_id_t num_blocks, bint caching) except -1 nogil:
    """Allocate and reset the pool (MemoryError when memory runs out)."""
    cdef block_id_t i
    cdef hash_t cap = 16
    memset(bp, 0, sizeof(BlockPoolC))
    while cap < <hash_t>(2 * num_blocks):
        cap <<= 1
    bp.ref_cnt = <int32_t*>PyMem_RawCalloc(num_blocks, sizeof(int32_t))
    bp.key = <hash_t*>PyMem_RawCalloc(num_blocks, sizeof(hash_t))
    bp.next_dup = <block_id_t*>PyMem_RawCalloc(num_blocks, sizeof(block_id_t))
    bp.prev_free = <block_id_t*>PyMem_RawCalloc(num_blocks + 2, sizeof(block_id_t))
    bp.next_free = <block_id_t*>PyMem_RawCalloc(num_blocks + 2, sizeof(block_id_t))
    bp.map_keys = <hash_t*>PyMem_RawCalloc(cap, sizeof(hash_t))
    bp.map_head = <block_id_t*>PyMem_RawCalloc(cap, sizeof(block_id_t))
    if (bp.ref_cnt == NULL or bp.key == NULL or bp.next_dup == NULL
            or bp.prev_free == NULL or bp.next_free == NULL
            or bp.map_keys == NULL or bp.map_head == NULL):
        bp_release(bp)
        with gil:
            raise MemoryError("block pool")
    bp.num_blocks = num_blocks
    bp.caching = caching
    bp.map_mask = cap - 1
    # Free queue HEAD <-> 1 <-> 2 ... <-> N-1 <-> TAIL; block 0 (null) stays out.
    bp.next_free[_head(bp)] = _tail(bp)
    bp.prev_free[_tail(bp)] = _head(bp)
    bp.prev_free[_head(bp)] = -1
    bp.next_free[_tail(bp)] = -1
    bp.prev_free[0] = -1
    bp.next_free[0] = -1
    for i in range(1, num_blocks):
        _insert_after(bp, bp.prev_free[_tail(bp)], i)
    for i in range(num_blocks):
        bp.next_dup[i] = -1
    return 0


cdef void bp_release(BlockPoolC* bp) noexcept nogil:
    PyMem_RawFree(bp.ref_cnt)
    PyMem_RawFree(bp.key)
    PyMem_RawFree(bp.next_dup)
    PyMem_RawFree(bp.prev_free)
    PyMem_RawFree(bp.next_free)
    PyMem_RawFree(bp.map_keys)
    PyMem_RawFree(bp.map_head)
    memset(bp, 0, sizeof(BlockPoolC))


# ---------------------------------------------------------------- hash map

cdef inline hash_t _slot_of(const BlockPoolC* bp, hash_t key) noexcept nogil:
    # Keys are already avalanche-mixed hashes: the low bits index directly.
    return key & bp.map_mask


cdef block_id_t bp_lookup(const BlockPoolC* bp, hash_t key) noexcept nogil:
    """First-inserted block cached under ``key``, or -1."""
    cdef hash_t s = _slot_of(bp, key)
    while bp.map_keys[s] != 0:
        if bp.map_keys[s] == key:
            return bp.map_head[s]
        s = (s + 1) & bp.map_mask
    return -1


cdef void bp_cache(BlockPoolC* bp, block_id_t b, hash_t key) noexcept nogil:
    """Register block ``b`` under ``key`` (appended after earlier blocks with that key)."""
    cdef hash_t s = _slot_of(bp, key)
    cdef block_id_t cur
    bp.key[b] = key
    bp.next_dup[b] = -1
    while bp.map_keys[s] != 0:
        if bp.map_keys[s] == key:
            cur = bp.map_head[s]
            while bp.next_dup[cur] != -1:
                cur = bp.next_dup[cur]
            bp.next_dup[cur] = b
            return
        s = (s + 1) & bp.map_mask
    bp.map_keys[s] = key
    bp.map_head[s] = b


cdef void _map_delete_slot(BlockPoolC* bp, hash_t s) noexcept nogil:
    # Backward-shift deletion keeps every probe chain gap-free (no tombstones).
    cdef hash_t j = s
    cdef hash_t home
    bp.map_keys[s] = 0
    while True:
        j = (j + 1) & bp.map_mask
        if bp.map_keys[j] == 0:
            return
        home = _slot_of(bp, bp.map_keys[j])
        # Move j into the hole s if its home is not cyclically within (s, j].
        if ((j - home) & bp.map_mask) >= ((j - s) & bp.map_mask):
            bp.map_keys[s] = bp.map_keys[j]
            bp.map_head[s] = bp.map_head[j]
            bp.map_keys[j] = 0
            s = j


cdef void bp_uncache(BlockPoolC* bp, block_id_t b) noexcept nogil:
    """Drop block ``b``'s key (vLLM BlockHashToBlockMap.pop(key, block_id))."""
    cdef hash_t key = bp.key[b]
    cdef hash_t s
    cdef block_id_t cur
    if key == 0:
        return
    s = _slot_of(bp, key)
    while bp.map_keys[s] != key:
        s = (s + 1) & bp.map_mask
    if bp.map_head[s] == b:
        if bp.next_dup[b] == -1:
            _map_delete_slot(bp, s)
        else:
            bp.map_head[s] = bp.next_dup[b]
    else:
        cur = bp.map_head[s]
        while bp.next_dup[cur] != b:
            cur = bp.next_dup[cur]
        bp.next_dup[cur] = bp.next_dup[b]
    bp.next_dup[b] = -1
    bp.key[b] = 0
    bp.evictions += 1


# ---------------------------------------------------------------- free queue

cdef block_id_t bp_pop_free(BlockPoolC* bp) noexcept nogil:
    """Pop the head of the free queue, evicting its key; ref count becomes 1.

    The caller has checked that a free block exists.
    """
    cdef block_id_t b = bp.next_free[_head(bp)]
    _unlink(bp, b)
    if bp.key[b] != 0:
        bp_uncache(bp, b)
    bp.ref_cnt[b] = 1
    return b


cdef void bp_touch(BlockPoolC* bp, block_id_t b) noexcept nogil:
    """A prefix hit takes a reference (BlockPool.touch)."""
    if b == 0:
        return
    if bp.ref_cnt[b] == 0:
        _unlink(bp, b)
    bp.ref_cnt[b] += 1


cdef void bp_free_reversed(BlockPoolC* bp, const block_id_t* blocks, Py_ssize_t n) noexcept nogil:
    """Free ``blocks[n-1], ..., blocks[0]`` in that eviction order.

    vLLM passes a request's table reversed to ``BlockPool.free_blocks``: the
    unhashed blocks reaching ref count 0 go to the head in that order
    (``prepend_n``), the hashed ones to the tail in that order (``append_n``).
    """
    cdef Py_ssize_t i
    cdef block_id_t b
    cdef block_id_t front = _head(bp)
    for i in range(n - 1, -1, -1):
        b = blocks[i]
        if b == 0:
            continue
        bp.ref_cnt[b] -= 1
        if bp.ref_cnt[b] != 0:
            continue
        if bp.key[b] == 0 or not bp.caching:
            _insert_after(bp, front, b)
            front = b
        else:
            _insert_after(bp, bp.prev_free[_tail(bp)], b)


# ---------------------------------------------------------------- Python handle

cdef class BlockPool:
    """A vLLM block pool, for tests and inspection.

    Parameters
    ----------
    num_blocks : int
        Blocks in the pool including the null block 0.
    enable_caching : bool
        Prefix caching on.

    Notes
    -----
    The replay core uses the C functions directly; this wrapper validates its
    arguments so that tests can drive the pool from Python.
    """

    def __cinit__(self, int num_blocks, bint enable_caching=True):
        if num_blocks < 2:
            raise ValueError("num_blocks must be at least 2 (the null block and one usable block)")
        bp_init(&self.c, num_blocks, enable_caching)

    def __dealloc__(self):
        bp_release(&self.c)

    @property
    def num_free(self):
        return self.c.num_free

    @property
    def usage(self):
        return bp_usage(&self.c)

    def get_new_blocks(self, int n):
        """Pop ``n`` blocks from the head of the free queue."""
        if n < 0 or n > self.c.num_free:
            raise ValueError(f"cannot allocate {n} blocks with {self.c.num_free} free")
        return [bp_pop_free(&self.c) for _ in range(n)]

    def _check(self, int b):
        if b <= 0 or b >= self.c.num_blocks:
            raise ValueError(f"block id {b} out of range")

    def touch(self, blocks):
        for b in blocks:
            self._check(b)
            bp_touch(&self.c, b)

    def free_blocks(self, ordered_blocks):
        """Free blocks given in eviction order (first evicted first)."""
        import numpy as np
        cdef block_id_t[::1] arr = np.asarray(list(ordered_blocks)[::-1], dtype=np.int32)
        cdef Py_ssize_t i
        for i in range(arr.shape[0]):
            self._check(arr[i])
            if self.c.ref_cnt[arr[i]] <= 0:
                raise ValueError(f"block {arr[i]} is not held")
        if arr.shape[0]:
            bp_free_reversed(&self.c, &arr[0], arr.shape[0])

    def cache_block(self, int b, key):
        """Register held block ``b`` under ``key`` (a non-zero 64-bit integer)."""
        self._check(b)
        if key == 0:
            raise ValueError("key 0 means 'not cached'")
        if self.c.key[b] != 0:
            raise ValueError(f"block {b} is already cached")
        bp_cache(&self.c, b, key)

    def lookup(self, key):
        """The first-inserted block cached under ``key``, or None."""
        cdef block_id_t b = bp_lookup(&self.c, key)
        return None if b < 0 else b

    def ref_cnt(self, int b):
        return self.c.ref_cnt[b]

    def block_key(self, int b):
        return self.c.key[b]

    def free_queue(self):
        """Block ids of the free queue from head to tail."""
        out = []
        cdef block_id_t b = self.c.next_free[self.c.num_blocks]
        while b != self.c.num_blocks + 1:
            out.append(b)
            b = self.c.next_free[b]
        return out
