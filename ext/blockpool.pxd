# vLLM's block pool: one per engine, shared by every KV-cache group.
# cimported by kvcache (the managers draw and return blocks here) and by the
# tests' Python wrapper.  Mirrors vllm/v1/core/block_pool.py (BlockPool,
# BlockHashToBlockMap) and kv_cache_utils.py (FreeKVCacheBlockQueue).
from aisim._core.types cimport block_id_t, hash_t, int32_t, int64_t

cdef struct BlockPoolC:
    block_id_t num_blocks      # blocks in the pool, the null block 0 included
    bint caching               # prefix caching on: freed hashed blocks keep their key
    int32_t* ref_cnt           # [num_blocks] requests holding each block
    hash_t* key                # [num_blocks] map key of a cached block; 0 = not cached
    block_id_t* next_dup       # [num_blocks] next block cached under the same key (insertion order)
    block_id_t* prev_free      # [num_blocks + 2] free-queue links; HEAD and TAIL are sentinels
    block_id_t* next_free      # [num_blocks + 2]
    block_id_t num_free        # blocks in the free queue (evictable cached blocks included)
    hash_t* map_keys           # [map_cap] open addressing, linear probing; 0 = empty slot
    block_id_t* map_head       # [map_cap] first-inserted block still cached under that key
    hash_t map_mask            # map_cap - 1 (map_cap is a power of two, >= 2 * num_blocks)
    int64_t evictions          # cached blocks whose key was dropped on reuse

cdef int bp_init(BlockPoolC* bp, block_id_t num_blocks, bint caching) except -1 nogil
cdef void bp_release(BlockPoolC* bp) noexcept nogil
cdef block_id_t bp_pop_free(BlockPoolC* bp) noexcept nogil
cdef void bp_touch(BlockPoolC* bp, block_id_t b) noexcept nogil
cdef void bp_free_reversed(BlockPoolC* bp, const block_id_t* blocks, Py_ssize_t n) noexcept nogil
cdef block_id_t bp_lookup(const BlockPoolC* bp, hash_t key) noexcept nogil
cdef void bp_cache(BlockPoolC* bp, block_id_t b, hash_t key) noexcept nogil
cdef void bp_uncache(BlockPoolC* bp, block_id_t b) noexcept nogil

cdef inline double bp_usage(const BlockPoolC* bp) noexcept nogil:
    # vllm/v1/core/block_pool.py BlockPool.get_usage: the null block is not usable.
    return 1.0 - (<double>bp.num_free) / (<double>(bp.num_blocks - 1))


cdef class BlockPool:
    """Python handle on a BlockPoolC, for tests and inspection."""
    cdef BlockPoolC c
