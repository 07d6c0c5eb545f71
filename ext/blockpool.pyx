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
  returns the earliest inserted one still cached (``BlockHashToBlockMap``);
* a block has one primary key (``block_hash``, with the prefix length it
  covers) and, in fine-grained mode, secondary keys for partial entries
  (``cached_block_hashes_by_block``); eviction drops all of them
  (``BlockPool._remove_cached_block_hashes``).

A block can be cached *lazily* (``bp_cache_lazily``): it is cached in every way the
free queue and the counts see (its key slot is non-zero, so a free appends it to
the tail; it counts in ``cached_free``; popping it is an eviction), but its key
is neither computed nor in the map.  The KV-cache manager does this for a
request no other request can share a block with, whose keys no lookup could
find; ``bp_key_lazy`` gives such a block its real key when a lookup could
(kvcache's ``kv_key_lazy``).

The free queue is a ring of block ids in exactly the order of vLLM's linked
list, where a block leaving from the middle leaves a stale slot (freequeue.pxi).  The map is open addressing with linear
probing and backward-shift deletion (no tombstones), sized to a power of two at least twice the block count so the
load factor stays at or below one half; a slot holds its key and the earliest
block cached under it, and heads a chain of entries for the later ones (in
insertion order) drawn from a pooled free list.
"""

from libc.string cimport memset

from aisim._core.memory cimport mem_calloc, mem_free, mem_grow
from aisim._core.types cimport block_id_t, flag_t, hash_t, int32_t, int64_t, tok_t

# The key slot of a lazily cached block: non-zero, never looked up (its tag says it is lazy).
cdef enum:
    LAZY_KEY = 1

# A map of at most this many bytes stays in a core's near caches while a replay runs (a typical
# 256 KiB to 2 MiB second level): its slots are not fetched ahead (BlockPoolC.far_map).
cdef enum:
    NEAR_MAP_BYTES = 256 * 1024


cdef int bp_init(BlockPoolC* bp, block_id_t num_blocks, bint caching) except -1 nogil:
    """Allocate and reset the pool (MemoryError when memory runs out)."""
    cdef block_id_t i
    cdef hash_t cap = 16
    memset(bp, 0, sizeof(BlockPoolC))
    while cap < <hash_t>(2 * num_blocks):
        cap <<= 1
    bp.blk = <BlockC*>mem_calloc(num_blocks, sizeof(BlockC))
    bp.map = <MapEntC*>mem_calloc(cap, sizeof(MapEntC))
    bp.num_blocks = num_blocks
    bp.caching = caching
    bp.map_mask = cap - 1
    bp.far_map = cap * sizeof(MapEntC) > NEAR_MAP_BYTES
    bp.sec_head = <int32_t*>mem_calloc(num_blocks, sizeof(int32_t))
    for i in range(num_blocks):
        bp.sec_head[i] = -1
    _queue_init(bp)
    bp.ent_free = -1
    bp.sec_free = -1
    _grow_entries(bp, num_blocks + 16)
    _grow_secondary(bp, 16)
    return 0


cdef void bp_release(BlockPoolC* bp) noexcept nogil:
    mem_free(bp.blk)
    mem_free(bp.queue)
    mem_free(bp.ent_block)
    mem_free(bp.ent_next)
    mem_free(bp.sec_key)
    mem_free(bp.sec_next)
    mem_free(bp.sec_head)
    mem_free(bp.map)
    mem_free(bp.ev_key)
    mem_free(bp.ev_tag)
    mem_free(bp.ev_add)
    mem_free(bp.node_present)
    mem_free(bp.node_head)
    mem_free(bp.node_tail)
    memset(bp, 0, sizeof(BlockPoolC))


# ---------------------------------------------------------------- pooled entries

cdef int _grow_entries(BlockPoolC* bp, int32_t new_cap) except -1 nogil:
    # New entries go on the free list, lowest index first.
    cdef int32_t i
    mem_grow(<void**>&bp.ent_block, bp.ent_cap, new_cap, sizeof(int32_t))
    mem_grow(<void**>&bp.ent_next, bp.ent_cap, new_cap, sizeof(int32_t))
    for i in range(new_cap - 1, bp.ent_cap - 1, -1):
        bp.ent_next[i] = bp.ent_free
        bp.ent_free = i
    bp.ent_cap = new_cap
    return 0


cdef int _grow_secondary(BlockPoolC* bp, int32_t new_cap) except -1 nogil:
    # New entries go on the free list, lowest index first.
    cdef int32_t i
    mem_grow(<void**>&bp.sec_key, bp.sec_cap, new_cap, sizeof(hash_t))
    mem_grow(<void**>&bp.sec_next, bp.sec_cap, new_cap, sizeof(int32_t))
    for i in range(new_cap - 1, bp.sec_cap - 1, -1):
        bp.sec_next[i] = bp.sec_free
        bp.sec_free = i
    bp.sec_cap = new_cap
    return 0


# ---------------------------------------------------------------- hash map

cdef inline hash_t _slot_of(const BlockPoolC* bp, hash_t key) noexcept nogil:
    # Keys are already avalanche-mixed hashes: the low bits index directly.
    return key & bp.map_mask


cdef inline hash_t _find_slot(const BlockPoolC* bp, hash_t key) noexcept nogil:
    # The slot holding ``key``, or the empty slot where it would go.
    cdef hash_t s = _slot_of(bp, key)
    while bp.map[s].key != 0 and bp.map[s].key != key:
        s = (s + 1) & bp.map_mask
    return s


cdef block_id_t bp_lookup(const BlockPoolC* bp, hash_t key) noexcept nogil:
    """First-inserted block still cached under ``key``, or -1 (get_one_block)."""
    cdef hash_t s = _find_slot(bp, key)
    if bp.map[s].key == 0:
        return -1
    return bp.map[s].first


cdef bint bp_contains(const BlockPoolC* bp, hash_t key, block_id_t b) noexcept nogil:
    """Whether block ``b`` is cached under ``key`` (BlockHashToBlockMap.contain)."""
    return _slot_has(bp, _find_slot(bp, key), b)


cdef inline bint _slot_has(const BlockPoolC* bp, hash_t s, block_id_t b) noexcept nogil:
    # Whether block ``b`` is among the blocks of the key in slot ``s`` (empty: none).
    cdef int32_t e
    if bp.map[s].key == 0:
        return False
    if bp.map[s].first == b:
        return True
    e = bp.map[s].rest
    while e != -1:
        if bp.ent_block[e] == b:
            return True
        e = bp.ent_next[e]
    return False


cdef int _map_insert(BlockPoolC* bp, hash_t s, hash_t key, block_id_t b, int32_t tag) except -1 nogil:
    # Append ``b`` to the blocks of ``key``, whose slot (or the empty one where it goes) is ``s``
    # (BlockHashToBlockMap.insert); ``tag`` goes with the key's event.
    cdef int32_t e, cur
    if bp.map[s].key == 0:
        bp.map[s].key = key
        bp.map[s].first = b
        bp.map[s].rest = -1
        if bp.log_keys:
            _log_key(bp, key, 1, tag)
        bp.n_keys += 1
        return 0
    if bp.ent_free == -1:
        _grow_entries(bp, bp.ent_cap * 2)
    e = bp.ent_free
    bp.ent_free = bp.ent_next[e]
    bp.ent_block[e] = b
    bp.ent_next[e] = -1
    cur = bp.map[s].rest
    if cur == -1:
        bp.map[s].rest = e
        return 0
    while bp.ent_next[cur] != -1:
        cur = bp.ent_next[cur]
    bp.ent_next[cur] = e
    return 0


cdef int _log_key(BlockPoolC* bp, hash_t key, flag_t add, int32_t tag) except -1 nogil:
    # Record a key entering the map, keeping room for every key present to leave it too.
    cdef int64_t need = bp.ev_n + bp.n_keys + 2
    cdef int64_t new
    if need > bp.ev_cap:
        new = bp.ev_cap * 2 if bp.ev_cap * 2 > need else need
        mem_grow(<void**>&bp.ev_key, bp.ev_cap, new, sizeof(hash_t))
        mem_grow(<void**>&bp.ev_tag, bp.ev_cap, new, sizeof(int32_t))
        mem_grow(<void**>&bp.ev_add, bp.ev_cap, new, sizeof(flag_t))
        bp.ev_cap = new
    bp.ev_key[bp.ev_n] = key
    bp.ev_tag[bp.ev_n] = tag
    bp.ev_add[bp.ev_n] = add
    bp.ev_n += 1
    return 0


cdef int bp_log_keys(BlockPoolC* bp) except -1 nogil:
    """Start recording key events (before any key is cached)."""
    cdef int64_t need = bp.n_keys + 16
    if bp.ev_cap < need:
        mem_grow(<void**>&bp.ev_key, bp.ev_cap, need, sizeof(hash_t))
        mem_grow(<void**>&bp.ev_tag, bp.ev_cap, need, sizeof(int32_t))
        mem_grow(<void**>&bp.ev_add, bp.ev_cap, need, sizeof(flag_t))
        bp.ev_cap = need
    bp.log_keys = True
    bp.ev_n = 0
    return 0


cdef void _map_delete_slot(BlockPoolC* bp, hash_t s) noexcept nogil:
    # Backward-shift deletion keeps every probe chain gap-free (no tombstones).
    cdef hash_t j = s
    cdef hash_t home
    bp.map[s].key = 0
    while True:
        j = (j + 1) & bp.map_mask
        if bp.map[j].key == 0:
            return
        home = _slot_of(bp, bp.map[j].key)
        # Move j into the hole s unless its home lies cyclically within (s, j].
        if ((j - home) & bp.map_mask) >= ((j - s) & bp.map_mask):
            bp.map[s] = bp.map[j]
            bp.map[j].key = 0
            s = j


cdef bint _map_pop(BlockPoolC* bp, hash_t key, block_id_t b, int32_t tag) noexcept nogil:
    # Remove only block ``b`` from ``key`` (BlockHashToBlockMap.pop(key, block_id)); ``tag`` goes
    # with the key's event.
    cdef hash_t s = _find_slot(bp, key)
    cdef int32_t e, prev = -1
    if bp.map[s].key == 0:
        return False
    if bp.map[s].first == b:
        e = bp.map[s].rest
        if e == -1:
            _map_delete_slot(bp, s)
            bp.n_keys -= 1
            if bp.log_keys:
                # Room is guaranteed (ev_cap >= ev_n + n_keys before this removal).
                bp.ev_key[bp.ev_n] = key
                bp.ev_tag[bp.ev_n] = tag
                bp.ev_add[bp.ev_n] = 0
                bp.ev_n += 1
            return True
        # The next block inserted under the key becomes the first.
        bp.map[s].first = bp.ent_block[e]
        bp.map[s].rest = bp.ent_next[e]
    else:
        e = bp.map[s].rest
        while e != -1 and bp.ent_block[e] != b:
            prev = e
            e = bp.ent_next[e]
        if e == -1:
            return False
        if prev == -1:
            bp.map[s].rest = bp.ent_next[e]
        else:
            bp.ent_next[prev] = bp.ent_next[e]
    bp.ent_next[e] = bp.ent_free
    bp.ent_free = e
    return True


# ---------------------------------------------------------------- block keys

cdef int bp_insert_block_hash(BlockPoolC* bp, block_id_t b, hash_t key, tok_t num_tokens,
                               int32_t tag) except -1 nogil:
    """BlockPool._insert_block_hash: primary key if the block has none, else secondary.

    ``tag``: what a deployment's router calls the key (BlockC.tag), kept for a primary key."""
    cdef int32_t e
    cdef hash_t s
    if bp.blk[b].key == key:
        return 0
    s = _find_slot(bp, key)  # one probe finds whether b holds the key and where it goes
    if _slot_has(bp, s, b):
        return 0
    if bp.blk[b].key == 0:
        bp.blk[b].key = key
        bp.blk[b].key_tokens = num_tokens
        bp.blk[b].tag = tag
        if bp.blk[b].ref_cnt == 0 and b != 0:
            bp.cached_free += 1
    else:
        if bp.sec_free == -1:
            _grow_secondary(bp, bp.sec_cap * 2)
        e = bp.sec_free
        bp.sec_free = bp.sec_next[e]
        bp.sec_key[e] = key
        bp.sec_next[e] = bp.sec_head[b]
        bp.sec_head[b] = e
        bp.n_sec += 1
        return _map_insert(bp, s, key, b, TAG_NONE)
    return _map_insert(bp, s, key, b, tag)


cdef int bp_cache(BlockPoolC* bp, block_id_t b, hash_t key) except -1 nogil:
    """Register an uncached held block under ``key`` as its primary key (tests)."""
    return bp_insert_block_hash(bp, b, key, 0, TAG_NONE)


cdef int bp_remove_hashes(BlockPoolC* bp, block_id_t b) noexcept nogil:
    """Drop every key of ``b`` from the map (BlockPool._remove_cached_block_hashes).

    Returns how many map entries were removed.
    """
    cdef int removed = 0
    cdef int32_t e, nxt
    cdef BlockC* k = &bp.blk[b]
    if k.key == 0:
        return 0  # no primary key: no secondary one either
    if k.ref_cnt == 0 and b != 0:
        bp.cached_free -= 1
    if k.tag <= TAG_LAZY:
        # A key the map never held (bp_cache_lazily, bp_defer_run): evicted all the same.
        if k.tag <= TAG_DEFER:
            _undefer(bp, b)
        removed += 1
    else:
        removed += _map_pop(bp, k.key, b, k.tag)
    if bp.n_sec > 0:
        e = bp.sec_head[b]
        while e != -1:
            removed += _map_pop(bp, bp.sec_key[e], b, TAG_NONE)
            nxt = bp.sec_next[e]
            bp.sec_next[e] = bp.sec_free
            bp.sec_free = e
            bp.n_sec -= 1
            e = nxt
        bp.sec_head[b] = -1
    k.key = 0
    k.key_tokens = 0
    return removed


cdef void bp_cache_lazily(BlockPoolC* bp, const block_id_t* blocks, int32_t n, tok_t tokens,
                          tok_t block_size) noexcept nogil:
    """Cache the uncached ``blocks[0 .. n)`` without their keys (see the module notes); block i
    ends at ``tokens + (i + 1) * block_size`` tokens.  Null entries are skipped."""
    cdef int32_t i
    cdef BlockC* blk = bp.blk
    cdef BlockC* k
    cdef block_id_t unreferenced = 0
    for i in range(n):
        if blocks[i] == 0:
            continue
        k = &blk[blocks[i]]
        k.key = LAZY_KEY
        k.key_tokens = <int32_t>(tokens + (i + 1) * block_size)
        k.tag = TAG_LAZY
        if k.ref_cnt == 0:
            unreferenced += 1
    bp.cached_free += unreferenced


cdef int bp_key_lazy(BlockPoolC* bp, block_id_t b, hash_t key) except -1 nogil:
    """Give the lazily cached block ``b`` its key: into the map as its primary key."""
    bp.blk[b].key = key
    bp.blk[b].tag = TAG_NONE
    return _map_insert(bp, _find_slot(bp, key), key, b, TAG_NONE)


# ---------------------------------------------------------------- deferred keys

cdef int bp_nodes(BlockPoolC* bp, int32_t n_nodes) except -1 nogil:
    """Room for ``n_nodes`` runs of shared tokens, each with no request and no deferred block."""
    cdef int32_t i
    mem_grow(<void**>&bp.node_present, 0, n_nodes, sizeof(int32_t))
    mem_grow(<void**>&bp.node_head, 0, n_nodes, sizeof(block_id_t))
    mem_grow(<void**>&bp.node_tail, 0, n_nodes, sizeof(block_id_t))
    for i in range(n_nodes):
        bp.node_head[i] = -1
        bp.node_tail[i] = -1
    bp.n_nodes = n_nodes
    return 0


cdef void bp_defer_run(BlockPoolC* bp, const block_id_t* blocks, const hash_t* keys, const flag_t* keep,
                       int32_t n, tok_t num_tokens, tok_t block_size, int32_t node) noexcept nogil:
    """Cache the held, uncached ``blocks[0 .. n)`` under ``keys[0 .. n)`` outside the map: last on
    ``node``'s list, in that order.  Block k covers ``num_tokens + k * block_size`` tokens; null
    entries, and those whose ``keep`` is 0 (``keep`` NULL: none), are skipped.

    They are cached in every way the free queue and the counts see, as lazily cached blocks are;
    bp_materialize or bp_key_deferred puts their keys in the map, in caching order.  The run is
    linked as one: each block's links are written once, the node's ends once."""
    cdef block_id_t t = bp.node_tail[node], b, head = -1
    cdef int32_t k
    cdef BlockC* blocks_c = bp.blk
    cdef BlockC* blk
    for k in range(n):
        b = blocks[k]
        if b == 0 or (keep != NULL and not keep[k]):
            continue
        blk = &blocks_c[b]
        blk.key = keys[k]
        blk.key_tokens = <int32_t>(num_tokens + k * block_size)
        blk.tag = TAG_DEFER - node
        blk.dprev = t
        blk.dnext = -1
        if t == -1:
            head = b
        else:
            blocks_c[t].dnext = b
        t = b
    if head != -1:
        bp.node_head[node] = head
    bp.node_tail[node] = t


cdef inline void _unlink_deferred(BlockC* blk, block_id_t* node_head, block_id_t* node_tail,
                                  BlockC* d) noexcept nogil:
    # Take the deferred block ``d`` (of the array ``blk``) off its node's list (its key stays in
    # the block).  The pool's arrays come as arguments so that a loop keeps them in registers.
    if d.dprev == -1:
        node_head[TAG_DEFER - d.tag] = d.dnext
    else:
        blk[d.dprev].dnext = d.dnext
    if d.dnext == -1:
        node_tail[TAG_DEFER - d.tag] = d.dprev
    else:
        blk[d.dnext].dprev = d.dprev


cdef inline void _undefer(BlockPoolC* bp, block_id_t b) noexcept nogil:
    # Take ``b`` off its node's list (its key stays in the block).
    _unlink_deferred(bp.blk, bp.node_head, bp.node_tail, &bp.blk[b])


cdef int bp_key_deferred(BlockPoolC* bp, block_id_t b) except -1 nogil:
    """The deferred block ``b``'s key goes into the map now."""
    cdef hash_t key = bp.blk[b].key
    _undefer(bp, b)
    bp.blk[b].tag = TAG_NONE
    return _map_insert(bp, _find_slot(bp, key), key, b, TAG_NONE)


cdef int bp_materialize(BlockPoolC* bp, int32_t node) except -1 nogil:
    """Every deferred block of ``node`` gets its key in the map, in the order they were cached."""
    cdef block_id_t b = bp.node_head[node], nxt
    cdef hash_t key
    while b != -1:
        nxt = bp.blk[b].dnext
        key = bp.blk[b].key
        bp.blk[b].tag = TAG_NONE
        _map_insert(bp, _find_slot(bp, key), key, b, TAG_NONE)
        b = nxt
    bp.node_head[node] = -1
    bp.node_tail[node] = -1
    return 0


cdef int bp_move_hashes(BlockPoolC* bp, block_id_t src, block_id_t dst) except -1 nogil:
    """Move every key of ``src`` onto ``dst`` (BlockPool.move_block_hashes).

    Never given a lazily cached block: lazy keys are off where blocks are copied (kv_lazy_ok)."""
    cdef tok_t num_tokens = bp.blk[src].key_tokens
    cdef hash_t primary = bp.blk[src].key
    cdef int32_t tag = bp.blk[src].tag
    cdef int32_t e = bp.sec_head[src] if bp.n_sec > 0 else -1
    cdef int32_t nxt
    if primary != 0:
        _map_pop(bp, primary, src, tag)
    bp.blk[src].key = 0
    bp.blk[src].key_tokens = 0
    if e != -1:
        bp.sec_head[src] = -1
    if primary != 0:
        bp_insert_block_hash(bp, dst, primary, num_tokens, tag)
    while e != -1:
        nxt = bp.sec_next[e]
        _map_pop(bp, bp.sec_key[e], src, TAG_NONE)
        bp_insert_block_hash(bp, dst, bp.sec_key[e], num_tokens, TAG_NONE)
        bp.sec_next[e] = bp.sec_free
        bp.sec_free = e
        bp.n_sec -= 1
        e = nxt
    return 0


# ---------------------------------------------------------------- free queue

include "freequeue.pxi"
