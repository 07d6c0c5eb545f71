"""The KV-cache manager of one full-attention group, as C functions.

What is reproduced (vLLM 0.31/0.32):

* ``get_computed_blocks`` (``KVCacheManager.get_computed_blocks``): no hit
  without prefix caching; otherwise the longest run of cached full blocks from
  the start, at most ``num_tokens - 1`` tokens, so a fully cached block-aligned
  prompt recomputes its last block (``FullAttentionManager.find_longest_cache_hit``).
* ``allocate_slots`` (``KVCacheManager.allocate_slots``): the full-sequence
  gate, the watermark, blocks needed counting evictable hit blocks
  (``SingleTypeKVCacheManager.get_num_blocks_to_allocate``), touch of hits
  before new blocks are popped, and caching of every block completed by the
  scheduled tokens at schedule time (``cache_blocks``).
* ``free`` (``SingleTypeKVCacheManager.free``): the table freed tail first.

Token identities are compact segments (see ``hashing.pxd``); block hashes are
computed lazily per request, in order, with a cursor so no token is visited
twice.  Per-request tables and hashes live in rows ("slots") of preallocated
arrays, grown geometrically; nothing is allocated per step.
"""

from cpython.mem cimport PyMem_RawCalloc, PyMem_RawFree, PyMem_RawRealloc
from libc.string cimport memset

from aisim._core.blockpool cimport (
    BlockPoolC, bp_cache, bp_free_reversed, bp_init, bp_lookup, bp_pop_free,
    bp_release, bp_touch,
)
from aisim._core.hashing cimport NONE_HASH_SEED, group_key, hash_finish, hash_run
from aisim._core.request cimport ReqC
from aisim._core.types cimport block_id_t, hash_t, int32_t, slot_t, tok_t


cdef inline tok_t cdiv(tok_t a, tok_t b) noexcept nogil:
    return (a + b - 1) // b


cdef inline tok_t _min(tok_t a, tok_t b) noexcept nogil:
    return a if a < b else b


cdef inline tok_t num_tokens(const ReqC* r) noexcept nogil:
    return r.prompt_len + r.num_output


cdef void* _grow(void* p, size_t old_n, size_t new_n, size_t item) noexcept nogil:
    # Overflow-checked geometric growth helper; new memory is zero-filled.
    cdef void* q
    if new_n > (<size_t>-1) // item:
        return NULL
    q = PyMem_RawRealloc(p, new_n * item)
    if q != NULL:
        memset(<char*>q + old_n * item, 0, (new_n - old_n) * item)
    return q


cdef int _grow_slots(KVCacheC* kv, slot_t new_cap) except -1 nogil:
    cdef slot_t old = kv.cap_slots
    cdef slot_t s
    cdef void* p
    p = _grow(kv.hashes, <size_t>old * kv.hash_row, <size_t>new_cap * kv.hash_row, sizeof(hash_t))
    if p == NULL:
        with gil:
            raise MemoryError("KV-cache request rows")
    kv.hashes = <hash_t*>p
    p = _grow(kv.tables, <size_t>old * kv.table_row, <size_t>new_cap * kv.table_row, sizeof(block_id_t))
    if p == NULL:
        with gil:
            raise MemoryError("KV-cache request rows")
    kv.tables = <block_id_t*>p
    p = _grow(kv.table_len, old, new_cap, sizeof(int32_t))
    if p == NULL:
        with gil:
            raise MemoryError("KV-cache request rows")
    kv.table_len = <int32_t*>p
    p = _grow(kv.num_cached, old, new_cap, sizeof(int32_t))
    if p == NULL:
        with gil:
            raise MemoryError("KV-cache request rows")
    kv.num_cached = <int32_t*>p
    p = _grow(kv.num_hashed, old, new_cap, sizeof(int32_t))
    if p == NULL:
        with gil:
            raise MemoryError("KV-cache request rows")
    kv.num_hashed = <int32_t*>p
    p = _grow(kv.cur_seg, old, new_cap, sizeof(int32_t))
    if p == NULL:
        with gil:
            raise MemoryError("KV-cache request rows")
    kv.cur_seg = <int32_t*>p
    p = _grow(kv.cur_off, old, new_cap, sizeof(tok_t))
    if p == NULL:
        with gil:
            raise MemoryError("KV-cache request rows")
    kv.cur_off = <tok_t*>p
    p = _grow(kv.free_slots, old, new_cap, sizeof(slot_t))
    if p == NULL:
        with gil:
            raise MemoryError("KV-cache request rows")
    kv.free_slots = <slot_t*>p
    # New rows go on the free stack so that the lowest row is used first.
    for s in range(new_cap - 1, old - 1, -1):
        kv.free_slots[kv.n_free_slots] = s
        kv.n_free_slots += 1
    kv.cap_slots = new_cap
    return 0


