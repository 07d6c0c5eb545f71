# vLLM's state managers (MambaManager) and the retention rules they share.
#
# A state group (Mamba, GDN, KDA, conv) keeps one running state per request
# rather than per-token KV.  What differs from attention groups lives here:
#
# * ``state_lookup``: the latest cached state, scanned right to left (at any
#   hash boundary with fine-grained hits);
# * ``state_blocks_needed`` / ``state_allocate``: align mode, where a prefill
#   writes at most one new state block per step, null-padded, with
#   copy-on-write of a sub-block hit and an internal prefill checkpoint
#   (``_needs_internal_checkpoint``);
# * ``state_cache_tail``: the partial tail state (``_cache_partial_tail_block``,
#   0.31 and 0.32 rules) and ``cached_blocks_this_step``;
# * ``retention_mask``: which blocks a later request can reach (sliding-window
#   and state groups), and ``cache_partial_block`` (BlockPool.cache_partial_block).
#
# The coordinator in kvcache.pyx dispatches here once per group and call; the
# per-block helpers are inline (``kvrows.pxd``).
#
# Included by kvcache.pyx (one compilation unit: the coordinator's calls into the
# state managers stay plain C calls the compiler can inline; a separate extension
# module would reach them through a function-pointer table).


from aisim._core.blockpool cimport (
    TAG_NONE, bp_contains, bp_insert_block_hash, bp_move_hashes, bp_pop_free, bp_remove_hashes,
)
from aisim._core.hashing cimport group_key
from aisim._core.kvrows cimport (
    kv_apply_cow, kv_evictable, kv_fill_null, kv_hashes, kv_n_hashes, kv_probe, kv_put_hit,
    kv_retain, kv_set_hit_n, kv_table, kv_view,
)
from aisim._core.memory cimport mem_grow
from aisim._core.request cimport ReqC
from aisim._core.types cimport block_id_t, hash_t, int32_t, slot_t, spec_mode, spec_on_t, tok_t
from aisim._core.util cimport cdiv, ckpt_position_v, tmax, tmin


# ------------------------------------------------------------------ cached this step

cdef inline bint state_cached_this_step(const GroupC* g, hash_t key) noexcept nogil:
    # MambaManager: ``key`` is in cached_blocks_this_step (its state may not be written yet).
    cdef int32_t i
    if key == 0:
        return False
    for i in range(g.cts_n):
        if g.cts[i] == key:
            return True
    return False


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


# ------------------------------------------------------------------ lookup

