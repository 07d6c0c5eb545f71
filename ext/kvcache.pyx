"""vLLM's KV-cache manager and its per-group managers, as C functions.

One coordinator (``KVCacheC``) over one block pool and ``n_groups`` group
managers (``GroupC``), reproducing every release aisim models (``kv.rules``, the
release's switches; with speculative decoding: the EAGLE last-block drop,
``kv.eagle``, or the lookahead hashes, ``kv.hash_lookahead``):

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

The state managers (Mamba) and the retention masks live in statecache.pxi, the
attention managers' cache-hit lookups in lookups.pxi (both compiled into this module),
the per-request hash chain in hashing.pyx, the per-block row and probe
helpers inline in kvrows.pxd; this module is the coordinator and the
attention managers (full, sliding window, chunked local, ring).

Block hashes are chained over compact token segments (``hashing.pxd``) at
``hash_block_size``; a group whose block is k hash blocks uses every k-th hash
(the last sub-hash of its block, ``BlockHashListWithBlockSize``).  Per-request
tables and hashes live in preallocated rows ("slots"), grown geometrically.
"""

from libc.string cimport memset

from aisim._core.blockpool cimport (
    TAG_DEFER, TAG_LAZY, TAG_LOOKUP, TAG_NONE, bp_defer_run, bp_free_one, bp_key_deferred, bp_materialize,
    bp_prefetch_key, bp_free_reversed, bp_head, bp_init, bp_insert_block_hash,
    bp_cache_lazily, bp_key_lazy, bp_pop_free, bp_pop_n, bp_release, bp_remove_hashes, bp_touch,
)
from aisim._core.hashing cimport group_key, hash_extend
from aisim._core.kvrows cimport (
    kv_apply_cow, kv_evictable, kv_fill_null, kv_hashes, kv_n_hashes, kv_probe, kv_put_hit,
    kv_set_hit_n, kv_table, kv_view,
)
from aisim._core.memory cimport mem_free, mem_grow, mem_resize
from aisim._core.request cimport ReqC
from aisim._core.types cimport RulesC, block_id_t, flag_t, hash_t, int32_t, slot_t, spec_mode, spec_off_t, spec_on_t, tok_t
from aisim._core.util cimport cdiv, num_tokens, tmax, tmin

# The state managers and retention masks (state_lookup, state_blocks_needed,
# state_allocate, state_cache_tail, retention_mask, cache_partial_block): their
# own source file, compiled into this module so that the coordinator's calls
# stay inlinable.
include "statecache.pxi"

# ------------------------------------------------------------------ set-up

cdef int _grow_slots(KVCacheC* kv, slot_t new_cap) except -1 nogil:
    cdef slot_t old = kv.cap_slots
    cdef slot_t s
    cdef int32_t i
    cdef GroupC* g
    # The rows of hashes and block tables are read only below their counts (num_hashed, table_len,
    # reset when a row is taken): a new row is not zeroed, as a row taken again is not.
    mem_resize(<void**>&kv.hashes, <size_t>new_cap * kv.hash_row, sizeof(hash_t))
    mem_grow(<void**>&kv.num_hashed, old, new_cap, sizeof(int32_t))
    mem_grow(<void**>&kv.cur_seg, old, new_cap, sizeof(int32_t))
    mem_grow(<void**>&kv.cur_off, old, new_cap, sizeof(tok_t))
    mem_grow(<void**>&kv.free_slots, old, new_cap, sizeof(slot_t))
    for i in range(kv.n_groups):
        g = &kv.groups[i]
        mem_resize(<void**>&g.tables, <size_t>new_cap * g.table_row, sizeof(block_id_t))
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
                 tok_t retention, RulesC rules, tok_t max_model_len,
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
    kv.rules = rules
    kv.retention = retention
    kv.max_model_len = max_model_len
    kv.watermark_blocks = watermark_blocks
    kv.tag_group = -1
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
    mem_grow(<void**>&kv.tmp_verified, 0, n_groups, sizeof(flag_t))
    mem_grow(<void**>&kv.tmp_blocks, 0, n_groups, sizeof(block_id_t))
    mem_grow(<void**>&kv.mask, 0, widest, sizeof(flag_t))
    mem_grow(<void**>&kv.tmp_keys, 0, widest, sizeof(hash_t))
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
    mem_free(kv.tmp_verified)
    mem_free(kv.tmp_blocks)
    mem_free(kv.mask)
    mem_free(kv.tmp_keys)
    mem_free(kv.node_hash)
    mem_free(kv.node_hash_base)
    mem_free(kv.node_hash_n)
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


