# Row and hit helpers of the KV-cache group managers: a request's block table
# and hash row, the joint probe of a spec-group, copy-on-write retention.
# cimported by kvcache (the coordinator, the attention managers and, through
# statecache.pxi, the state managers) and testing.  Inline: they run per block in the lookups,
# and a cross-module call of a small hot function costs.
from aisim._core.blockpool cimport bp_lookup
from aisim._core.hashing cimport group_key
from aisim._core.kvcache cimport GroupC, KVCacheC
from aisim._core.memory cimport mem_grow
from aisim._core.request cimport ReqC
from aisim._core.types cimport block_id_t, hash_t, int32_t, slot_t, tok_t
from aisim._core.util cimport num_tokens


cdef inline block_id_t* kv_table(const KVCacheC* kv, int32_t g, slot_t s) noexcept nogil:
    return kv.groups[g].tables + <Py_ssize_t>s * kv.groups[g].table_row


cdef inline hash_t* kv_hashes(const KVCacheC* kv, slot_t s) noexcept nogil:
    return kv.hashes + <Py_ssize_t>s * kv.hash_row


cdef inline int32_t kv_n_hashes(const KVCacheC* kv, const ReqC* r) noexcept nogil:
    # len(request.block_hashes): full hash blocks followed by num_hash_lookahead_tokens
    # more tokens (vllm/v1/core/kv_cache_utils.py get_request_block_hasher, 0.33).
    cdef tok_t n
    if kv.hash_lookahead == 0:
        return <int32_t>(num_tokens(r) // kv.hash_block_size)
    n = num_tokens(r) - kv.hash_lookahead
    return <int32_t>(n // kv.hash_block_size) if n > 0 else 0


cdef inline hash_t kv_view(const KVCacheC* kv, const ReqC* r, int32_t ratio, int32_t i) noexcept nogil:
    # Block i of a group whose block is ``ratio`` hash blocks: its last sub-hash.
    return kv_hashes(kv, r.slot)[(i + 1) * ratio - 1]


cdef inline bint kv_probe(KVCacheC* kv, int32_t sg, hash_t h) noexcept nogil:
    # BlockPool.get_cached_block over every group of a spec-group: the key must
    # be cached for each; the blocks go to kv.tmp_blocks in member order.
    cdef int32_t m, gid
    cdef block_id_t b
    for m in range(kv.spec_count[sg]):
        gid = kv.spec_members[kv.spec_first[sg] + m]
        b = bp_lookup(&kv.pool, group_key(h, gid))
        if b < 0:
            return False
        kv.tmp_blocks[m] = b
    return True


cdef inline void kv_put_hit(KVCacheC* kv, int32_t sg, int32_t pos) noexcept nogil:
    cdef int32_t m
    for m in range(kv.spec_count[sg]):
        kv.groups[kv.spec_members[kv.spec_first[sg] + m]].hit[pos] = kv.tmp_blocks[m]


cdef inline void kv_fill_null(KVCacheC* kv, int32_t sg, int32_t start, int32_t end) noexcept nogil:
    cdef int32_t m, i
    cdef GroupC* g
    for m in range(kv.spec_count[sg]):
        g = &kv.groups[kv.spec_members[kv.spec_first[sg] + m]]
        for i in range(start, end):
            g.hit[i] = 0


cdef inline void kv_set_hit_n(KVCacheC* kv, int32_t sg, int32_t n) noexcept nogil:
    cdef int32_t m
    for m in range(kv.spec_count[sg]):
        kv.groups[kv.spec_members[kv.spec_first[sg] + m]].hit_n = n


cdef inline block_id_t kv_evictable(const KVCacheC* kv, const GroupC* g, int32_t start, int32_t n_hits) noexcept nogil:
    # Hit blocks sitting in the free queue: touching them consumes free capacity.
    cdef int32_t i
    cdef block_id_t n = 0
    for i in range(start, n_hits):
        if g.hit[i] != 0 and kv.pool.blk[g.hit[i]].ref_cnt == 0:
            n += 1
    return n


cdef inline int kv_retain(GroupC* g, block_id_t src, block_id_t cow) except -1 nogil:
    # A pending copy keeps (source, copy) referenced until schedule() ends
    # (KVCacheManager.take_kv_cache_block_copies, Scheduler._free_cow_retained_blocks).
    if g.ret_n + 2 > g.ret_cap:
        mem_grow(<void**>&g.retained, g.ret_cap, g.ret_cap * 2 + 8, sizeof(block_id_t))
        g.ret_cap = g.ret_cap * 2 + 8
    g.retained[g.ret_n] = src
    g.retained[g.ret_n + 1] = cow
    g.ret_n += 2
    return 0


cdef inline int kv_apply_cow(KVCacheC* kv, int32_t gi, slot_t s, block_id_t cow) except -1 nogil:
    # SingleTypeKVCacheManager._apply_cow
    cdef GroupC* g = &kv.groups[gi]
    kv_table(kv, gi, s)[g.partial_idx[s]] = cow
    kv_retain(g, g.partial_src[s], cow)
    kv.pool.blk[cow].ref_cnt += 1
    return 0