cdef tok_t state_lookup(KVCacheC* kv, ReqC* r, int32_t sg, tok_t max_length, tok_t align) noexcept nogil:
    # MambaManager.find_longest_cache_hit: the latest cached state, right to left.
    cdef GroupC* g = &kv.groups[kv.spec_members[kv.spec_first[sg]]]
    cdef tok_t bs = g.spec.block_size
    cdef int32_t n_raw = kv_n_hashes(kv, r)
    cdef int32_t i, fi, idx, scale, max_units, max_blocks
    cdef hash_t* raw = kv_hashes(kv, r.slot)
    kv_set_hit_n(kv, sg, 0)
    if align < bs and bs % align == 0:
        # Fine-grained: any hash boundary may hold a state.
        scale = <int32_t>(bs // align)
        max_units = <int32_t>tmin(max_length // align, n_raw)
        for fi in range(max_units - 1, -1, -1):
            if kv_probe(kv, sg, raw[fi]):
                idx = fi // scale
                kv_fill_null(kv, sg, 0, idx)
                kv_put_hit(kv, sg, idx)
                kv_set_hit_n(kv, sg, idx + 1)
                return (fi + 1) * align
        return 0
    max_blocks = <int32_t>tmin(max_length // bs, n_raw // g.ratio)
    for i in range(max_blocks - 1, -1, -1):
        if kv_probe(kv, sg, kv_view(kv, r, g.ratio, i)):
            if bs != align and ((i + 1) * bs) % align != 0:
                continue
            kv_fill_null(kv, sg, 0, i)
            kv_put_hit(kv, sg, i)
            kv_set_hit_n(kv, sg, i + 1)
            return (i + 1) * bs
    return 0


# ------------------------------------------------------------------ checkpoints and block counts

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
    cdef block_id_t* table = kv_table(kv, <int32_t>(g - kv.groups), s)
    cdef int32_t n = g.table_len[s]
    if not (g.spec.has_ckpt and g.spec.align_mode and end >= prefill_end):
        return False
    if not _ckpt_valid(start, end, pos, kv.hash_block_size, g.spec.block_size, g.spec.ckpt_align):
        return False
    if idx < 0:
        return False
    return idx >= n or table[idx] == 0 or (g.allocated[s] and idx >= n - g.spec.num_spec)


cdef tok_t state_blocks_needed(KVCacheC* kv, int32_t gi, ReqC* r, int32_t n_hits, tok_t total_computed,
                               tok_t local_computed, tok_t main_tokens, bint apply_cap,
                               tok_t prefill_end) noexcept nogil:
    """MambaManager.get_num_blocks_to_allocate in align mode.

    Also records the prefill checkpoint the coming allocation will place
    (``apply_cap`` false: the real admission, not the full-sequence gate).
    """
    cdef GroupC* g = &kv.groups[gi]
    cdef slot_t s = r.slot
    cdef tok_t bs = g.spec.block_size
    cdef tok_t have = g.table_len[s]
    cdef tok_t required, new_blocks, pos, cap
    cdef bint partial, ckpt
    required = cdiv(main_tokens, bs) + g.spec.num_spec
    new_blocks = required - n_hits - have
    partial = (n_hits > 0 and local_computed % bs != 0) or g.partial_idx[s] >= 0
    if partial:
        new_blocks = tmax(new_blocks, 0) + 1
    # The checkpoint at cache_hit_alignment_tokens (mamba_alloc_ckpt_at_alignment), else at
    # the hash block size (MambaManager.get_num_blocks_to_allocate).
    pos = ckpt_position_v(main_tokens, kv.align if kv.rules.mamba_alloc_ckpt_at_alignment else kv.hash_block_size,
                          kv.eagle, kv.rules.ckpt_position_rounds_n_under_drop, kv.hash_lookahead)
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
        if not g.allocated[s] or (not kv.rules.mamba_drafts_capped_first_only and ckpt):
            cap += g.spec.num_spec
        new_blocks = tmin(new_blocks, cap)
    return new_blocks + kv_evictable(kv, g, 0, n_hits)


# ------------------------------------------------------------------ allocation

cdef int state_allocate(KVCacheC* kv, int32_t gi, ReqC* r, tok_t main_tokens) except -1 nogil:
    """MambaManager.allocate_new_blocks in align mode: one running state block per
    step, padded with nulls, plus copy-on-write and checkpoint blocks."""
    cdef GroupC* g = &kv.groups[gi]
    cdef slot_t s = r.slot
    cdef block_id_t* table = kv_table(kv, gi, s)
    cdef tok_t bs = g.spec.block_size
    cdef int32_t required, prev, skip, i, k, null_end, keep
    cdef bint ckpt, partial, was_allocated
    cdef block_id_t cow, b
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
    if was_allocated and (kv.rules.mamba_relocate_drafts_with_ckpt or not ckpt):
        # Speculative scratch blocks now inside the padding move to the tail.
        keep = skip - <int32_t>ckpt if kv.rules.mamba_relocate_drafts_with_ckpt else skip
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
            kv_retain(g, g.partial_src[s], cow)
            kv.pool.blk[g.partial_src[s]].ref_cnt += 1
            if kv.pool.blk[cow].key != 0:
                _push_key(g, kv.pool.blk[cow].key)
        else:
            kv_apply_cow(kv, gi, s, cow)
    for i in range(k):
        b = bp_pop_free(&kv.pool)
        table[g.table_len[s]] = b
        g.table_len[s] += 1
    g.allocated[s] = 1
    g.partial_idx[s] = -1
    return 0


# ------------------------------------------------------------------ caching

cdef bint retention_mask(KVCacheC* kv, GroupC* g, ReqC* r, int32_t start, int32_t end,
                bint with_boundaries) noexcept nogil:
    """reachable_block_mask into kv.mask[0 : end - start]; False means dense.

    Sliding-window and Mamba groups keep only the blocks a later request can
    reach: the tail of each retention segment and the replay boundaries
    (prompt - 1, the shared-prefix junction).
    """
    cdef tok_t bs = g.spec.block_size
    cdef tok_t align = kv.align   # cache_hit_alignment_tokens
    cdef tok_t seg, aligned, b, B, lo, hi
    cdef int32_t need, per, i, j, e, first, k, shift
    cdef tok_t bounds[3]
    cdef int32_t n_bounds = 0
    if g.spec.kind != GK_SWA and g.spec.kind != GK_MAMBA:
        return False
    if with_boundaries:
        if kv.eagle:
            # replay_boundaries with EAGLE groups: the block below a resend's
            # and a longer sibling's aligned hit, which they match and drop back from.
            B = kv.sched_block_size
            lo = tmax((r.prompt_len - 1) // B * B - B, 0)
            hi = tmax(r.prompt_len // B * B - B, 0)
            bounds[0] = lo
            n_bounds = 1
            if hi != lo:
                bounds[1] = hi
                n_bounds = 2
        else:
            bounds[0] = r.prompt_len - 1
            n_bounds = 1
        if r.shared_prefix_boundary:
            bounds[n_bounds] = r.shared_prefix_boundary
            n_bounds += 1
    if g.spec.kind == GK_SWA:
        if align % bs != 0:
            return False
        # The EAGLE peek: one more block, and the run's right edge one block later.
        shift = <int32_t>kv.eagle
        need = <int32_t>cdiv(g.spec.window - 1, bs) + shift
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
                if i >= shift and (i - shift) % per >= per - need:
                    kv.mask[i - start] = 1
        if kv.retention >= 0:
            for k in range(n_bounds):
                aligned = bounds[k] // align * align
                e = <int32_t>(aligned // bs) + shift
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


cdef hash_t cache_partial_block(KVCacheC* kv, int32_t gi, ReqC* r, block_id_t blk, tok_t n,
                                 bint replace) except? 0 nogil:
    """BlockPool.cache_partial_block: key ``blk`` at the hash boundary ``n``."""
    cdef tok_t h = kv.hash_block_size
    cdef int32_t nh = <int32_t>(n // h)
    cdef hash_t key
    cdef bint already
    if blk == 0:
        return 0
    key = group_key(kv_hashes(kv, r.slot)[nh - 1], gi)
    already = kv.pool.blk[blk].key == key or bp_contains(&kv.pool, key, blk)
    if replace:
        bp_remove_hashes(&kv.pool, blk)
    elif (not already and kv.pool.blk[blk].key != 0 and kv.pool.blk[blk].key_tokens < nh * h):
        bp_remove_hashes(&kv.pool, blk)
    bp_insert_block_hash(&kv.pool, blk, key, nh * h, TAG_NONE)
    return key


cdef hash_t _mamba_partial_tail(KVCacheC* kv, int32_t gi, ReqC* r, tok_t n, spec_mode* mode) except? 0 nogil:
    """MambaManager._cache_partial_tail_block (the release's switches in ``kv.rules``)."""
    # Compiled per speculative-decoding mode (as the caching functions of kvcache.pyx).
    cdef bint eagle = spec_mode is spec_on_t and kv.eagle
    cdef tok_t la = kv.hash_lookahead if spec_mode is spec_on_t else 0
    cdef bint rn = kv.rules.ckpt_position_rounds_n_under_drop
    cdef GroupC* g = &kv.groups[gi]
    cdef slot_t s = r.slot
    cdef block_id_t* table = kv_table(kv, gi, s)
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
        if kv.rules.mamba_ckpt_key_kept_at_boundaries:
            is_prompt = pos == ckpt_position_v(r.prompt_len, kv.align, eagle, rn, la)
            is_retained = False
            if pos % bs == 0:
                bidx = <int32_t>(pos // bs - 1)
                dense = not retention_mask(kv, g, r, bidx, bidx + 1, False)
                is_retained = dense or kv.mask[0]
            if not is_prompt and not is_retained and pos != r.shared_prefix_boundary:
                bp_remove_hashes(&kv.pool, blk)
                return 0
        else:
            is_prompt = pos == ckpt_position_v(r.prompt_len, h, eagle, rn, la)
            if (kv.retention == 0 and n < r.prompt_len and not is_prompt
                    and pos != r.shared_prefix_boundary):
                bp_remove_hashes(&kv.pool, blk)
                return 0
        if kv.pool.blk[blk].key != 0 and kv.pool.blk[blk].key_tokens == pos:
            return 0
        return cache_partial_block(kv, gi, r, blk, pos, True)
    if kv.rules.mamba_tail_key_leaves_last_token:
        if n <= 0 or n % h != 0:
            return 0
        latest = ckpt_position_v(r.prompt_len, h, eagle, rn, la)
        if n != latest:
            return 0
        idx = <int32_t>(cdiv(n, bs) - 1)
    else:
        if bs == h or n % bs == 0 or n % h != 0:
            return 0
        latest = r.prompt_len // h * h
        if eagle:
            # EAGLE groups match one hash unit past the candidate and drop it.
            latest = tmax(latest - h, 0)
        if n != latest:
            return 0
        idx = <int32_t>(n // bs)
    if idx >= g.table_len[s]:
        return 0
    blk = table[idx]
    if blk == 0:
        return 0
    if kv.rules.mamba_tail_keyed_once and kv.pool.blk[blk].key != 0 and kv.pool.blk[blk].key_tokens == n:
        # mamba_tail_keyed_once: a block already keyed at this length (e.g. the request's own
        # hit block after a resume) is left alone: no new key, no mark in
        # cached_blocks_this_step, no sub-block bookkeeping
        # (MambaManager._cache_partial_tail_block returns early when
        # source_block.block_hash_num_tokens == num_tokens).
        return 0
    key = cache_partial_block(kv, gi, r, blk, n, False)
    if key != 0 and (not kv.rules.mamba_tail_key_leaves_last_token or n % bs != 0):
        # The running request moves on; its sub-block state is copied at its
        # next allocation (MambaManager.allocate_new_blocks).
        g.partial_idx[s] = idx
        g.partial_src[s] = blk
        g.num_cached[s] = idx
    return key


cdef int state_cache_tail(KVCacheC* kv, int32_t gi, ReqC* r, tok_t n, int32_t before,
                          spec_mode* mode) except -1 nogil:
    """MambaManager.cache_blocks after the common part: the partial tail state
    and cached_blocks_this_step (blocks ``before`` .. num_cached were just keyed)."""
    cdef GroupC* g = &kv.groups[gi]
    cdef slot_t s = r.slot
    cdef block_id_t* table = kv_table(kv, gi, s)
    cdef int32_t i, after
    cdef block_id_t blk
    cdef hash_t key
    after = g.num_cached[s] if g.num_cached[s] > 0 else 0
    if g.spec.align_mode:
        key = _mamba_partial_tail(kv, gi, r, n, mode)
        if key != 0:
            _push_key(g, key)
    for i in range(before, after):
        blk = table[i]
        if blk == 0 or kv.pool.blk[blk].key == 0:
            continue
        _push_key(g, kv.pool.blk[blk].key)
    return 0