# ------------------------------------------------------------------ lookups

include "lookups.pxi"


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


cdef tok_t _blocks_needed(KVCacheC* kv, int32_t gi, ReqC* r, tok_t n_tokens, bint use_hits,
                          tok_t total_computed, tok_t local_computed, tok_t main_tokens,
                          bint apply_cap, tok_t prefill_end) noexcept nogil:
    """SingleTypeKVCacheManager.get_num_blocks_to_allocate and its overrides."""
    cdef GroupC* g = &kv.groups[gi]
    cdef slot_t s = r.slot
    cdef tok_t bs = g.spec.block_size
    cdef int32_t n_hits = g.hit_n if use_hits else 0
    cdef tok_t required, have, skipped, new_blocks
    have = g.table_len[s]
    if g.spec.kind == GK_RING:
        return 0 if have > 0 else 1
    if g.spec.kind == GK_MAMBA:
        # A state cached in this very step may not be written yet: refuse.
        if n_hits > 0 and state_cached_this_step(g, kv.pool.blk[g.hit[n_hits - 1]].key):
            return kv.pool.num_blocks + 1
        if g.spec.align_mode:
            return state_blocks_needed(kv, gi, r, n_hits, total_computed, local_computed, main_tokens,
                                       apply_cap, prefill_end)
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
    return new_blocks + kv_evictable(kv, g, <int32_t>tmax(0, skipped - have), n_hits)


# ------------------------------------------------------------------ window and state releases

