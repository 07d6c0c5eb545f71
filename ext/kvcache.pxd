# vLLM's KV-cache manager for one full-attention group over the shared block
# pool: prefix lookup, admission arithmetic, allocation, caching and frees.
# cimported by scheduler (schedule/update) and engine (set-up, telemetry).
# Mirrors vllm/v1/core/kv_cache_manager.py (KVCacheManager),
# kv_cache_coordinator.py (UnitaryKVCacheCoordinator,
# KVCacheCoordinatorNoPrefixCache) and single_type_kv_cache_manager.py
# (FullAttentionManager) of vLLM 0.31/0.32.
from aisim._core.blockpool cimport BlockPoolC
from aisim._core.request cimport ReqC
from aisim._core.types cimport block_id_t, hash_t, int32_t, int64_t, slot_t, tok_t

cdef struct KVCacheC:
    BlockPoolC pool            # the one block pool of the engine
    tok_t block_size           # tokens per block (= hash block size for one group)
    tok_t max_model_len
    bint caching               # enable_prefix_caching
    block_id_t watermark_blocks  # int(watermark * num_blocks)
    # token identity of every request (owned by the engine)
    const hash_t* seg_stream   # [segments] token stream id
    const tok_t* seg_first     # [segments] offset of the first token in its stream
    const tok_t* seg_len       # [segments] tokens in the segment
    # per-request rows, by slot
    slot_t cap_slots           # rows allocated
    slot_t n_free_slots        # entries of free_slots in use
    slot_t* free_slots         # [cap_slots] stack of unused rows
    int32_t hash_row           # hashes per row: max_model_len // block_size + 1
    int32_t table_row          # table entries per row: cdiv(max_model_len, block_size) + 1
    hash_t* hashes             # [cap_slots * hash_row] the request's chained block hashes
    block_id_t* tables         # [cap_slots * table_row] the request's block table
    int32_t* table_len         # [cap_slots] entries in the block table
    int32_t* num_cached        # [cap_slots] num_cached_block; -1 while absent
    int32_t* num_hashed        # [cap_slots] block hashes computed so far
    int32_t* cur_seg           # [cap_slots] hashing cursor: segment (seg_cnt = the output)
    tok_t* cur_off             # [cap_slots] hashing cursor: offset inside that segment
    # result of the last lookup
    block_id_t* hit            # [table_row] hit blocks of the last get_computed_blocks
    int32_t hit_n              # number of hit blocks

cdef int kv_init(KVCacheC* kv, block_id_t num_blocks, tok_t block_size, tok_t max_model_len,
                 bint caching, block_id_t watermark_blocks, slot_t initial_slots) except -1 nogil
cdef void kv_release(KVCacheC* kv) noexcept nogil
cdef int kv_acquire_slot(KVCacheC* kv, ReqC* r) except -1 nogil
cdef void kv_release_slot(KVCacheC* kv, ReqC* r) noexcept nogil
cdef tok_t kv_get_computed_blocks(KVCacheC* kv, ReqC* r) noexcept nogil
cdef bint kv_allocate_slots(KVCacheC* kv, ReqC* r, tok_t num_new_tokens, tok_t num_new_computed,
                            bint full_sequence_must_fit, bint has_scheduled_reqs) noexcept nogil
cdef void kv_cache_blocks(KVCacheC* kv, ReqC* r, tok_t num_tokens) noexcept nogil
cdef void kv_free(KVCacheC* kv, ReqC* r) noexcept nogil


cdef class KVCache:
    """Python handle on a KVCacheC with its own requests, for tests."""
    cdef KVCacheC c
    cdef ReqC* reqs            # [max_requests]
    cdef int n_reqs
    cdef int max_requests
    cdef object _segments      # keeps the segment arrays alive
    cdef ReqC* _req(self, int r) except NULL
