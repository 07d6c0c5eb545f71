# vLLM's block pool: one per engine, shared by every KV-cache group.
# cimported by kvcache (the group managers draw and return blocks here) and
# by testing (the Python handle used in tests).  Mirrors vllm/v1/core/block_pool.py
# (BlockPool, BlockHashToBlockMap) and kv_cache_utils.py
# (FreeKVCacheBlockQueue, KVCacheBlock) of vLLM 0.31/0.32.
from aisim._core.types cimport block_id_t, flag_t, hash_t, int32_t, int64_t, tok_t
from aisim._core.util cimport __builtin_prefetch

cdef struct BlockC:
    # One block's state in one place (one memory access where separate arrays took several), in
    # 32 bytes: two blocks a cache line, none across two.
    hash_t key                 # primary map key (block_hash); 0 = not cached
    int32_t key_tokens         # prefix length the primary key covers (max_model_len fits)
    int32_t ref_cnt            # requests (and copy retentions) holding the block
    int32_t qpos               # its slot of the free queue's ring (BlockPoolC.queue; -1: not in the queue)
    int32_t tag                # what a deployment's router calls the primary key (its index id;
                               # TAG_NONE: not one of its keys, TAG_LOOKUP: look the key up); a key
                               # outside the map: TAG_LAZY, or deferred on node n: TAG_DEFER - n
    # Its place on the list of deferred blocks of its node (BlockPoolC.node_head), beside its
    # state: deferring, evicting and keying a block touch one memory line.
    block_id_t dprev           # links of that list (-1: none)
    block_id_t dnext

cdef struct MapEntC:
    # One slot of the key map (BlockHashToBlockMap): a key, its earliest-inserted block and the
    # chain of the blocks cached under it after that one.  One slot is one memory access for
    # the common key of a single block.
    hash_t key                 # 0 = empty slot
    block_id_t first           # the earliest-inserted block still cached under the key
    int32_t rest               # chain entry of the next one (-1: none)

cdef struct BlockPoolC:
    block_id_t num_blocks      # blocks in the pool, the null block 0 included
    bint caching               # prefix caching on
    BlockC* blk                # [num_blocks] the blocks
    # The free queue (freequeue.pxi): block ids in queue order in the ring slots q_head .. q_tail - 1
    # (positions count up forever; a slot is the position & q_mask).  A slot whose block's qpos is
    # another slot is stale: the block left the queue from there.
    int32_t* queue             # [q_mask + 1] the ring, q_mask + 1 >= 2 * num_blocks a power of two
    int64_t q_mask
    int64_t q_head             # position of the first slot (stale or not)
    int64_t q_tail             # one past the last
    block_id_t num_free        # blocks in the free queue (evictable cached blocks included)
    MapEntC* map               # [map_cap] open addressing, linear probing
    hash_t map_mask            # map_cap - 1; map_cap is a power of two >= 2 * num_blocks
    bint far_map               # the map outgrows a core's near caches (NEAR_MAP_BYTES): fetching a
                               # run's slots ahead of its inserts pays
    int32_t* ent_block         # [ent_cap] chain entry: a later block cached under a key
    int32_t* ent_next          # [ent_cap] next entry of the chain, or of the free list; -1 ends
    int32_t ent_cap
    int32_t ent_free           # free-list head of chain entries
    hash_t* sec_key            # [sec_cap] a secondary key of a block
    int32_t* sec_next          # [sec_cap] next secondary key of that block, or of the free list
    int32_t* sec_head          # [num_blocks] a block's first secondary-key entry (-1: none); a block
                               # with one has a primary key (BlockC.key != 0)
    int32_t n_sec              # secondary-key entries in use (0: sec_head is all -1, not read)
    int32_t sec_cap
    int32_t sec_free           # free-list head of secondary-key entries
    int64_t evictions          # blocks whose keys were dropped when popped for reuse
    block_id_t cached_free     # blocks in the free queue that still carry a key (resident, unreferenced)
    # Key events for a deployment's router (vLLM's BlockStored / BlockRemoved KV events,
    # vllm/distributed/kv_events.py): a key entering or leaving the map, in order.  Off unless
    # ``log_keys``; the reader empties it after every engine iteration (ev_n = 0).
    bint log_keys              # record key events
    int64_t n_keys             # keys in the map
    hash_t* ev_key             # [ev_cap] the key
    int32_t* ev_tag            # [ev_cap] its tag (BlockC.tag of the primary key; TAG_NONE for a secondary)
    flag_t* ev_add             # [ev_cap] 1: it entered the map, 0: it left
    int64_t ev_n               # events recorded
    int64_t ev_cap             # room: ev_cap >= ev_n + n_keys, so a removal never grows it
    # Deferred keys (bp_defer_run): a block whose key no request in the engine but its own could look
    # up yet waits outside the map, on the list of its run of shared tokens (a node), until a
    # request sharing that run arrives (bp_materialize).  n_nodes = 0: none.
    int32_t n_nodes            # runs of tokens shared by several requests of the trace
    int32_t* node_present      # [n_nodes] requests in the engine (arrived, unfinished) holding the run
    block_id_t* node_head      # [n_nodes] first deferred block of the run (-1: none), in caching order
    block_id_t* node_tail      # [n_nodes] last one