cdef int _remove_skipped(KVCacheC* kv, int32_t gi, ReqC* r, tok_t processed) except -1 nogil:
    """remove_skipped_blocks: null and free blocks that left the window."""
    cdef GroupC* g = &kv.groups[gi]
    cdef slot_t s = r.slot
    cdef block_id_t* table = kv_table(kv, gi, s)
    cdef tok_t skipped = _skipped_tokens(g, processed)
    cdef int32_t sb, i, first, last, n = g.table_len[s]
    cdef block_id_t front
    if g.spec.kind == GK_FULL or g.spec.kind == GK_RING:
        return 0
    if skipped > 0:
        sb = <int32_t>tmin(skipped // g.spec.block_size, n)
        if g.spec.kind == GK_MAMBA and g.spec.align_mode:
            # Skip over nulls; remember how far blocks were retired.
            first = g.retired[s]
            if first < sb:
                # One free_blocks call: table[sb - 1] down to table[first], nulls skipped
                # (MambaManager._remove_blocks_in_range, single_type_kv_cache_manager.py); the
                # nulls at either end, most of the range in align mode, are not passed.
                last = sb
                while first < last and table[first] == 0:
                    first += 1
                while first < last and table[last - 1] == 0:
                    last -= 1
                if first < last:
                    bp_free_reversed(&kv.pool, &table[first], last - first)
                    for i in range(first, last):
                        table[i] = 0
                g.retired[s] = sb
        else:
            if r.lazy_keys and sb > 0:
                # Freed blocks leave the request's table: those cached lazily get their keys now,
                # which its lookup after a preemption could find (kv_key_lazy keys the rest).
                hash_extend(kv, r, sb)
            # Highest index first, stopping at the first null: one free_blocks call
            # (SingleTypeKVCacheManager._remove_blocks_in_range).
            first = sb
            while first > 0 and table[first - 1] != 0:
                first -= 1
                if r.lazy_keys:
                    _key_lazy_block(kv, gi, r, first, table[first])
            if first < sb:
                bp_free_reversed(&kv.pool, &table[first], sb - first)
                for i in range(first, sb):
                    table[i] = 0
    if g.spec.kind == GK_MAMBA and g.spec.align_mode:
        # The previous chunk's state, kept one step as the next initial state.
        i = g.last_state[s]
        if i >= 0 and i < cdiv(processed, g.spec.block_size) - 1 and table[i] != 0:
            front = bp_head(&kv.pool)
            bp_free_one(&kv.pool, table[i], &front)
            table[i] = 0
    return 0


# ------------------------------------------------------------------ allocation

cdef void _add_hits(KVCacheC* kv, int32_t gi, ReqC* r, tok_t local) noexcept nogil:
    # SingleTypeKVCacheManager.add_local_computed_blocks: touch and adopt.
    cdef GroupC* g = &kv.groups[gi]
    cdef slot_t s = r.slot
    cdef block_id_t* table = kv_table(kv, gi, s)
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


cdef int _allocate_new_blocks(KVCacheC* kv, int32_t gi, ReqC* r, tok_t n_tokens,
                              tok_t main_tokens) except -1 nogil:
    """allocate_new_blocks of each manager kind."""
    cdef GroupC* g = &kv.groups[gi]
    cdef slot_t s = r.slot
    cdef block_id_t* table = kv_table(kv, gi, s)
    cdef tok_t bs = g.spec.block_size
    cdef int32_t k
    cdef block_id_t cow
    if g.spec.kind == GK_RING:
        if g.table_len[s] == 0:
            table[0] = bp_pop_free(&kv.pool)
            g.table_len[s] = 1
        return 0
    if g.spec.kind == GK_MAMBA and g.spec.align_mode:
        return state_allocate(kv, gi, r, main_tokens)
    if g.spec.kind == GK_MAMBA:
        n_tokens += bs * g.spec.num_spec
    if g.partial_idx[s] >= 0:
        cow = bp_pop_free(&kv.pool)
        kv_apply_cow(kv, gi, s, cow)
        g.partial_idx[s] = -1
    k = <int32_t>(cdiv(n_tokens, bs) - g.table_len[s])
    if k > 0:
        bp_pop_n(&kv.pool, &table[g.table_len[s]], k)
        g.table_len[s] += k
    return 0


cdef int kv_allocate_slots(KVCacheC* kv, ReqC* r, tok_t num_new_tokens, tok_t num_new_computed,
                           bint full_sequence_must_fit, bint has_scheduled_reqs,
                           tok_t num_lookahead, bint delay_cache) except -1 nogil:
    """KVCacheManager.allocate_slots; 1 when allocated, 0 when it returns None.

    ``num_new_computed`` > 0 adopts the blocks of the last lookup.  On failure
    nothing changes except out-of-window blocks, which vLLM frees first.
    ``num_lookahead`` slots past the scheduled tokens are reserved for the
    drafter (speculative decoding; never cached); Mamba in align mode ignores
    them (``MambaManager.get_num_blocks_to_allocate`` counts the main model's tokens).
    ``delay_cache`` skips caching the blocks (a KV connector's asynchronous load).
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
    need_slot = tmin(main_tokens + num_lookahead, kv.max_model_len)
    # Out-of-window blocks are released before the capacity check.
    for gi in range(kv.n_groups):
        _remove_skipped(kv, gi, r, tmax(0, total - r.num_in_flight))
    need = 0
    for gi in range(kv.n_groups):
        need += _blocks_needed(kv, gi, r, need_slot, use_hits, local, local, main_tokens, False, prefill_end)
    if need + wm > kv.pool.num_free - kv.reserved:
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
    if kv.caching and not delay_cache:
        # delay_cache_blocks (an asynchronous KV load): no block is cached before its KV is there.
        kv_cache_blocks(kv, r, tmin(total + num_new_tokens, num_tokens(r)))
    return 1


# Where a decode touches the cache (the engine's macro-steps): compiled into this module.
include "decodes.pxi"


# ------------------------------------------------------------------ caching

cdef int _cache_group(KVCacheC* kv, int32_t gi, ReqC* r, tok_t n, spec_mode* mode) except -1 nogil:
    """SingleTypeKVCacheManager.cache_blocks (+ FullAttention / Mamba extras)."""
    cdef bint spec = spec_mode is spec_on_t
    cdef GroupC* g = &kv.groups[gi]
    cdef slot_t s = r.slot
    cdef block_id_t* table = kv_table(kv, gi, s)
    cdef tok_t bs = g.spec.block_size
    cdef tok_t h = kv.hash_block_size
    cdef int32_t c, f, i, j, idx, before, after, keyed, m
    cdef hash_t* keys
    cdef tok_t end
    cdef bint defer
    cdef bint masked
    cdef block_id_t blk
    cdef tok_t b, pos
    if g.spec.kind == GK_RING or not g.spec.cacheable:
        return 0
    before = g.num_cached[s] if g.num_cached[s] > 0 else 0
    c = before
    # Only blocks whose hash exists are cached: with lookahead hashes (0.33)
    # a full block waits for the tokens after it (SingleTypeKVCacheManager.cache_blocks).
    # Without them every full block of the n <= num_tokens tokens has its hash.
    if spec and kv.hash_lookahead > 0:
        f = <int32_t>(tmin(n, <tok_t>kv_n_hashes(kv, r) * h) // bs)
    else:
        f = <int32_t>(n // bs)
    if c < f:
        masked = retention_mask(kv, g, r, c, f, True)
        keyed = f
        if r.lazy_keys:
            # Blocks past those another request may share are cached without keys (kv_lazy_ok:
            # attention groups at the hash block, no partial entries); the shared ones below.
            keyed = <int32_t>tmin(tmax(c, r.key_blocks), f)
            _cache_lazily(kv, table, keyed, f, c, masked, bs)
        defer = r.lazy_keys and kv.pool.n_nodes > 0
        if defer:
            # A lazily keyed request's shared blocks: those of a run no other request in the
            # engine holds wait outside the map until one arrives (kv_arrive), so most never reach
            # it; the run cursor (m, end) follows each block's last token.  The keys first, in one
            # pass.
            keys = kv.tmp_keys
            for i in range(c, keyed):
                keys[i - c] = group_key(kv_view(kv, r, g.ratio, i), gi)
            # A run's blocks (those whose last token is in it: below end // bs) are taken together.
            m = 0
            end = _run_length(kv, r, 0)
            i = c
            while i < keyed:
                while end // bs <= i:
                    m += 1
                    end += _run_length(kv, r, m)
                j = <int32_t>tmin(end // bs, keyed)
                if m >= r.node_n:
                    # A run no other request holds.
                    _cache_lazily(kv, table, i, j, c, masked, bs)
                elif kv.pool.node_present[kv.run_node[r.node_off + m]] <= 1:
                    bp_defer_run(&kv.pool, &table[i], &keys[i - c], &kv.mask[i - c] if masked else NULL, j - i,
                                 (i + 1) * bs, bs, kv.run_node[r.node_off + m])
                else:
                    for i in range(i, j):
                        blk = table[i]
                        if blk != 0 and not (masked and not kv.mask[i - c]):
                            _insert_key(kv, gi, r, i, blk, keys[i - c])
                i = j
        elif kv.pool.far_map:
            # A map past the near caches: the run's keys in one pass, each one's map slot fetched
            # ahead of its insertion, so the inserts find their slots in cache rather than one
            # memory round trip each.
            keys = kv.tmp_keys
            for i in range(c, keyed):
                keys[i - c] = group_key(kv_view(kv, r, g.ratio, i), gi)
                bp_prefetch_key(&kv.pool, keys[i - c])
            for i in range(c, keyed):
                blk = table[i]
                if blk != 0 and not (masked and not kv.mask[i - c]):
                    _insert_key(kv, gi, r, i, blk, keys[i - c])
        else:
            for i in range(c, keyed):
                blk = table[i]
                if blk != 0 and not (masked and not kv.mask[i - c]):
                    _insert_key(kv, gi, r, i, blk, group_key(kv_view(kv, r, g.ratio, i), gi))
        g.num_cached[s] = f
    if g.spec.kind == GK_FULL:
        if bs == h:
            return 0
        # FullAttentionManager._cache_partial_tail_block: a key at the prompt's last hash
        # boundary (full_tail_key_leaves_last_token: of prompt - 1 tokens, of the prompt
        # with the EAGLE drop; else of the prompt), at most the hashes the request has
        # (cache_blocks_capped_by_hashes).
        b = ((r.prompt_len - 1) if kv.rules.full_tail_key_leaves_last_token and not (spec and kv.eagle)
             else r.prompt_len) // h
        if spec and kv.rules.cache_blocks_capped_by_hashes:
            b = tmin(b, kv_n_hashes(kv, r))
        b *= h
        if b == 0 or b > n or b % bs == 0:
            return 0
        idx = <int32_t>(b // bs)
        if idx >= g.table_len[s]:
            return 0
        cache_partial_block(kv, gi, r, table[idx], b, False)
        return 0
    if g.spec.kind != GK_MAMBA:
        return 0
    return state_cache_tail(kv, gi, r, n, before, mode)


cdef inline void _cache_lazily(KVCacheC* kv, block_id_t* table, int32_t a, int32_t b, int32_t c, bint masked,
                               tok_t bs) noexcept nogil:
    """Cache the table's blocks a .. b without keys; when ``masked``, only those the retention mask
    (from block c) keeps."""
    cdef int32_t i
    if not masked:
        bp_cache_lazily(&kv.pool, &table[a], b - a, a * bs, bs)
        return
    for i in range(a, b):
        if kv.mask[i - c]:
            bp_cache_lazily(&kv.pool, &table[i], 1, i * bs, bs)


cdef inline int _insert_key(KVCacheC* kv, int32_t gi, ReqC* r, int32_t i, block_id_t blk,
                            hash_t key) except -1 nogil:
    # Block i of group gi enters the map under ``key`` (BlockPool.cache_full_blocks).
    cdef int32_t tag = TAG_NONE
    if kv.pool.blk[blk].key != 0:
        # A partial entry is promoted to a full one.
        bp_remove_hashes(&kv.pool, blk)
    if gi == kv.tag_group:
        # The router's id of a prompt block; a block past the prompt holds output tokens,
        # which only a later prompt that quotes them can share (tag_look).
        tag = (kv.tag_ids[r.tag_off + i] if i < r.tag_n
               else (TAG_LOOKUP if r.tag_look else TAG_NONE))
    return bp_insert_block_hash(&kv.pool, blk, key, (i + 1) * kv.groups[gi].spec.block_size, tag)


cdef inline tok_t _run_length(const KVCacheC* kv, const ReqC* r, int32_t m) noexcept nogil:
    # Tokens of run m of a request: its prompt segments, then its output stream.
    if m < r.seg_cnt:
        return kv.seg_len[r.seg_off + m]
    return r.max_tokens


cdef inline int32_t _hash_blocks(const KVCacheC* kv, const ReqC* r, tok_t n) noexcept nogil:
    # Hash blocks of the first n tokens that have their hash (lookahead hashes wait for later tokens).
    if kv.hash_lookahead == 0:
        return <int32_t>(n // kv.hash_block_size)
    return <int32_t>tmin(n // kv.hash_block_size, kv_n_hashes(kv, r))


cdef int kv_cache_blocks(KVCacheC* kv, ReqC* r, tok_t n_tokens) except -1 nogil:
    """KVCacheCoordinator.cache_blocks: each group caches up to ``n_tokens``.

    Several groups cache only up to scheduler-block-aligned lengths unless
    fine-grained hits are on (HybridKVCacheCoordinator._align_cacheable).
    Compiled once with and once without the speculative-decoding rules (the
    EAGLE drop's extra block, lookahead hashes), so that they cost nothing when off.
    """
    if kv.eagle or kv.hash_lookahead > 0:
        return _cache_blocks(kv, r, n_tokens, <spec_on_t*>NULL)
    return _cache_blocks(kv, r, n_tokens, <spec_off_t*>NULL)


cdef int _cache_blocks(KVCacheC* kv, ReqC* r, tok_t n_tokens, spec_mode* mode) except -1 nogil:
    cdef bint spec = spec_mode is spec_on_t
    cdef int32_t gi
    cdef tok_t n = n_tokens
    cdef tok_t full = n_tokens, ng
    cdef bint extra = False
    if not kv.caching:
        return 0
    if kv.hybrid and not kv.fine:
        n = n // kv.sched_block_size * kv.sched_block_size
        # EAGLE groups match one block past an aligned boundary and drop it,
        # so that block may be cached too
        # (HybridKVCacheCoordinator.get_num_cacheable_tokens, 0.31 cache_blocks).
        extra = spec and kv.eagle and n > 0
    if n > 0 and r.lazy_keys:
        # Only the blocks another request may share get their keys now (_cache_group).
        hash_extend(kv, r, <int32_t>tmin(n // kv.hash_block_size, r.key_blocks))
    elif n > 0:
        hash_extend(kv, r, _hash_blocks(kv, r, full if extra else n) if spec else <int32_t>(n // kv.hash_block_size))
    for gi in range(kv.n_groups):
        ng = n
        if extra:
            ng = tmin(full, n + kv.groups[gi].spec.block_size)
        _cache_group(kv, gi, r, ng, mode)
    return 0


# ------------------------------------------------------------------ lazy keys

include "lazykeys.pxi"


# ------------------------------------------------------------------ frees

cdef void kv_free(KVCacheC* kv, ReqC* r) noexcept nogil:
    """KVCacheManager.free: each group's table freed tail first, group by group."""
    cdef slot_t s = r.slot
    cdef int32_t gi
    if s < 0:
        return
    for gi in range(kv.n_groups):
        bp_free_reversed(&kv.pool, kv_table(kv, gi, s), kv.groups[gi].table_len[s])
    _reset_row(kv, s)


cdef void kv_end_schedule(KVCacheC* kv) noexcept nogil:
    """Release the copy-on-write retentions of this step, group by group, in one call."""
    cdef int32_t gi, i
    cdef block_id_t front = -1  # bp_head's cursor, taken at the first retention (most steps have none)
    for gi in range(kv.n_groups):
        if kv.groups[gi].ret_n == 0:
            continue
        if front == -1:
            front = bp_head(&kv.pool)
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


