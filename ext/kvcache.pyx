"""vLLM's KV-cache manager and its per-group managers, as C functions.

One coordinator (``KVCacheC``) over one block pool and ``n_groups`` group
managers (``GroupC``), reproducing vLLM 0.31.0 / 0.32.0:

* ``kv_get_computed_blocks`` is ``KVCacheManager.get_computed_blocks``: the
  hit is capped at ``num_tokens - 1``; one group uses its own lookup
  (``UnitaryKVCacheCoordinator``), several groups the fixed point of
  ``HybridKVCacheCoordinator.find_longest_cache_hit`` over spec-groups (full
  attention first, probed once; the others re-probed until the length stops
  shrinking; one pass for "one full + one other"), which also yields the
  request's ``shared_prefix_boundary``;
* ``kv_allocate_slots`` is ``KVCacheManager.allocate_slots``: full-sequence
  gate, ``remove_skipped_blocks`` before the capacity check, per-group block
  needs (evictable hits count, Mamba's "cached this step" refusal and its
  one-state-block cap), touch of every group's hits before any new block is
  popped, then caching at schedule time;
* ``kv_cache_blocks`` is ``KVCacheCoordinator.cache_blocks`` with the
  retention masks of sliding-window and Mamba groups, partial-tail keys and
  Mamba's copy-on-write of sub-block states;
* ``kv_free`` frees each group's table tail first, group by group.

Block hashes are chained over compact token segments (``hashing.pxd``) at
``hash_block_size``; a group whose block is k hash blocks uses every k-th hash
(the last sub-hash of its block, ``BlockHashListWithBlockSize``).  Per-request
tables and hashes live in preallocated rows ("slots"), grown geometrically.
"""

from libc.string cimport memset

from aisim._core.blockpool cimport (
    BlockPoolC, bp_contains, bp_free_one, bp_free_reversed, bp_head, bp_init,
    bp_insert_block_hash, bp_lookup, bp_move_hashes, bp_pop_free, bp_release,
    bp_remove_hashes, bp_touch,
)
from aisim._core.hashing cimport NONE_HASH_SEED, group_key, hash_finish, hash_run
from aisim._core.request cimport ReqC
from aisim._core.memory cimport mem_calloc, mem_free, mem_grow
from aisim._core.types cimport block_id_t, flag_t, hash_t, int32_t, slot_t, tok_t
from aisim._core.util cimport cdiv, ckpt_position, num_tokens, tmax, tmin


# ------------------------------------------------------------------ helpers

cdef inline block_id_t* _table(const KVCacheC* kv, int32_t g, slot_t s) noexcept nogil:
    return kv.groups[g].tables + <Py_ssize_t>s * kv.groups[g].table_row


cdef inline hash_t* _hashes(const KVCacheC* kv, slot_t s) noexcept nogil:
    return kv.hashes + <Py_ssize_t>s * kv.hash_row


cdef int _push_key(GroupC* g, hash_t key) except -1 nogil:
    # Mamba cached_blocks_this_step.add(key)
    cdef int32_t i
    for i in range(g.cts_n):
        if g.cts[i] == key:
            return 0
    if g.cts_n == g.cts_cap:
        mem_grow(<void**>&g.cts, g.cts_cap, g.cts_cap * 2 + 8, sizeof(hash_t))
        g.cts_cap = g.cts_cap * 2 + 8
    g.cts[g.cts_n] = key
    g.cts_n += 1
    return 0


cdef bint _cached_this_step(const GroupC* g, hash_t key) noexcept nogil:
    cdef int32_t i
    if key == 0:
        return False
    for i in range(g.cts_n):
        if g.cts[i] == key:
            return True
    return False


cdef int _retain(GroupC* g, block_id_t src, block_id_t cow) except -1 nogil:
    # A pending copy keeps (source, copy) referenced until schedule() ends
    # (KVCacheManager.take_kv_cache_block_copies, Scheduler._free_cow_retained_blocks).
    if g.ret_n + 2 > g.ret_cap:
        mem_grow(<void**>&g.retained, g.ret_cap, g.ret_cap * 2 + 8, sizeof(block_id_t))
        g.ret_cap = g.ret_cap * 2 + 8
    g.retained[g.ret_n] = src
    g.retained[g.ret_n + 1] = cow
    g.ret_n += 2
    return 0


# ------------------------------------------------------------------ set-up

cdef int _grow_slots(KVCacheC* kv, slot_t new_cap) except -1 nogil:
    cdef slot_t old = kv.cap_slots
    cdef slot_t s
    cdef int32_t i
    cdef GroupC* g
    mem_grow(<void**>&kv.hashes, <size_t>old * kv.hash_row, <size_t>new_cap * kv.hash_row, sizeof(hash_t))
    mem_grow(<void**>&kv.num_hashed, old, new_cap, sizeof(int32_t))
    mem_grow(<void**>&kv.cur_seg, old, new_cap, sizeof(int32_t))
    mem_grow(<void**>&kv.cur_off, old, new_cap, sizeof(tok_t))
    mem_grow(<void**>&kv.free_slots, old, new_cap, sizeof(slot_t))
    for i in range(kv.n_groups):
        g = &kv.groups[i]
        mem_grow(<void**>&g.tables, <size_t>old * g.table_row, <size_t>new_cap * g.table_row, sizeof(block_id_t))
        mem_grow(<void**>&g.table_len, old, new_cap, sizeof(int32_t))
        mem_grow(<void**>&g.num_cached, old, new_cap, sizeof(int32_t))
        mem_grow(<void**>&g.partial_idx, old, new_cap, sizeof(int32_t))
        mem_grow(<void**>&g.partial_src, old, new_cap, sizeof(block_id_t))
        mem_grow(<void**>&g.last_state, old, new_cap, sizeof(int32_t))
        mem_grow(<void**>&g.retired, old, new_cap, sizeof(int32_t))
        mem_grow(<void**>&g.allocated, old, new_cap, sizeof(flag_t))
        mem_grow(<void**>&g.ckpt_pos, old, new_cap, sizeof(tok_t))
        mem_grow(<void**>&g.ckpt_idx, old, new_cap, sizeof(int32_t))
    # New rows go on the free stack so that the lowest row is used first.
    for s in range(new_cap - 1, old - 1, -1):
        kv.free_slots[kv.n_free_slots] = s
        kv.n_free_slots += 1
    kv.cap_slots = new_cap
    return 0


