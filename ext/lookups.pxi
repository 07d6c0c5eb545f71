# Included into kvcache.pyx: the cache-hit lookups of the attention managers (full attention,
# sliding window, chunked local) and the coordinator's fixed point over spec-groups
# (kv_get_computed_blocks); state groups look up in statecache.pxi.  Compiled into kvcache so
# they read the same inline row and probe helpers (kvrows.pxd).


cdef inline int32_t _probe_hashes(const KVCacheC* kv, const ReqC* r) noexcept nogil:
    # Hash blocks a lookup may find: every one, or for a request keyed lazily its leading blocks
    # another request shares (ReqC.key_blocks).  Its later keys are no other request's and it
    # holds no block of its own while keyed lazily (kv_key_lazy ends that at a preemption), so a
    # probe of one of them misses: a lookup stopping before them ends where it would have.
    cdef int32_t n = kv_n_hashes(kv, r)
    if r.lazy_keys and r.key_blocks < n:
        return r.key_blocks
    return n


cdef tok_t _lookup_full(KVCacheC* kv, ReqC* r, int32_t sg, tok_t max_length, tok_t align,
                       bint drop) noexcept nogil:
    # FullAttentionManager.find_longest_cache_hit
    cdef GroupC* g = &kv.groups[kv.spec_members[kv.spec_first[sg]]]
    cdef tok_t bs = g.spec.block_size
    cdef int32_t n_raw = _probe_hashes(kv, r)
    cdef int32_t view_len = n_raw // g.ratio
    cdef int32_t n = 0, i, scale, first, max_partial, fi
    cdef tok_t hit
    cdef bint fine = align < bs and bs % align == 0
    cdef hash_t* raw = kv_hashes(kv, r.slot)
    for i in range(<int32_t>tmin(max_length // bs, view_len)):
        if not kv_probe(kv, sg, kv_view(kv, r, g.ratio, i)):
            break
        kv_put_hit(kv, sg, n)
        n += 1
    hit = n * bs
    if fine:
        # Partial entries inside the first missing block, highest first.
        scale = <int32_t>(bs // align)
        first = n * scale
        max_partial = <int32_t>tmin(tmin(first + scale - 1, max_length // align), n_raw)
        for fi in range(max_partial - 1, first - 1, -1):
            if kv_probe(kv, sg, raw[fi]):
                kv_put_hit(kv, sg, n)
                n += 1
                hit = (fi + 1) * align
                break
    if drop and hit > 0:
        # EAGLE recomputes the tokens before the generation point: one hash
        # unit when fine-grained, else one block (drop_eagle_block).
        hit -= tmin(align, bs)
    hit -= hit % align
    n = <int32_t>tmin(n, cdiv(hit, bs))
    kv_set_hit_n(kv, sg, n)
    return hit


cdef tok_t _lookup_swa(KVCacheC* kv, ReqC* r, int32_t sg, tok_t max_length, tok_t align,
                      bint drop) noexcept nogil:
    # SlidingWindowManager.find_longest_cache_hit: a hit needs the blocks of the
    # last window - 1 tokens; scanning right to left for such a run.  With the
    # EAGLE drop the run needs one more block, dropped afterwards
    # (_contiguous_blocks_for_hit).
    cdef GroupC* g = &kv.groups[kv.spec_members[kv.spec_first[sg]]]
    cdef tok_t bs = g.spec.block_size
    cdef int32_t need = <int32_t>cdiv(g.spec.window - 1, bs) + <int32_t>drop
    cdef int32_t max_blocks = <int32_t>tmin(max_length // bs, _probe_hashes(kv, r) // g.ratio)
    cdef int32_t i, c = 0, n = 0
    cdef bint found = False
    kv_fill_null(kv, sg, 0, max_blocks)
    for i in range(max_blocks - 1, -1, -1):
        if kv_probe(kv, sg, kv_view(kv, r, g.ratio, i)):
            if c == 0 and bs != align and (((i if drop else i + 1)) * bs) % align != 0:
                continue
            kv_put_hit(kv, sg, i)
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
    if drop and n > 0:
        # Pop the EAGLE block, then re-align.
        n -= 1
        while bs != align and (n * bs) % align != 0:
            n -= 1
    kv_set_hit_n(kv, sg, n)
    return n * bs


cdef tok_t _lookup_chunked(KVCacheC* kv, ReqC* r, int32_t sg, tok_t max_length, tok_t align) noexcept nogil:
    # ChunkedLocalAttentionManager.find_longest_cache_hit: blocks before the
    # current chunk are computed and out of window (null); scan on from there.
    cdef GroupC* g = &kv.groups[kv.spec_members[kv.spec_first[sg]]]
    cdef tok_t bs = g.spec.block_size
    cdef int32_t max_blocks = <int32_t>tmin(max_length // bs, kv_n_hashes(kv, r) // g.ratio)
    cdef int32_t probed = <int32_t>tmin(max_blocks, _probe_hashes(kv, r) // g.ratio)
    cdef int32_t start = <int32_t>((max_length // g.spec.window) * g.spec.window // bs)
    cdef int32_t i, n
    if start > max_blocks:
        start = max_blocks
    kv_fill_null(kv, sg, 0, start)
    n = start
    for i in range(start, probed):
        if not kv_probe(kv, sg, kv_view(kv, r, g.ratio, i)):
            break
        kv_put_hit(kv, sg, i)
        n = i + 1
    kv_set_hit_n(kv, sg, n)
    return n * bs


cdef tok_t _lookup(KVCacheC* kv, ReqC* r, int32_t sg, tok_t max_length, tok_t align,
                  bint drop) noexcept nogil:
    # ``drop``: the EAGLE last-block drop (Mamba never applies it; chunked
    # local attention cannot be configured with it).
    cdef int32_t kind = kv.groups[kv.spec_members[kv.spec_first[sg]]].spec.kind
    if kind == GK_FULL:
        return _lookup_full(kv, r, sg, max_length, align, drop)
    if kind == GK_SWA:
        return _lookup_swa(kv, r, sg, max_length, align, drop)
    if kind == GK_CHUNKED:
        return _lookup_chunked(kv, r, sg, max_length, align)
    if kind == GK_MAMBA:
        return state_lookup(kv, r, sg, max_length, align)
    kv_set_hit_n(kv, sg, 0)
    return 0


cdef tok_t kv_get_computed_blocks(KVCacheC* kv, ReqC* r) noexcept nogil:
    """Longest prefix hit of ``r`` in tokens; per-group blocks go to ``hit``.

    Also sets ``r.shared_prefix_boundary`` (KVCacheManager.get_computed_blocks).
    """
    cdef tok_t max_len, hit, cur, new_len, probe, longest = 0
    cdef int32_t i, sg, kind
    cdef bint simple, drop
    cdef GroupC* g
    for i in range(kv.n_groups):
        kv.groups[i].hit_n = 0
    r.shared_prefix_boundary = 0
    if not kv.caching or kv.n_spec == 0:
        return 0
    if r.lazy_keys and r.key_blocks == 0:
        # No other request shares its first hash block, so no key of its chain is in the map
        # (its own blocks get theirs if it is preempted: kv_key_lazy): the lookup finds nothing.
        return 0
    # The last token is always recomputed for its logits.
    max_len = num_tokens(r) - 1
    hash_extend(kv, r, _probe_hashes(kv, r))
    if not kv.hybrid:
        return _lookup(kv, r, 0, max_len, kv.groups[0].spec.block_size, kv.eagle)
    # HybridKVCacheCoordinator.find_longest_cache_hit: the fixed point.
    for sg in range(kv.n_spec):
        kv.tmp_looked[sg] = False
        kv.tmp_verified[sg] = False
    simple = kv.n_spec == 2 and kv.groups[kv.spec_members[kv.spec_first[0]]].spec.kind == GK_FULL
    hit = max_len
    while True:
        cur = hit
        for sg in range(kv.n_spec):
            g = &kv.groups[kv.spec_members[kv.spec_first[sg]]]
            kind = g.spec.kind
            if kind == GK_FULL and kv.tmp_looked[sg]:
                # Full attention is downward closed: never re-probed.
                cur = tmin(cur, kv.tmp_hit_len[sg])
                continue
            # EAGLE: each spec-group drops at most once per candidate length; it
            # is probed one drop unit further (never for Mamba) so that the drop
            # lands back on the candidate (0.31/0.32; issue #32802).
            drop = kv.eagle and not kv.tmp_verified[sg]
            probe = cur
            if drop and kind != GK_MAMBA:
                if kv.fine and kind == GK_FULL and g.spec.block_size > kv.hash_block_size:
                    probe = tmin(cur + kv.hash_block_size, max_len)
                else:
                    probe = tmin(cur + g.spec.block_size, max_len)
            new_len = _lookup(kv, r, sg, probe, kv.align, drop)
            if drop:
                kv.tmp_verified[sg] = True
            elif new_len < cur:
                for i in range(kv.n_spec):
                    kv.tmp_verified[i] = False
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