# BlockC.tag values that are not a router's key id.
cdef enum:
    TAG_NONE = -1              # no router reads this key
    TAG_LOOKUP = -2            # a router may read it: look it up by the key
    TAG_LAZY = -3              # cached lazily: its key not computed (bp_cache_lazily); a tag at
                               # or below it: a key outside the map
    TAG_DEFER = -4             # its key computed but not yet in the map (bp_defer_run): the tag of
                               # a block deferred on node n is TAG_DEFER - n

cdef int bp_init(BlockPoolC* bp, block_id_t num_blocks, bint caching) except -1 nogil
cdef void bp_release(BlockPoolC* bp) noexcept nogil
cdef block_id_t bp_pop_free(BlockPoolC* bp) noexcept nogil
cdef void bp_pop_n(BlockPoolC* bp, block_id_t* out, Py_ssize_t n) noexcept nogil
cdef void bp_touch(BlockPoolC* bp, block_id_t b) noexcept nogil
cdef void bp_free_reversed(BlockPoolC* bp, const block_id_t* blocks, Py_ssize_t n) noexcept nogil
cdef void bp_free_ordered(BlockPoolC* bp, const block_id_t* blocks, Py_ssize_t n) noexcept nogil
cdef void bp_free_one(BlockPoolC* bp, block_id_t b, block_id_t* front) noexcept nogil
cdef block_id_t bp_head(const BlockPoolC* bp) noexcept nogil
cdef Py_ssize_t bp_free_queue(const BlockPoolC* bp, block_id_t* out) noexcept nogil
cdef block_id_t bp_lookup(const BlockPoolC* bp, hash_t key) noexcept nogil
cdef bint bp_contains(const BlockPoolC* bp, hash_t key, block_id_t b) noexcept nogil
cdef int bp_insert_block_hash(BlockPoolC* bp, block_id_t b, hash_t key, tok_t num_tokens,
                               int32_t tag) except -1 nogil
cdef int bp_remove_hashes(BlockPoolC* bp, block_id_t b) noexcept nogil
cdef void bp_cache_lazily(BlockPoolC* bp, const block_id_t* blocks, int32_t n, tok_t tokens,
                          tok_t block_size) noexcept nogil
cdef int bp_key_lazy(BlockPoolC* bp, block_id_t b, hash_t key) except -1 nogil
cdef int bp_move_hashes(BlockPoolC* bp, block_id_t src, block_id_t dst) except -1 nogil
cdef int bp_cache(BlockPoolC* bp, block_id_t b, hash_t key) except -1 nogil
cdef int bp_nodes(BlockPoolC* bp, int32_t n_nodes) except -1 nogil
cdef void bp_defer_run(BlockPoolC* bp, const block_id_t* blocks, const hash_t* keys, const flag_t* keep,
                       int32_t n, tok_t num_tokens, tok_t block_size, int32_t node) noexcept nogil
cdef int bp_key_deferred(BlockPoolC* bp, block_id_t b) except -1 nogil
cdef int bp_materialize(BlockPoolC* bp, int32_t node) except -1 nogil
cdef int bp_log_keys(BlockPoolC* bp) except -1 nogil

cdef inline double bp_usage(const BlockPoolC* bp) noexcept nogil:
    # vllm/v1/core/block_pool.py BlockPool.get_usage: the null block is not usable.
    return 1.0 - (<double>bp.num_free) / (<double>(bp.num_blocks - 1))


cdef inline void bp_prefetch_key(const BlockPoolC* bp, hash_t key) noexcept nogil:
    # Fetch the map slot where a probe of ``key`` starts (a hint: no effect on results).
    __builtin_prefetch(&bp.map[key & bp.map_mask])