cdef int kv_init(KVCacheC* kv, block_id_t num_blocks, int32_t n_groups, const GroupSpecC* specs,
                 tok_t hash_block_size, tok_t sched_block_size, bint fine, bint caching,
                 tok_t retention, int32_t version, tok_t max_model_len,
                 block_id_t watermark_blocks, slot_t initial_slots) except -1 nogil:
    """Set up the pool and the group managers; the caller validated everything."""
    cdef int32_t i, j, k, widest = 1
    cdef GroupC* g
    memset(kv, 0, sizeof(KVCacheC))
    bp_init(&kv.pool, num_blocks, caching)
    kv.n_groups = n_groups
    kv.hash_block_size = hash_block_size
    kv.sched_block_size = sched_block_size
    kv.caching = caching
    kv.hybrid = n_groups > 1
    kv.fine = fine
    # cache_hit_alignment_tokens: the hash block in fine-grained mode, else the
    # scheduler block (one group: its own block size).
    kv.align = hash_block_size if fine else sched_block_size
    kv.version = version
    kv.retention = retention
    kv.max_model_len = max_model_len
    kv.watermark_blocks = watermark_blocks
    kv.hash_row = <int32_t>(max_model_len // hash_block_size + 1)
    mem_grow(<void**>&kv.groups, 0, n_groups, sizeof(GroupC))
    for i in range(n_groups):
        g = &kv.groups[i]
        g.spec = specs[i]
        g.ratio = <int32_t>(specs[i].block_size // hash_block_size) if specs[i].block_size >= hash_block_size else 1
        g.table_row = <int32_t>(cdiv(max_model_len, specs[i].block_size) + specs[i].num_spec + 3)
        if g.table_row > widest:
            widest = g.table_row
        mem_grow(<void**>&g.hit, 0, g.table_row, sizeof(block_id_t))
    # Spec-groups: cacheable groups with the same spec are looked up jointly;
    # full attention first, the others in order of first appearance.
    mem_grow(<void**>&kv.spec_first, 0, n_groups, sizeof(int32_t))
    mem_grow(<void**>&kv.spec_count, 0, n_groups, sizeof(int32_t))
    mem_grow(<void**>&kv.spec_members, 0, n_groups, sizeof(int32_t))
    mem_grow(<void**>&kv.tmp_hit_len, 0, n_groups, sizeof(tok_t))
    mem_grow(<void**>&kv.tmp_looked, 0, n_groups, sizeof(flag_t))
    mem_grow(<void**>&kv.tmp_blocks, 0, n_groups, sizeof(block_id_t))
    mem_grow(<void**>&kv.mask, 0, widest, sizeof(flag_t))
    k = 0
    for j in range(n_groups):
        kv.spec_first[j] = k
        kv.spec_count[j] = 0
        for i in range(n_groups):
            if specs[i].spec_group == j:
                kv.spec_members[k] = i
                kv.spec_count[j] += 1
                k += 1
        if kv.spec_count[j] > 0:
            kv.n_spec = j + 1
    _grow_slots(kv, initial_slots if initial_slots > 0 else 1)
    return 0


cdef void kv_release(KVCacheC* kv) noexcept nogil:
    cdef int32_t i
    cdef GroupC* g
    bp_release(&kv.pool)
    for i in range(kv.n_groups):
        g = &kv.groups[i]
        mem_free(g.tables)
        mem_free(g.table_len)
        mem_free(g.num_cached)
        mem_free(g.partial_idx)
        mem_free(g.partial_src)
        mem_free(g.last_state)
        mem_free(g.retired)
        mem_free(g.allocated)
        mem_free(g.ckpt_pos)
        mem_free(g.ckpt_idx)
        mem_free(g.hit)
        mem_free(g.cts)
        mem_free(g.retained)
    mem_free(kv.groups)
    mem_free(kv.spec_first)
    mem_free(kv.spec_count)
    mem_free(kv.spec_members)
    mem_free(kv.tmp_hit_len)
    mem_free(kv.tmp_looked)
    mem_free(kv.tmp_blocks)
    mem_free(kv.mask)
    mem_free(kv.hashes)
    mem_free(kv.num_hashed)
    mem_free(kv.cur_seg)
    mem_free(kv.cur_off)
    mem_free(kv.free_slots)
    memset(kv, 0, sizeof(KVCacheC))


cdef void _reset_row(KVCacheC* kv, slot_t s) noexcept nogil:
    cdef int32_t i
    cdef GroupC* g
    for i in range(kv.n_groups):
        g = &kv.groups[i]
        g.table_len[s] = 0
        g.num_cached[s] = -1
        g.partial_idx[s] = -1
        g.partial_src[s] = 0
        g.last_state[s] = -1
        g.retired[s] = 0
        g.allocated[s] = 0
        g.ckpt_pos[s] = 0
        g.ckpt_idx[s] = -1


cdef int kv_acquire_slot(KVCacheC* kv, ReqC* r) except -1 nogil:
    """Give ``r`` a row for its tables and hashes (kept across preemptions)."""
    cdef slot_t s
    if r.slot >= 0:
        return 0
    if kv.n_free_slots == 0:
        _grow_slots(kv, kv.cap_slots * 2)
    kv.n_free_slots -= 1
    s = kv.free_slots[kv.n_free_slots]
    r.slot = s
    kv.num_hashed[s] = 0
    kv.cur_seg[s] = 0
    kv.cur_off[s] = 0
    _reset_row(kv, s)
    return 0


cdef void kv_release_slot(KVCacheC* kv, ReqC* r) noexcept nogil:
    if r.slot < 0:
        return
    kv.free_slots[kv.n_free_slots] = r.slot
    kv.n_free_slots += 1
    r.slot = -1


cdef void kv_new_step_starts(KVCacheC* kv) noexcept nogil:
    # MambaManager.new_step_starts: forget the keys cached in the last step.
    cdef int32_t i
    for i in range(kv.n_groups):
        kv.groups[i].cts_n = 0


# ------------------------------------------------------------------ hashing

cdef void _ensure_hashes(KVCacheC* kv, ReqC* r, int32_t n_hashes) noexcept nogil:
    """Compute the hashes of ``r`` up to hash block ``n_hashes`` (exclusive).

    Only full hash blocks are hashed (``Request.update_block_hashes``); the
    caller keeps ``n_hashes * hash_block_size <= num_tokens``.
    """
    cdef slot_t s = r.slot
    cdef hash_t* hashes = _hashes(kv, s)
    cdef int32_t j = kv.num_hashed[s]
    cdef int32_t seg = kv.cur_seg[s]
    cdef tok_t off = kv.cur_off[s]
    cdef tok_t need, take, avail, length, first
    cdef hash_t stream, h
    while j < n_hashes:
        h = hashes[j - 1] if j > 0 else <hash_t>NONE_HASH_SEED
        need = kv.hash_block_size
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


cdef inline int32_t _n_hashes(const KVCacheC* kv, const ReqC* r) noexcept nogil:
    # len(request.block_hashes)
    return <int32_t>(num_tokens(r) // kv.hash_block_size)


cdef inline hash_t _view(const KVCacheC* kv, const ReqC* r, int32_t ratio, int32_t i) noexcept nogil:
    # Block i of a group whose block is ``ratio`` hash blocks: its last sub-hash.
    return _hashes(kv, r.slot)[(i + 1) * ratio - 1]


# ------------------------------------------------------------------ lookups

cdef bint _probe(KVCacheC* kv, int32_t sg, hash_t h) noexcept nogil:
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


cdef inline void _put(KVCacheC* kv, int32_t sg, int32_t pos) noexcept nogil:
    cdef int32_t m
    for m in range(kv.spec_count[sg]):
        kv.groups[kv.spec_members[kv.spec_first[sg] + m]].hit[pos] = kv.tmp_blocks[m]


cdef inline void _fill_null(KVCacheC* kv, int32_t sg, int32_t start, int32_t end) noexcept nogil:
    cdef int32_t m, i
    cdef GroupC* g
    for m in range(kv.spec_count[sg]):
        g = &kv.groups[kv.spec_members[kv.spec_first[sg] + m]]
        for i in range(start, end):
            g.hit[i] = 0


cdef inline void _set_hit_n(KVCacheC* kv, int32_t sg, int32_t n) noexcept nogil:
    cdef int32_t m
    for m in range(kv.spec_count[sg]):
        kv.groups[kv.spec_members[kv.spec_first[sg] + m]].hit_n = n


cdef tok_t _lookup_full(KVCacheC* kv, ReqC* r, int32_t sg, tok_t max_length, tok_t align) noexcept nogil:
    # FullAttentionManager.find_longest_cache_hit
    cdef GroupC* g = &kv.groups[kv.spec_members[kv.spec_first[sg]]]
    cdef tok_t bs = g.spec.block_size
    cdef int32_t n_raw = _n_hashes(kv, r)
    cdef int32_t view_len = n_raw // g.ratio
    cdef int32_t n = 0, i, scale, first, max_partial, fi
    cdef tok_t hit
    cdef bint fine = align < bs and bs % align == 0
    cdef hash_t* raw = _hashes(kv, r.slot)
    for i in range(<int32_t>tmin(max_length // bs, view_len)):
        if not _probe(kv, sg, _view(kv, r, g.ratio, i)):
            break
        _put(kv, sg, n)
        n += 1
    hit = n * bs
    if fine:
        # Partial entries inside the first missing block, highest first.
        scale = <int32_t>(bs // align)
        first = n * scale
        max_partial = <int32_t>tmin(tmin(first + scale - 1, max_length // align), n_raw)
        for fi in range(max_partial - 1, first - 1, -1):
            if _probe(kv, sg, raw[fi]):
                _put(kv, sg, n)
                n += 1
                hit = (fi + 1) * align
                break
    hit -= hit % align
    n = <int32_t>tmin(n, cdiv(hit, bs))
    _set_hit_n(kv, sg, n)
    return hit


cdef tok_t _lookup_swa(KVCacheC* kv, ReqC* r, int32_t sg, tok_t max_length, tok_t align) noexcept nogil:
    # SlidingWindowManager.find_longest_cache_hit: a hit needs the blocks of the
    # last window - 1 tokens; scanning right to left for such a run.
    cdef GroupC* g = &kv.groups[kv.spec_members[kv.spec_first[sg]]]
    cdef tok_t bs = g.spec.block_size
    cdef int32_t need = <int32_t>cdiv(g.spec.window - 1, bs)
    cdef int32_t max_blocks = <int32_t>tmin(max_length // bs, _n_hashes(kv, r) // g.ratio)
    cdef int32_t i, c = 0, n = 0
    cdef bint found = False
    _fill_null(kv, sg, 0, max_blocks)
    for i in range(max_blocks - 1, -1, -1):
        if _probe(kv, sg, _view(kv, r, g.ratio, i)):
            if c == 0 and bs != align and ((i + 1) * bs) % align != 0:
                continue
            _put(kv, sg, i)
            c += 1
            if c >= need:
                n = i + c
                found = True
                break
        else:
            c = 0
    if not found:
        # A run reaching the start needs no earlier window.
        n = c
        while bs != align and (n * bs) % align != 0:
            n -= 1
    _set_hit_n(kv, sg, n)
    return n * bs


cdef tok_t _lookup_chunked(KVCacheC* kv, ReqC* r, int32_t sg, tok_t max_length, tok_t align) noexcept nogil:
    # ChunkedLocalAttentionManager.find_longest_cache_hit: blocks before the
    # current chunk are computed and out of window (null); scan on from there.
    cdef GroupC* g = &kv.groups[kv.spec_members[kv.spec_first[sg]]]
    cdef tok_t bs = g.spec.block_size
    cdef int32_t max_blocks = <int32_t>tmin(max_length // bs, _n_hashes(kv, r) // g.ratio)
    cdef int32_t start = <int32_t>((max_length // g.spec.window) * g.spec.window // bs)
    cdef int32_t i, n
    if start > max_blocks:
        start = max_blocks
    _fill_null(kv, sg, 0, start)
    n = start
    for i in range(start, max_blocks):
        if not _probe(kv, sg, _view(kv, r, g.ratio, i)):
            break
        _put(kv, sg, i)
        n = i + 1
    _set_hit_n(kv, sg, n)
    return n * bs


cdef tok_t _lookup_mamba(KVCacheC* kv, ReqC* r, int32_t sg, tok_t max_length, tok_t align) noexcept nogil:
    # MambaManager.find_longest_cache_hit: the latest cached state, right to left.
    cdef GroupC* g = &kv.groups[kv.spec_members[kv.spec_first[sg]]]
    cdef tok_t bs = g.spec.block_size
    cdef int32_t n_raw = _n_hashes(kv, r)
    cdef int32_t i, fi, idx, scale, max_units, max_blocks
    cdef hash_t* raw = _hashes(kv, r.slot)
    _set_hit_n(kv, sg, 0)
    if align < bs and bs % align == 0:
        # Fine-grained: any hash boundary may hold a state.
        scale = <int32_t>(bs // align)
        max_units = <int32_t>tmin(max_length // align, n_raw)
        for fi in range(max_units - 1, -1, -1):
            if _probe(kv, sg, raw[fi]):
                idx = fi // scale
                _fill_null(kv, sg, 0, idx)
                _put(kv, sg, idx)
                _set_hit_n(kv, sg, idx + 1)
                return (fi + 1) * align
        return 0
    max_blocks = <int32_t>tmin(max_length // bs, n_raw // g.ratio)
    for i in range(max_blocks - 1, -1, -1):
        if _probe(kv, sg, _view(kv, r, g.ratio, i)):
            if bs != align and ((i + 1) * bs) % align != 0:
                continue
            _fill_null(kv, sg, 0, i)
            _put(kv, sg, i)
            _set_hit_n(kv, sg, i + 1)
            return (i + 1) * bs
    return 0


cdef tok_t _lookup(KVCacheC* kv, ReqC* r, int32_t sg, tok_t max_length, tok_t align) noexcept nogil:
    cdef int32_t kind = kv.groups[kv.spec_members[kv.spec_first[sg]]].spec.kind
    if kind == GK_FULL:
        return _lookup_full(kv, r, sg, max_length, align)
    if kind == GK_SWA:
        return _lookup_swa(kv, r, sg, max_length, align)
    if kind == GK_CHUNKED:
        return _lookup_chunked(kv, r, sg, max_length, align)
    if kind == GK_MAMBA:
        return _lookup_mamba(kv, r, sg, max_length, align)
    _set_hit_n(kv, sg, 0)
    return 0


cdef tok_t kv_get_computed_blocks(KVCacheC* kv, ReqC* r) noexcept nogil:
    """Longest prefix hit of ``r`` in tokens; per-group blocks go to ``hit``.

    Also sets ``r.shared_prefix_boundary`` (KVCacheManager.get_computed_blocks).
    """
    cdef tok_t max_len, hit, cur, new_len, longest = 0
    cdef int32_t i, sg, kind
    cdef bint simple
    cdef GroupC* g
    for i in range(kv.n_groups):
        kv.groups[i].hit_n = 0
    r.shared_prefix_boundary = 0
    if not kv.caching or kv.n_spec == 0:
        return 0
    # The last token is always recomputed for its logits.
    max_len = num_tokens(r) - 1
    _ensure_hashes(kv, r, _n_hashes(kv, r))
    if not kv.hybrid:
        return _lookup(kv, r, 0, max_len, kv.groups[0].spec.block_size)
    # HybridKVCacheCoordinator.find_longest_cache_hit: the fixed point.
    for sg in range(kv.n_spec):
        kv.tmp_looked[sg] = False
    simple = kv.n_spec == 2 and kv.groups[kv.spec_members[kv.spec_first[0]]].spec.kind == GK_FULL
    hit = max_len
    while True:
        cur = hit
        for sg in range(kv.n_spec):
            kind = kv.groups[kv.spec_members[kv.spec_first[sg]]].spec.kind
            if kind == GK_FULL and kv.tmp_looked[sg]:
                # Full attention is downward closed: never re-probed.
                cur = tmin(cur, kv.tmp_hit_len[sg])
                continue
            new_len = _lookup(kv, r, sg, cur, kv.align)
            kv.tmp_looked[sg] = True
            kv.tmp_hit_len[sg] = new_len
            cur = new_len
            longest = tmax(longest, cur)
        if cur >= hit:
            break
        hit = cur
        if simple:
            break
    for i in range(kv.n_groups):
        g = &kv.groups[i]
        if g.spec.kind == GK_FULL and g.spec.spec_group >= 0:
            g.hit_n = <int32_t>tmin(g.hit_n, cdiv(hit, g.spec.block_size))
    if longest > hit:
        r.shared_prefix_boundary = longest
    return hit


# ------------------------------------------------------------------ admission arithmetic

cdef inline tok_t _skipped_tokens(const GroupC* g, tok_t n) noexcept nogil:
    # get_num_skipped_tokens: tokens whose blocks a group no longer needs.
    if g.spec.kind == GK_SWA:
        return tmax(0, n - g.spec.window + 1)
    if g.spec.kind == GK_CHUNKED:
        return n // g.spec.window * g.spec.window
    if g.spec.kind == GK_MAMBA:
        return n - 1
    return 0


cdef bint _ckpt_valid(tok_t start, tok_t end, tok_t pos, tok_t h, tok_t bs, tok_t alignment) noexcept nogil:
    # kv_cache_interface.is_mamba_prefill_checkpoint_valid
    if alignment <= 0:
        return False
    cdef tok_t initial_col = (start - 1) // bs if start > 0 else -1
    cdef tok_t ckpt_col = cdiv(end, bs) - 2
    return (start % h == 0 and ckpt_col > initial_col and start + h <= pos
            and start < pos < end and (pos - start) % alignment == 0)


cdef bint _needs_internal_checkpoint(KVCacheC* kv, GroupC* g, slot_t s, tok_t start, tok_t end,
                                     tok_t pos, tok_t prefill_end) noexcept nogil:
    # MambaManager._needs_internal_checkpoint
    cdef tok_t idx = cdiv(end, g.spec.block_size) - 2
    cdef block_id_t* table = _table(kv, <int32_t>(g - kv.groups), s)
    cdef int32_t n = g.table_len[s]
    if not (g.spec.has_ckpt and g.spec.align_mode and end >= prefill_end):
        return False
    if not _ckpt_valid(start, end, pos, kv.hash_block_size, g.spec.block_size, g.spec.ckpt_align):
        return False
    if idx < 0:
        return False
    return idx >= n or table[idx] == 0 or (g.allocated[s] and idx >= n - g.spec.num_spec)


cdef block_id_t _evictable(const KVCacheC* kv, const GroupC* g, int32_t start, int32_t n_hits) noexcept nogil:
    # Hit blocks sitting in the free queue: touching them consumes free capacity.
    cdef int32_t i
    cdef block_id_t n = 0
    for i in range(start, n_hits):
        if g.hit[i] != 0 and kv.pool.ref_cnt[g.hit[i]] == 0:
            n += 1
    return n


cdef tok_t _blocks_needed(KVCacheC* kv, int32_t gi, ReqC* r, tok_t n_tokens, bint use_hits,
                          tok_t total_computed, tok_t local_computed, tok_t main_tokens,
                          bint apply_cap, tok_t prefill_end) noexcept nogil:
    """SingleTypeKVCacheManager.get_num_blocks_to_allocate and its overrides."""
    cdef GroupC* g = &kv.groups[gi]
    cdef slot_t s = r.slot
    cdef tok_t bs = g.spec.block_size
    cdef int32_t n_hits = g.hit_n if use_hits else 0
    cdef tok_t required, have, skipped, new_blocks, pos
    cdef bint partial, ckpt
    cdef tok_t cap
    have = g.table_len[s]
    if g.spec.kind == GK_RING:
        return 0 if have > 0 else 1
    if g.spec.kind == GK_MAMBA:
        # A state cached in this very step may not be written yet: refuse.
        if n_hits > 0 and _cached_this_step(g, kv.pool.key[g.hit[n_hits - 1]]):
            return kv.pool.num_blocks + 1
        if g.spec.align_mode:
            required = cdiv(main_tokens, bs) + g.spec.num_spec
            new_blocks = required - n_hits - have
            partial = (n_hits > 0 and local_computed % bs != 0) or g.partial_idx[s] >= 0
            if partial:
                new_blocks = tmax(new_blocks, 0) + 1
            # 0.32 checks the checkpoint at cache_hit_alignment_tokens, 0.31 at
            # the hash block size (MambaManager.get_num_blocks_to_allocate).
            pos = ckpt_position(main_tokens, kv.align if kv.version >= 32 else kv.hash_block_size)
            if not _needs_internal_checkpoint(kv, g, s, total_computed, main_tokens, pos, prefill_end):
                pos = 0
            ckpt = pos > 0
            if not apply_cap:
                if ckpt:
                    g.ckpt_pos[s] = pos
                    g.ckpt_idx[s] = <int32_t>(cdiv(main_tokens, bs) - 2)
                else:
                    g.ckpt_pos[s] = 0
                    g.ckpt_idx[s] = -1
            if new_blocks > 0:
                # At most one new state block per step (+ copy, checkpoint, drafts).
                cap = 1 + <tok_t>partial + <tok_t>ckpt
                if not g.allocated[s] or (kv.version < 32 and ckpt):
                    cap += g.spec.num_spec
                new_blocks = tmin(new_blocks, cap)
            return new_blocks + _evictable(kv, g, 0, n_hits)
        n_tokens += bs * g.spec.num_spec
    # Common rule (full, sliding window, chunked local, Mamba outside align).
    required = cdiv(n_tokens, bs)
    if apply_cap and g.spec.admission_cap >= 0:
        required = tmin(required, g.spec.admission_cap)
    if g.num_cached[s] >= 0:
        return tmax(required - have, 0)
    skipped = _skipped_tokens(g, total_computed) // bs
    new_blocks = tmax(required - tmax(skipped, n_hits + have), 0)
    if n_hits > 0 and local_computed % bs != 0:
        new_blocks += 1  # copy-on-write block of a partial hit
    return new_blocks + _evictable(kv, g, <int32_t>tmax(0, skipped - have), n_hits)


# ------------------------------------------------------------------ window and state releases

cdef void _remove_skipped(KVCacheC* kv, int32_t gi, ReqC* r, tok_t processed) noexcept nogil:
    """remove_skipped_blocks: null and free blocks that left the window."""
    cdef GroupC* g = &kv.groups[gi]
    cdef slot_t s = r.slot
    cdef block_id_t* table = _table(kv, gi, s)
    cdef tok_t skipped = _skipped_tokens(g, processed)
    cdef int32_t sb, i, first, n = g.table_len[s]
    cdef block_id_t front
    if g.spec.kind == GK_FULL or g.spec.kind == GK_RING:
        return
    front = bp_head(&kv.pool)
    if skipped > 0:
        sb = <int32_t>tmin(skipped // g.spec.block_size, n)
        if g.spec.kind == GK_MAMBA and g.spec.align_mode:
            # Skip over nulls; remember how far blocks were retired.
            first = g.retired[s]
            if first < sb:
                for i in range(sb - 1, first - 1, -1):
                    if table[i] == 0:
                        continue
                    bp_free_one(&kv.pool, table[i], &front)
                    table[i] = 0
                g.retired[s] = sb
        else:
            # Highest index first, stopping at the first null.
            for i in range(sb - 1, -1, -1):
                if table[i] == 0:
                    break
                bp_free_one(&kv.pool, table[i], &front)
                table[i] = 0
    if g.spec.kind == GK_MAMBA and g.spec.align_mode:
        # The previous chunk's state, kept one step as the next initial state.
        i = g.last_state[s]
        if i >= 0 and i < cdiv(processed, g.spec.block_size) - 1 and table[i] != 0:
            front = bp_head(&kv.pool)
            bp_free_one(&kv.pool, table[i], &front)
            table[i] = 0


# ------------------------------------------------------------------ allocation

cdef void _add_hits(KVCacheC* kv, int32_t gi, ReqC* r, tok_t local) noexcept nogil:
    # SingleTypeKVCacheManager.add_local_computed_blocks: touch and adopt.
    cdef GroupC* g = &kv.groups[gi]
    cdef slot_t s = r.slot
    cdef block_id_t* table = _table(kv, gi, s)
    cdef int32_t sb, i, n = 0
    if g.spec.kind == GK_RING:
        return
    sb = <int32_t>(_skipped_tokens(g, local) // g.spec.block_size)
    for i in range(sb):
        table[n] = 0
        n += 1
    for i in range(sb, g.hit_n):
        bp_touch(&kv.pool, g.hit[i])
        table[n] = g.hit[i]
        n += 1
    g.table_len[s] = n
    g.num_cached[s] = n
    if g.hit_n > sb and local % g.spec.block_size != 0:
        # A hit ending inside this group's block: write into a private copy.
        g.partial_idx[s] = <int32_t>(local // g.spec.block_size)
        g.partial_src[s] = g.hit[g.hit_n - 1]
        g.num_cached[s] = g.partial_idx[s]


cdef int _apply_cow(KVCacheC* kv, int32_t gi, slot_t s, block_id_t cow) except -1 nogil:
    # SingleTypeKVCacheManager._apply_cow
    cdef GroupC* g = &kv.groups[gi]
    _table(kv, gi, s)[g.partial_idx[s]] = cow
    _retain(g, g.partial_src[s], cow)
    kv.pool.ref_cnt[cow] += 1
    return 0


cdef int _allocate_new_blocks(KVCacheC* kv, int32_t gi, ReqC* r, tok_t n_tokens,
                              tok_t main_tokens) except -1 nogil:
    """allocate_new_blocks of each manager kind."""
    cdef GroupC* g = &kv.groups[gi]
    cdef slot_t s = r.slot
    cdef block_id_t* table = _table(kv, gi, s)
    cdef tok_t bs = g.spec.block_size
    cdef int32_t required, prev, skip, i, k, null_end, keep
    cdef bint ckpt, partial, was_allocated
    cdef block_id_t cow, b
    if g.spec.kind == GK_RING:
        if g.table_len[s] == 0:
            table[0] = bp_pop_free(&kv.pool)
            g.table_len[s] = 1
        return 0
    if g.spec.kind == GK_MAMBA and g.spec.align_mode:
        required = <int32_t>(cdiv(main_tokens, bs) + g.spec.num_spec)
        ckpt = g.ckpt_pos[s] > 0
        partial = g.partial_idx[s] >= 0
        if required <= g.table_len[s] and not partial and not ckpt:
            g.allocated[s] = 1
            return 0
        prev = g.table_len[s]
        was_allocated = g.allocated[s]
        if was_allocated:
            g.last_state[s] = prev - 1 - g.spec.num_spec
        elif prev > 0:
            g.last_state[s] = prev - 1
        skip = required - g.spec.num_spec - 1
        if prev < skip:
            null_end = skip - <int32_t>ckpt
            for i in range(prev, null_end):
                table[i] = 0
            if null_end > prev:
                g.table_len[s] = null_end
        if was_allocated and (kv.version >= 32 or not ckpt):
            # Speculative scratch blocks now inside the padding move to the tail.
            keep = skip - <int32_t>ckpt if kv.version >= 32 else skip
            for i in range(prev - g.spec.num_spec, prev):
                if i < keep:
                    table[g.table_len[s]] = table[i]
                    g.table_len[s] += 1
                    table[i] = 0
                else:
                    break
        k = required - g.table_len[s]
        if k < 0:
            k = 0
        if partial:
            cow = bp_pop_free(&kv.pool)
            if was_allocated:
                # The producer keeps writing its running state; the cached
                # sub-block state moves to a copy (move_block_hashes).
                bp_move_hashes(&kv.pool, g.partial_src[s], cow)
                _retain(g, g.partial_src[s], cow)
                kv.pool.ref_cnt[g.partial_src[s]] += 1
                if kv.pool.key[cow] != 0:
                    _push_key(g, kv.pool.key[cow])
            else:
                _apply_cow(kv, gi, s, cow)
        for i in range(k):
            b = bp_pop_free(&kv.pool)
            table[g.table_len[s]] = b
            g.table_len[s] += 1
        g.allocated[s] = 1
        g.partial_idx[s] = -1
        return 0
    if g.spec.kind == GK_MAMBA:
        n_tokens += bs * g.spec.num_spec
    if g.partial_idx[s] >= 0:
        cow = bp_pop_free(&kv.pool)
        _apply_cow(kv, gi, s, cow)
        g.partial_idx[s] = -1
    k = <int32_t>(cdiv(n_tokens, bs) - g.table_len[s])
    for i in range(k):
        table[g.table_len[s]] = bp_pop_free(&kv.pool)
        g.table_len[s] += 1
    return 0


cdef int kv_allocate_slots(KVCacheC* kv, ReqC* r, tok_t num_new_tokens, tok_t num_new_computed,
                           bint full_sequence_must_fit, bint has_scheduled_reqs) except -1 nogil:
    """KVCacheManager.allocate_slots; 1 when allocated, 0 when it returns None.

    ``num_new_computed`` > 0 adopts the blocks of the last lookup.  On failure
    nothing changes except out-of-window blocks, which vLLM frees first.
    """
    cdef bint use_hits = num_new_computed > 0
    cdef tok_t local = r.num_computed + num_new_computed
    cdef tok_t total = tmin(local, kv.max_model_len)
    cdef tok_t prefill_end = tmax(r.prompt_len, num_tokens(r) - 1)
    cdef tok_t main_tokens, need_slot, need, nfull
    cdef block_id_t wm = 0
    cdef int32_t gi
    cdef bint adopt
    if has_scheduled_reqs and (r.status == 1 or r.status == 3):  # WAITING, PREEMPTED
        wm = kv.watermark_blocks
    # KVCacheCoordinator.get_num_blocks_to_allocate: a prefill checkpoint on
    # every chunk unless the retention interval is 0 (sparse).
    if kv.retention != 0:
        prefill_end = 0
    if full_sequence_must_fit:
        # scheduler_reserve_full_isl: the whole current sequence must fit now.
        nfull = tmin(num_tokens(r), kv.max_model_len)
        need = 0
        for gi in range(kv.n_groups):
            need += _blocks_needed(kv, gi, r, nfull, use_hits, total, local, nfull, True, prefill_end)
        if need + wm > kv.pool.num_free:
            return 0
    main_tokens = total + num_new_tokens
    need_slot = tmin(main_tokens, kv.max_model_len)
    # Out-of-window blocks are released before the capacity check.
    for gi in range(kv.n_groups):
        _remove_skipped(kv, gi, r, tmax(0, total - r.num_in_flight))
    need = 0
    for gi in range(kv.n_groups):
        need += _blocks_needed(kv, gi, r, need_slot, use_hits, local, local, main_tokens, False, prefill_end)
    if need + wm > kv.pool.num_free:
        return 0
    if use_hits:
        # allocate_new_computed_blocks: every group's hits are touched before
        # any group pops a new block.
        adopt = True
        for gi in range(kv.n_groups):
            if kv.groups[gi].num_cached[r.slot] >= 0:
                adopt = False
        if adopt:
            for gi in range(kv.n_groups):
                _add_hits(kv, gi, r, local)
    for gi in range(kv.n_groups):
        _allocate_new_blocks(kv, gi, r, need_slot, main_tokens)
    if kv.caching:
        kv_cache_blocks(kv, r, tmin(total + num_new_tokens, num_tokens(r)))
    return 1


# ------------------------------------------------------------------ caching

cdef bint _mask(KVCacheC* kv, GroupC* g, ReqC* r, int32_t start, int32_t end,
                bint with_boundaries) noexcept nogil:
    """reachable_block_mask into kv.mask[0 : end - start]; False means dense.

    Sliding-window and Mamba groups keep only the blocks a later request can
    reach: the tail of each retention segment and the replay boundaries
    (prompt - 1, the shared-prefix junction).
    """
    cdef tok_t bs = g.spec.block_size
    cdef tok_t align = kv.align   # cache_hit_alignment_tokens
    cdef tok_t seg, aligned, b
    cdef int32_t need, per, i, j, e, first, k
    cdef tok_t bounds[2]
    cdef int32_t n_bounds = 0
    if g.spec.kind != GK_SWA and g.spec.kind != GK_MAMBA:
        return False
    if with_boundaries:
        bounds[0] = r.prompt_len - 1
        n_bounds = 1
        if r.shared_prefix_boundary:
            bounds[1] = r.shared_prefix_boundary
            n_bounds = 2
    if g.spec.kind == GK_SWA:
        if align % bs != 0:
            return False
        need = <int32_t>cdiv(g.spec.window - 1, bs)
        for i in range(end - start):
            kv.mask[i] = 0
        if kv.retention < 0:
            seg = align
        elif kv.retention == 0:
            seg = 0
        else:
            seg = kv.retention
        if seg > 0:
            per = <int32_t>(seg // bs)
            if need >= per:
                return False
            for i in range(start, end):
                if i % per >= per - need:
                    kv.mask[i - start] = 1
        if kv.retention >= 0:
            for k in range(n_bounds):
                aligned = bounds[k] // align * align
                e = <int32_t>(aligned // bs)
                for j in range(<int32_t>tmax(start, e - need), <int32_t>tmin(end, e)):
                    kv.mask[j - start] = 1
        return True
    # Mamba
    if kv.retention < 0:
        return False
    for i in range(end - start):
        kv.mask[i] = 0
    if kv.retention > 0:
        per = <int32_t>(kv.retention // bs)
        if per <= 1:
            return False
        first = (start + per) // per * per - 1
        i = first - start
        while i < end - start:
            kv.mask[i] = 1
            i += per
    for k in range(n_bounds):
        aligned = bounds[k] // align * align
        b = aligned // bs - 1
        if start <= b < end:
            kv.mask[b - start] = 1
    return True


cdef hash_t _cache_partial_block(KVCacheC* kv, int32_t gi, ReqC* r, block_id_t blk, tok_t n,
                                 bint replace) except? 0 nogil:
    """BlockPool.cache_partial_block: key ``blk`` at the hash boundary ``n``."""
    cdef tok_t h = kv.hash_block_size
    cdef int32_t nh = <int32_t>(n // h)
    cdef hash_t key
    cdef bint already
    if blk == 0:
        return 0
    key = group_key(_hashes(kv, r.slot)[nh - 1], gi)
    already = kv.pool.key[blk] == key or bp_contains(&kv.pool, key, blk)
    if replace:
        bp_remove_hashes(&kv.pool, blk)
    elif (not already and kv.pool.key[blk] != 0 and kv.pool.key_tokens[blk] < nh * h):
        bp_remove_hashes(&kv.pool, blk)
    bp_insert_block_hash(&kv.pool, blk, key, nh * h)
    return key


cdef int _cache_group(KVCacheC* kv, int32_t gi, ReqC* r, tok_t n) except -1 nogil:
    """SingleTypeKVCacheManager.cache_blocks (+ FullAttention / Mamba extras)."""
    cdef GroupC* g = &kv.groups[gi]
    cdef slot_t s = r.slot
    cdef block_id_t* table = _table(kv, gi, s)
    cdef tok_t bs = g.spec.block_size
    cdef tok_t h = kv.hash_block_size
    cdef int32_t c, f, i, idx, before, after
    cdef bint masked
    cdef block_id_t blk
    cdef hash_t key
    cdef tok_t b, pos
    if g.spec.kind == GK_RING or not g.spec.cacheable:
        return 0
    before = g.num_cached[s] if g.num_cached[s] > 0 else 0
    c = before
    f = <int32_t>(n // bs)
    if c < f:
        masked = _mask(kv, g, r, c, f, True)
        for i in range(c, f):
            blk = table[i]
            if blk == 0 or (masked and not kv.mask[i - c]):
                continue
            key = group_key(_view(kv, r, g.ratio, i), gi)
            if kv.pool.key[blk] != 0:
                # A partial entry is promoted to a full one.
                bp_remove_hashes(&kv.pool, blk)
            bp_insert_block_hash(&kv.pool, blk, key, (i + 1) * bs)
        g.num_cached[s] = f
    if g.spec.kind == GK_FULL:
        if bs == h:
            return 0
        # _cache_partial_tail_block: a key at the prompt's last hash boundary
        # (0.32: of prompt - 1 tokens; 0.31: of the prompt).
        b = ((r.prompt_len - 1) if kv.version >= 32 else r.prompt_len) // h * h
        if b == 0 or b > n or b % bs == 0:
            return 0
        idx = <int32_t>(b // bs)
        if idx >= g.table_len[s]:
            return 0
        _cache_partial_block(kv, gi, r, table[idx], b, False)
        return 0
    if g.spec.kind != GK_MAMBA:
        return 0
    after = g.num_cached[s] if g.num_cached[s] > 0 else 0
    if g.spec.align_mode:
        key = _mamba_partial_tail(kv, gi, r, n)
        if key != 0:
            _push_key(g, key)
    for i in range(before, after):
        blk = table[i]
        if blk == 0 or kv.pool.key[blk] == 0:
            continue
        _push_key(g, kv.pool.key[blk])
    return 0


cdef hash_t _mamba_partial_tail(KVCacheC* kv, int32_t gi, ReqC* r, tok_t n) except? 0 nogil:
    """MambaManager._cache_partial_tail_block (0.31 and 0.32 rules)."""
    cdef GroupC* g = &kv.groups[gi]
    cdef slot_t s = r.slot
    cdef block_id_t* table = _table(kv, gi, s)
    cdef tok_t bs = g.spec.block_size
    cdef tok_t h = kv.hash_block_size
    cdef tok_t pos, latest
    cdef int32_t idx, bidx
    cdef block_id_t blk
    cdef bint is_prompt, is_retained, dense
    cdef hash_t key
    if g.ckpt_pos[s] > 0:
        pos = g.ckpt_pos[s]
        blk = table[g.ckpt_idx[s]]
        if kv.version >= 32:
            is_prompt = pos == ckpt_position(r.prompt_len, kv.align)
            is_retained = False
            if pos % bs == 0:
                bidx = <int32_t>(pos // bs - 1)
                dense = not _mask(kv, g, r, bidx, bidx + 1, False)
                is_retained = dense or kv.mask[0]
            if not is_prompt and not is_retained and pos != r.shared_prefix_boundary:
                bp_remove_hashes(&kv.pool, blk)
                return 0
        else:
            is_prompt = pos == ckpt_position(r.prompt_len, h)
            if (kv.retention == 0 and n < r.prompt_len and not is_prompt
                    and pos != r.shared_prefix_boundary):
                bp_remove_hashes(&kv.pool, blk)
                return 0
        if kv.pool.key[blk] != 0 and kv.pool.key_tokens[blk] == pos:
            return 0
        return _cache_partial_block(kv, gi, r, blk, pos, True)
    if kv.version >= 32:
        if n <= 0 or n % h != 0:
            return 0
        latest = ckpt_position(r.prompt_len, h)
        if n != latest:
            return 0
        idx = <int32_t>(cdiv(n, bs) - 1)
    else:
        if bs == h or n % bs == 0 or n % h != 0:
            return 0
        latest = r.prompt_len // h * h
        if n != latest:
            return 0
        idx = <int32_t>(n // bs)
    if idx >= g.table_len[s]:
        return 0
    blk = table[idx]
    if blk == 0:
        return 0
    key = _cache_partial_block(kv, gi, r, blk, n, False)
    if key != 0 and (kv.version < 32 or n % bs != 0):
        # The running request moves on; its sub-block state is copied at its
        # next allocation (MambaManager.allocate_new_blocks).
        g.partial_idx[s] = idx
        g.partial_src[s] = blk
        g.num_cached[s] = idx
    return key


cdef int kv_cache_blocks(KVCacheC* kv, ReqC* r, tok_t n_tokens) except -1 nogil:
    """KVCacheCoordinator.cache_blocks: each group caches up to ``n_tokens``.

    Several groups cache only up to scheduler-block-aligned lengths unless
    fine-grained hits are on (HybridKVCacheCoordinator._align_cacheable).
    """
    cdef int32_t gi
    cdef tok_t n = n_tokens
    if not kv.caching:
        return 0
    if kv.hybrid and not kv.fine:
        n = n // kv.sched_block_size * kv.sched_block_size
    if n > 0:
        _ensure_hashes(kv, r, <int32_t>(n // kv.hash_block_size))
    for gi in range(kv.n_groups):
        _cache_group(kv, gi, r, n)
    return 0


# ------------------------------------------------------------------ frees

cdef void kv_free(KVCacheC* kv, ReqC* r) noexcept nogil:
    """KVCacheManager.free: each group's table freed tail first, group by group."""
    cdef slot_t s = r.slot
    cdef int32_t gi
    if s < 0:
        return
    for gi in range(kv.n_groups):
        bp_free_reversed(&kv.pool, _table(kv, gi, s), kv.groups[gi].table_len[s])
    _reset_row(kv, s)


cdef void kv_end_schedule(KVCacheC* kv) noexcept nogil:
    """Release the copy-on-write retentions of this step, group by group, in one call."""
    cdef int32_t gi, i
    cdef block_id_t front = bp_head(&kv.pool)
    for gi in range(kv.n_groups):
        for i in range(kv.groups[gi].ret_n):
            bp_free_one(&kv.pool, kv.groups[gi].retained[i], &front)
        kv.groups[gi].ret_n = 0


cdef block_id_t kv_active_blocks(const KVCacheC* kv) noexcept nogil:
    """Blocks referenced by requests (usable blocks minus the free queue)."""
    return kv.pool.num_blocks - 1 - kv.pool.num_free


# ------------------------------------------------------------------ Python handle

cdef int specs_from_dicts(object groups, GroupSpecC* out) except -1:
    """Fill ``out[0 : len(groups)]`` from the group dicts of aisim.config.kvgroups.resolve_groups."""
    if not 1 <= len(groups) <= MAX_GROUPS:
        raise ValueError(f"between 1 and {MAX_GROUPS} KV-cache groups are supported, got {len(groups)}")
    for i, g in enumerate(groups):
        out[i].kind = g["kind"]
        out[i].block_size = g["block_size"]
        out[i].window = g.get("window", 0)
        out[i].cacheable = g.get("cacheable", True)
        out[i].align_mode = g.get("align_mode", False)
        out[i].num_spec = g.get("num_spec", 0)
        out[i].has_ckpt = g.get("has_ckpt", False)
        out[i].ckpt_align = g.get("ckpt_align", 0)
        out[i].admission_cap = g.get("admission_cap", -1)
        out[i].spec_group = g.get("spec_group", -1)
    return 0


cdef class KVCache:
    """A KV-cache manager with its own requests, driven from Python (tests, tools).

    Parameters
    ----------
    num_blocks : int
        Pool size including the null block.
    block_size : int
        Tokens per block of a single full-attention group (ignored with ``groups``).
    max_model_len : int
        Longest sequence.
    requests : list of list of (stream, first, length)
        The prompt segments of every request this manager will see.
    enable_caching : bool
        Prefix caching on.
    watermark_blocks : int
        Blocks kept free when admitting waiting requests.
    groups : list of dict, optional
        Group specs as produced by :func:`aisim.config.kvgroups.resolve_groups`
        (``kind``, ``block_size``, ``window``, ``cacheable``, ``align_mode``,
        ``num_spec``, ``has_ckpt``, ``ckpt_align``, ``admission_cap``,
        ``spec_group``) with ``hash_block_size``, ``sched_block_size``,
        ``fine``, ``retention`` and ``version``.

    Notes
    -----
    Mirrors how vLLM's own tests drive ``KVCacheManager``: the caller sets
    ``num_computed_tokens`` and appends outputs between calls.
    """

    def __cinit__(self, int num_blocks, int block_size, long max_model_len, requests,
                  bint enable_caching=True, int watermark_blocks=0, groups=None,
                  long hash_block_size=0, long sched_block_size=0, bint fine=False,
                  long retention=-1, int version=32):
        import numpy as np
        cdef Py_ssize_t i, n = len(requests)
        cdef GroupSpecC specs[MAX_GROUPS]
        if block_size < 1 or max_model_len < 1 or num_blocks < 2:
            raise ValueError("num_blocks >= 2, block_size >= 1 and max_model_len >= 1 are required")
        if groups is None:
            groups = [dict(kind=0, block_size=block_size, window=0, cacheable=True, align_mode=False,
                           num_spec=0, has_ckpt=False, ckpt_align=0, admission_cap=-1, spec_group=0)]
            hash_block_size = sched_block_size = block_size
        specs_from_dicts(groups, specs)
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
        kv_init(&self.c, num_blocks, <int32_t>len(groups), specs, hash_block_size, sched_block_size,
                fine, enable_caching, retention, version, max_model_len, watermark_blocks, 4)
        self.c.seg_stream = &g_str[0]
        self.c.seg_first = &g_first[0]
        self.c.seg_len = &g_len[0]
        self.reqs = <ReqC*>mem_calloc(n if n > 0 else 1, sizeof(ReqC))
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
        mem_free(self.reqs)

    cdef ReqC* _req(self, int r) except NULL:
        if r < 0 or r >= self.n_reqs:
            raise IndexError(f"no request {r}")
        return &self.reqs[r]

    @property
    def num_free(self):
        return self.c.pool.num_free

    @property
    def cached_free(self):
        """Blocks in the free queue that still carry a key."""
        return self.c.pool.cached_free

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

    def cached_hash_indices(self, int r, int group):
        """Hash-block indices of ``r``'s hashes cached under ``group`` (any block)."""
        cdef ReqC* q = self._req(r)
        _ensure_hashes(&self.c, q, _n_hashes(&self.c, q))
        cdef hash_t* hs = _hashes(&self.c, q.slot)
        return [j for j in range(_n_hashes(&self.c, q))
                if bp_lookup(&self.c.pool, group_key(hs[j], group)) >= 0]

    def evict_key(self, int r, int group, int hash_index):
        """Drop every block cached under ``r``'s hash ``hash_index`` for ``group`` (tests)."""
        cdef ReqC* q = self._req(r)
        _ensure_hashes(&self.c, q, _n_hashes(&self.c, q))
        cdef hash_t key = group_key(_hashes(&self.c, q.slot)[hash_index], group)
        cdef block_id_t b = bp_lookup(&self.c.pool, key)
        while b >= 0:
            bp_remove_hashes(&self.c.pool, b)
            b = bp_lookup(&self.c.pool, key)

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

    def new_step(self):
        """A new schedule() step: release copy retentions, forget same-step states."""
        kv_end_schedule(&self.c)
        kv_new_step_starts(&self.c)

    def get_computed_blocks(self, int r):
        """(hit tokens, hit block ids) for one group, or per group with several."""
        cdef ReqC* q = self._req(r)
        cdef tok_t hit = kv_get_computed_blocks(&self.c, q)
        per = [[self.c.groups[g].hit[i] for i in range(self.c.groups[g].hit_n)] for g in range(self.c.n_groups)]
        return hit, (per[0] if self.c.n_groups == 1 else tuple(per))

    def shared_prefix_boundary(self, int r):
        return self._req(r).shared_prefix_boundary

    def allocate_slots(self, int r, long num_new_tokens, long num_new_computed=0,
                       bint full_sequence_must_fit=False, bint has_scheduled_reqs=True):
        """vLLM's allocate_slots: the newly allocated block ids (per group with
        several groups), or None when it fails."""
        cdef ReqC* q = self._req(r)
        before = self.blocks(r)
        hits = self.get_hits()
        if not kv_allocate_slots(&self.c, q, num_new_tokens, num_new_computed,
                                 full_sequence_must_fit, has_scheduled_reqs):
            return None
        after = self.blocks(r)
        if self.c.n_groups == 1:
            before, after, hits = (before,), (after,), (hits,)
        new = tuple([b for b in a if b != 0 and b not in set(bf) and (num_new_computed == 0 or b not in set(h))]
                    for a, bf, h in zip(after, before, hits))
        return new[0] if self.c.n_groups == 1 else new

    def get_hits(self):
        per = [[self.c.groups[g].hit[i] for i in range(self.c.groups[g].hit_n)] for g in range(self.c.n_groups)]
        return per[0] if self.c.n_groups == 1 else tuple(per)

    def blocks(self, int r):
        """The block table of ``r`` (a tuple of tables with several groups)."""
        cdef ReqC* q = self._req(r)
        per = []
        for g in range(self.c.n_groups):
            t = _table(&self.c, g, q.slot)
            per.append([t[i] for i in range(self.c.groups[g].table_len[q.slot])])
        return per[0] if self.c.n_groups == 1 else tuple(per)

    def cache_blocks(self, int r, long num_tokens):
        kv_cache_blocks(&self.c, self._req(r), num_tokens)

    def free(self, int r):
        """Free every block of ``r``, tail first, group by group."""
        kv_free(&self.c, self._req(r))
