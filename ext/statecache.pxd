# The state managers (vLLM MambaManager: Mamba, GDN, KDA and conv state) and
# the retention rules shared with sliding windows.  cimported by kvcache, whose
# coordinator dispatches a state group's lookup, block count, allocation and
# caching here.  Mirrors vllm/v1/core/single_type_kv_cache_manager.py
# (MambaManager) and kv_cache_utils.py (reachable_block_mask) of 0.31/0.32.
from aisim._core.kvcache cimport GroupC, KVCacheC
from aisim._core.request cimport ReqC
from aisim._core.types cimport block_id_t, hash_t, int32_t, tok_t


cdef inline bint state_cached_this_step(const GroupC* g, hash_t key) noexcept nogil:
    # MambaManager: ``key`` is in cached_blocks_this_step (its state may not be written yet).
    cdef int32_t i
    if key == 0:
        return False
    for i in range(g.cts_n):
        if g.cts[i] == key:
            return True
    return False


cdef tok_t state_lookup(KVCacheC* kv, ReqC* r, int32_t sg, tok_t max_length, tok_t align) noexcept nogil
cdef tok_t state_blocks_needed(KVCacheC* kv, int32_t gi, ReqC* r, int32_t n_hits, tok_t total_computed,
                               tok_t local_computed, tok_t main_tokens, bint apply_cap,
                               tok_t prefill_end) noexcept nogil
cdef int state_allocate(KVCacheC* kv, int32_t gi, ReqC* r, tok_t main_tokens) except -1 nogil
cdef int state_cache_tail(KVCacheC* kv, int32_t gi, ReqC* r, tok_t n, int32_t before) except -1 nogil
cdef bint retention_mask(KVCacheC* kv, GroupC* g, ReqC* r, int32_t start, int32_t end,
                         bint with_boundaries) noexcept nogil
cdef hash_t cache_partial_block(KVCacheC* kv, int32_t gi, ReqC* r, block_id_t blk, tok_t n,
                                bint replace) except? 0 nogil
