# Included into kvcache.pyx: where a running request's one-token decode can touch the KV cache,
# for the engine's macro-steps (engine_macro.pxi).  Next to the allocation and caching rules it
# summarises, compiled into kvcache so it reads the same inline helpers.

cdef tok_t kv_decode_period(const KVCacheC* kv, flag_t* works, tok_t cap) noexcept nogil:
    """Where a running request's one-token decode can touch the KV cache (the engine's macro-steps).

    Returns a period ``P`` (at most ``cap``) and sets ``works[x]`` for the residues ``x`` of
    ``num_computed_tokens`` modulo ``P`` at which ``kv_allocate_slots(r, 1)`` may do anything;
    at every other residue it is a no-op (given no pending copy-on-write and no lookahead slots,
    with nothing in flight (synchronous engine) or one token (asynchronous: its placeholder);
    the async update's own caching call then repeats the schedule's).  The rules, per group kind:

    * a block is appended when the new token starts one (``num_computed % block_size == 0``:
      ``allocate_new_blocks`` pops one; ``get_num_blocks_to_allocate`` asks for it);
    * a block is cached when the new token fills it (``(num_computed + 1) % block_size == 0``;
      asynchronous, one step later: ``num_computed % block_size == 0``; several groups cache at
      scheduler-block-aligned lengths: ``(num_computed + 1) % P == 0``,
      HybridKVCacheCoordinator._align_cacheable);
    * a sliding window frees a block when its first needed token crosses a block
      (``num_computed - window + 1`` a multiple of the block size, asynchronous one later:
      remove_skipped_blocks of the tokens processed);
    * a ring buffer's one block is held from admission on.

    A full-attention group with blocks wider than the hash block also keys the prompt's partial
    tail block (_cache_partial_tail_block): that key is re-added only when its block fills and on
    the step after, both residues above; every other call finds it there and does nothing.

    * a chunked-local group frees its blocks of the last chunk when the tokens processed enter a
      new chunk (``num_computed % chunk`` 0, asynchronous 1), so the period takes in its chunk.
    * a state group (Mamba, any mode; vllm/v1/core/single_type_kv_cache_manager.py, MambaManager)
      holds one running state block: a decode appends the next one as the new token starts a
      block (``num_computed % block_size == 0``; align mode: allocate_new_blocks, one block a
      step, no checkpoint for a one-token decode),
      then retires the blocks below and frees the state it kept one step as the next initial
      state once the tokens processed cross into the new block (``num_computed % block_size``
      1, asynchronous 2: remove_skipped_blocks with get_num_skipped_tokens = processed - 1).
      Its blocks are cached as they fill (the rule above; the partial tail state is a prompt's).

    0 (no quiet residues known) for the speculative-decoding rules (those decodes are always
    stepped one at a time), or a period longer than ``cap``.
    """
    cdef tok_t S = kv.sched_block_size, P = kv.sched_block_size, x, bs, w
    cdef int32_t gi
    cdef const GroupSpecC* g
    if P <= 0 or kv.eagle or kv.hash_lookahead > 0:
        return 0
    for gi in range(kv.n_groups):
        g = &kv.groups[gi].spec
        if g.kind == GK_CHUNKED:
            P = P // _gcd(P, g.window) * g.window
            if P > cap:
                return 0
    if P > cap:
        return 0
    for x in range(P):
        works[x] = 0
    for gi in range(kv.n_groups):
        g = &kv.groups[gi].spec
        bs = g.block_size
        w = g.window
        if g.kind == GK_RING:
            continue
        if g.kind != GK_FULL and g.kind != GK_SWA and g.kind != GK_CHUNKED and g.kind != GK_MAMBA:
            return 0
        if S % bs != 0 or g.num_spec != 0:
            return 0
        for x in range(P):
            if x % bs == 0 or (x + 1) % bs == 0 or (x + 1) % S == 0:
                works[x] = 1
            if g.kind == GK_SWA and (x % bs == (w - 1) % bs or x % bs == w % bs):
                works[x] = 1
            if g.kind == GK_CHUNKED and (x % w == 0 or x % w == 1):
                works[x] = 1
            if g.kind == GK_MAMBA and (x % bs == 1 or x % bs == 2):
                works[x] = 1
    return P


cdef inline tok_t _gcd(tok_t a, tok_t b) noexcept nogil:
    cdef tok_t t
    while b != 0:
        t = a % b
        a = b
        b = t
    return a


cdef bint kv_decode_settled(const KVCacheC* kv, const ReqC* r) noexcept nogil:
    """``r``'s next one-token decode follows kv_decode_period's residues: no group still has a
    partial prefix hit to copy (the first allocation after the hit makes the copy), and every
    sliding window, local chunk or state group has released the blocks it left by the tokens
    processed (``num_computed_tokens`` less those in flight; the first decode after a prefill
    releases all of them at once: remove_skipped_blocks); a state group in align mode has also
    dropped the state it kept as a chunk's initial state and the prefill's checkpoint (the
    first decode's get_num_blocks_to_allocate clears it)."""
    cdef int32_t gi, sb, last
    cdef tok_t processed = r.num_computed - r.num_in_flight
    cdef const GroupC* g
    cdef const block_id_t* table
    for gi in range(kv.n_groups):
        g = &kv.groups[gi]
        if g.partial_idx[r.slot] >= 0:
            return False
        if g.spec.kind == GK_SWA or g.spec.kind == GK_CHUNKED or g.spec.kind == GK_MAMBA:
            table = kv_table(kv, gi, r.slot)
            sb = <int32_t>tmin(_skipped_tokens(g, processed) // g.spec.block_size, g.table_len[r.slot])
            if g.spec.kind == GK_MAMBA and g.spec.align_mode:
                # _remove_skipped retires up to sb (skipping nulls), then frees the kept state.
                last = g.last_state[r.slot]
                if (g.ckpt_pos[r.slot] > 0 or not g.allocated[r.slot] or (sb > 0 and g.retired[r.slot] < sb)
                        or (last >= 0 and last < cdiv(processed, g.spec.block_size) - 1 and table[last] != 0)):
                    return False
            elif sb > 0 and table[sb - 1] != 0:
                return False
    return True