cdef int kv_init(KVCacheC* kv, block_id_t num_blocks, tok_t block_size, tok_t max_model_len,
                 bint caching, block_id_t watermark_blocks, slot_t initial_slots) except -1 nogil:
    memset(kv, 0, sizeof(KVCacheC))
    bp_init(&kv.pool, num_blocks, caching)
    kv.block_size = block_size
    kv.max_model_len = max_model_len
    kv.caching = caching
    kv.watermark_blocks = watermark_blocks
    kv.hash_row = <int32_t>(max_model_len // block_size + 1)
    kv.table_row = <int32_t>(cdiv(max_model_len, block_size) + 1)
    kv.hit = <block_id_t*>PyMem_RawCalloc(kv.table_row, sizeof(block_id_t))
    if kv.hit == NULL:
        with gil:
            raise MemoryError("KV-cache lookup buffer")
    _grow_slots(kv, initial_slots if initial_slots > 0 else 1)
    return 0


cdef void kv_release(KVCacheC* kv) noexcept nogil:
    bp_release(&kv.pool)
    PyMem_RawFree(kv.hashes)
    PyMem_RawFree(kv.tables)
    PyMem_RawFree(kv.table_len)
    PyMem_RawFree(kv.num_cached)
    PyMem_RawFree(kv.num_hashed)
    PyMem_RawFree(kv.cur_seg)
    PyMem_RawFree(kv.cur_off)
    PyMem_RawFree(kv.free_slots)
    PyMem_RawFree(kv.hit)
    memset(kv, 0, sizeof(KVCacheC))


cdef int kv_acquire_slot(KVCacheC* kv, ReqC* r) except -1 nogil:
    """Give ``r`` a row for its table and hashes (kept across preemptions)."""
    cdef slot_t s
    if r.slot >= 0:
        return 0
    if kv.n_free_slots == 0:
        _grow_slots(kv, kv.cap_slots * 2)
    kv.n_free_slots -= 1
    s = kv.free_slots[kv.n_free_slots]
    r.slot = s
    kv.table_len[s] = 0
    kv.num_cached[s] = -1
    kv.num_hashed[s] = 0
    kv.cur_seg[s] = 0
    kv.cur_off[s] = 0
    return 0


cdef void kv_release_slot(KVCacheC* kv, ReqC* r) noexcept nogil:
    if r.slot < 0:
        return
    kv.free_slots[kv.n_free_slots] = r.slot
    kv.n_free_slots += 1
    r.slot = -1


cdef void _ensure_hashes(KVCacheC* kv, ReqC* r, int32_t n_blocks) noexcept nogil:
    """Compute the block hashes of ``r`` up to block ``n_blocks`` (exclusive).

    The caller guarantees those blocks are full (``n_blocks * B <= num_tokens``),
    as vLLM hashes only full blocks (``Request.update_block_hashes``).
    """
    cdef slot_t s = r.slot
    cdef hash_t* hashes = kv.hashes + <Py_ssize_t>s * kv.hash_row
    cdef int32_t j = kv.num_hashed[s]
    cdef int32_t seg = kv.cur_seg[s]
    cdef tok_t off = kv.cur_off[s]
    cdef tok_t need, take, avail, length, first
    cdef hash_t stream, h
    while j < n_blocks:
        h = hashes[j - 1] if j > 0 else <hash_t>NONE_HASH_SEED
        need = kv.block_size
        while need > 0:
            if seg < r.seg_cnt:
                stream = kv.seg_stream[r.seg_off + seg]
                first = kv.seg_first[r.seg_off + seg]
                length = kv.seg_len[r.seg_off + seg]
            else:
                # Output tokens: one stream per request, offset = output index.
                stream = r.out_stream
                first = 0
                length = r.num_output
            avail = length - off
            take = need if need < avail else avail
            h = hash_run(h, stream, first + off, take)
            off += take
            need -= take
            if off == length and seg < r.seg_cnt:
                seg += 1
                off = 0
        hashes[j] = hash_finish(h)
        j += 1
    kv.num_hashed[s] = j
    kv.cur_seg[s] = seg
    kv.cur_off[s] = off


cdef tok_t kv_get_computed_blocks(KVCacheC* kv, ReqC* r) noexcept nogil:
    """Longest prefix hit of ``r`` in tokens; the blocks go to ``kv.hit``.

    vllm/v1/core/kv_cache_manager.py get_computed_blocks: the hit is capped at
    ``num_tokens - 1`` so the last token is recomputed for its logits;
    FullAttentionManager.find_longest_cache_hit scans left to right and stops at
    the first block whose key is missing.
    """
    cdef int32_t max_blocks, i
    cdef hash_t* hashes
    cdef block_id_t b
    kv.hit_n = 0
    if not kv.caching:
        return 0
    max_blocks = <int32_t>((num_tokens(r) - 1) // kv.block_size)
    _ensure_hashes(kv, r, max_blocks)
    hashes = kv.hashes + <Py_ssize_t>r.slot * kv.hash_row
    for i in range(max_blocks):
        b = bp_lookup(&kv.pool, group_key(hashes[i], 0))
        if b < 0:
            break
        kv.hit[i] = b
        kv.hit_n = i + 1
    return kv.hit_n * kv.block_size


cdef block_id_t _blocks_needed(KVCacheC* kv, ReqC* r, tok_t n_tokens, int32_t n_hits) noexcept nogil:
    # SingleTypeKVCacheManager.get_num_blocks_to_allocate for full attention:
    # blocks beyond the table and the hits, plus every hit block that sits in
    # the free queue (touching it takes it out of the queue).
    cdef tok_t required = cdiv(n_tokens, kv.block_size)
    cdef tok_t have = kv.table_len[r.slot]
    cdef tok_t new_blocks
    cdef int32_t i
    cdef block_id_t evictable = 0
    if kv.num_cached[r.slot] >= 0:
        new_blocks = required - have
        return <block_id_t>(new_blocks if new_blocks > 0 else 0)
    new_blocks = required - (n_hits + have)
    if new_blocks < 0:
        new_blocks = 0
    for i in range(n_hits):
        if kv.pool.ref_cnt[kv.hit[i]] == 0:
            evictable += 1
    return <block_id_t>new_blocks + evictable


cdef bint kv_allocate_slots(KVCacheC* kv, ReqC* r, tok_t num_new_tokens, tok_t num_new_computed,
                            bint full_sequence_must_fit, bint has_scheduled_reqs) noexcept nogil:
    """vllm/v1/core/kv_cache_manager.py allocate_slots; False when it returns None.

    ``num_new_computed`` > 0 means the blocks of the last lookup (``kv.hit``)
    are adopted.  Nothing changes when the allocation fails.
    """
    cdef slot_t s = r.slot
    cdef int32_t n_hits = kv.hit_n if num_new_computed > 0 else 0
    cdef tok_t local = r.num_computed + num_new_computed
    cdef tok_t total = _min(local, kv.max_model_len)
    cdef block_id_t wm = 0
    cdef tok_t main_tokens, need_slot, k
    cdef block_id_t* table = kv.tables + <Py_ssize_t>s * kv.table_row
    cdef int32_t i
    if has_scheduled_reqs and (r.status == 1 or r.status == 3):  # WAITING, PREEMPTED
        wm = kv.watermark_blocks
    if full_sequence_must_fit:
        # scheduler_reserve_full_isl: the whole current sequence must fit now.
        if _blocks_needed(kv, r, _min(num_tokens(r), kv.max_model_len), n_hits) + wm > kv.pool.num_free:
            return False
    main_tokens = total + num_new_tokens
    need_slot = _min(main_tokens, kv.max_model_len)
    # (remove_skipped_blocks frees nothing for full attention)
    if _blocks_needed(kv, r, need_slot, n_hits) + wm > kv.pool.num_free:
        return False
    if n_hits > 0:
        # add_local_computed_blocks: touch every hit, then adopt them.
        for i in range(n_hits):
            bp_touch(&kv.pool, kv.hit[i])
            table[i] = kv.hit[i]
        kv.table_len[s] = n_hits
        kv.num_cached[s] = n_hits
    # allocate_new_blocks: pop from the head of the free queue.
    k = cdiv(need_slot, kv.block_size) - kv.table_len[s]
    while k > 0:
        table[kv.table_len[s]] = bp_pop_free(&kv.pool)
        kv.table_len[s] += 1
        k -= 1
    kv_cache_blocks(kv, r, _min(total + num_new_tokens, num_tokens(r)))
    return True


cdef void kv_cache_blocks(KVCacheC* kv, ReqC* r, tok_t n_tokens) noexcept nogil:
    """Register every full block of the first ``n_tokens`` tokens not yet cached.

    SingleTypeKVCacheManager.cache_blocks: ``num_cached_block`` is only set
    when at least one block is newly cached.
    """
    cdef slot_t s = r.slot
    cdef int32_t c, f, i
    cdef block_id_t* table
    cdef hash_t* hashes
    if not kv.caching:
        return
    c = kv.num_cached[s] if kv.num_cached[s] > 0 else 0
    f = <int32_t>(n_tokens // kv.block_size)
    if c >= f:
        return
    _ensure_hashes(kv, r, f)
    table = kv.tables + <Py_ssize_t>s * kv.table_row
    hashes = kv.hashes + <Py_ssize_t>s * kv.hash_row
    for i in range(c, f):
        bp_cache(&kv.pool, table[i], group_key(hashes[i], 0))
    kv.num_cached[s] = f


cdef void kv_free(KVCacheC* kv, ReqC* r) noexcept nogil:
    """Free every block of ``r``, tail first (SingleTypeKVCacheManager.free)."""
    cdef slot_t s = r.slot
    if s < 0:
        return
    bp_free_reversed(&kv.pool, kv.tables + <Py_ssize_t>s * kv.table_row, kv.table_len[s])
    kv.table_len[s] = 0
    kv.num_cached[s] = -1


# ---------------------------------------------------------------- Python handle

cdef class KVCache:
    """A KV-cache manager with its own requests, driven from Python (tests, tools).

    Parameters
    ----------
    num_blocks : int
        Pool size including the null block.
    block_size : int
        Tokens per block.
    max_model_len : int
        Longest sequence.
    enable_caching : bool
        Prefix caching on.
    watermark_blocks : int
        Blocks kept free when admitting waiting requests.
    requests : list of list of (stream, first, length)
        The prompt segments of every request this manager will see.

    Notes
    -----
    Mirrors how vLLM's own tests drive ``KVCacheManager``: the caller sets
    ``num_computed_tokens`` and appends outputs between calls.
    """

    def __cinit__(self, int num_blocks, int block_size, long max_model_len, requests,
                  bint enable_caching=True, int watermark_blocks=0):
        import numpy as np
        cdef Py_ssize_t i, n = len(requests)
        if block_size < 1 or max_model_len < 1 or num_blocks < 2:
            raise ValueError("num_blocks >= 2, block_size >= 1 and max_model_len >= 1 are required")
        streams, firsts, lens, offs, cnts = [], [], [], [], []
        for segs in requests:
            offs.append(len(streams))
            cnts.append(len(segs))
            for st, fi, ln in segs:
                if ln <= 0:
                    raise ValueError("segment lengths must be positive")
                streams.append(st)
                firsts.append(fi)
                lens.append(ln)
        self._segments = (np.asarray(streams + [0], np.uint64), np.asarray(firsts + [0], np.int64),
                          np.asarray(lens + [0], np.int64))
        cdef const hash_t[::1] g_str = self._segments[0]
        cdef const tok_t[::1] g_first = self._segments[1]
        cdef const tok_t[::1] g_len = self._segments[2]
        kv_init(&self.c, num_blocks, block_size, max_model_len, enable_caching, watermark_blocks, 4)
        self.c.seg_stream = &g_str[0]
        self.c.seg_first = &g_first[0]
        self.c.seg_len = &g_len[0]
        self.reqs = <ReqC*>PyMem_RawCalloc(n if n > 0 else 1, sizeof(ReqC))
        if self.reqs == NULL:
            raise MemoryError()
        self.n_reqs = <int>n
        for i in range(n):
            self.reqs[i].prompt_len = sum(l for _, _, l in requests[i])
            self.reqs[i].max_tokens = max_model_len
            self.reqs[i].seg_off = offs[i]
            self.reqs[i].seg_cnt = cnts[i]
            self.reqs[i].out_stream = (<hash_t>1 << 63) | <hash_t>i
            self.reqs[i].status = 1  # WAITING
            self.reqs[i].slot = -1
            kv_acquire_slot(&self.c, &self.reqs[i])

    def __dealloc__(self):
        kv_release(&self.c)
        PyMem_RawFree(self.reqs)

    cdef ReqC* _req(self, int r) except NULL:
        if r < 0 or r >= self.n_reqs:
            raise IndexError(f"no request {r}")
        return &self.reqs[r]

    @property
    def num_free(self):
        return self.c.pool.num_free

    def free_queue(self):
        """Block ids of the free queue from head to tail."""
        out = []
        cdef block_id_t b = self.c.pool.next_free[self.c.pool.num_blocks]
        while b != self.c.pool.num_blocks + 1:
            out.append(b)
            b = self.c.pool.next_free[b]
        return out

    def ref_cnt(self, int b):
        return self.c.pool.ref_cnt[b]

    def num_tokens(self, int r):
        return num_tokens(self._req(r))

    def set_num_computed(self, int r, long n):
        self._req(r).num_computed = n

    def set_running(self, int r):
        """Mark ``r`` RUNNING (no watermark applies to it)."""
        self._req(r).status = 2

    def append_outputs(self, int r, long n=1):
        """Append ``n`` output tokens (vLLM's append_output_token_ids)."""
        self._req(r).num_output += n

    def get_computed_blocks(self, int r):
        """(hit tokens, hit block ids) of the longest prefix hit of ``r``."""
        cdef ReqC* q = self._req(r)
        cdef tok_t hit = kv_get_computed_blocks(&self.c, q)
        return hit, [self.c.hit[i] for i in range(self.c.hit_n)]

    def allocate_slots(self, int r, long num_new_tokens, long num_new_computed=0,
                       bint full_sequence_must_fit=False, bint has_scheduled_reqs=True):
        """vLLM's allocate_slots: the new block ids, or None when it fails.

        ``num_new_computed`` > 0 adopts the blocks of the last lookup of ``r``.
        """
        cdef ReqC* q = self._req(r)
        cdef int32_t before = self.c.table_len[q.slot]
        if not kv_allocate_slots(&self.c, q, num_new_tokens, num_new_computed,
                                 full_sequence_must_fit, has_scheduled_reqs):
            return None
        start = before if num_new_computed == 0 else self.c.hit_n
        return self.blocks(r)[start:]

    def blocks(self, int r):
        """The block table of ``r``."""
        cdef ReqC* q = self._req(r)
        cdef block_id_t* t = self.c.tables + <Py_ssize_t>q.slot * self.c.table_row
        return [t[i] for i in range(self.c.table_len[q.slot])]

    def cache_blocks(self, int r, long num_tokens):
        kv_cache_blocks(&self.c, self._req(r), num_tokens)

    def free(self, int r):
        """Free every block of ``r``, tail first."""
        kv_free(&self.c, self._req(r))
