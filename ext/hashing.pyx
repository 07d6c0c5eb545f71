"""The block-hash chain of one request, extended as its tokens become known.

A request's hashes live in its row of ``KVCacheC.hashes`` (one per full hash
block of ``hash_block_size`` tokens); a cursor (segment, offset) remembers
where the last call stopped, so every token is hashed once over the life of
the request, prompt segments first and then its output stream.  The mixing
functions and the chain rule are in ``hashing.pxd``; vLLM's counterpart is
``Request.update_block_hashes`` with ``hash_block_tokens``
(vllm/v1/core/kv_cache_utils.py).
"""

from libc.string cimport memcpy

from aisim._core.kvcache cimport KVCacheC
from aisim._core.kvrows cimport kv_hashes
from aisim._core.request cimport ReqC
from aisim._core.types cimport hash_t, int32_t, slot_t, tok_t


cdef inline hash_t _hash_tokens(const KVCacheC* kv, const ReqC* r, hash_t h, tok_t need,
                                int32_t* seg, tok_t* off) noexcept nogil:
    # Mix the next ``need`` tokens from the cursor (seg, off) into ``h`` as runs and move the cursor
    # past them: prompt segments first, then the output stream (one stream per request, offset =
    # output index).
    cdef tok_t take, avail, length, first
    cdef hash_t stream
    while need > 0:
        if seg[0] < r.seg_cnt:
            stream = kv.seg_stream[r.seg_off + seg[0]]
            first = kv.seg_first[r.seg_off + seg[0]]
            length = kv.seg_len[r.seg_off + seg[0]]
        else:
            stream = r.out_stream
            first = 0
            length = r.num_output
        avail = length - off[0]
        take = need if need < avail else avail
        h = hash_run(h, stream, first + off[0], take)
        off[0] += take
        need -= take
        if off[0] == length and seg[0] < r.seg_cnt:
            seg[0] += 1
            off[0] = 0
    return h


cdef inline hash_t _fold_lookahead(const KVCacheC* kv, const ReqC* r, hash_t h, int32_t seg,
                                   tok_t off) noexcept nogil:
    # The next kv.hash_lookahead tokens from the cursor (seg, off), as runs, without moving the
    # request's cursor (a copy moves); a marker keeps these keys apart from plain ones.
    h = hash_combine(h, <hash_t>0x6c6f6f6b61686561)
    return _hash_tokens(kv, r, h, kv.hash_lookahead, &seg, &off)


cdef void hash_extend(KVCacheC* kv, ReqC* r, int32_t n_hashes) noexcept nogil:
    """Compute the hashes of ``r`` up to hash block ``n_hashes`` (exclusive).

    Only full hash blocks are hashed (``Request.update_block_hashes``); the
    caller keeps ``n_hashes <= kv_n_hashes``.  With ``kv.hash_lookahead`` = L
    > 0 a block's hash also covers the L tokens after it (vLLM 0.33's EAGLE
    lookahead hashes, ``get_request_block_hasher`` with
    ``num_hash_lookahead_tokens``): they are folded in after the block's own
    tokens, so two requests share the key only if they share those tokens too.
    """
    if kv.num_hashed[r.slot] >= n_hashes:
        return  # the common case: nothing new to hash
    # Two specialisations of one inline loop: the plain one stays as lean as without lookahead.
    if kv.hash_lookahead > 0:
        _extend(kv, r, n_hashes, True)
    else:
        _extend(kv, r, n_hashes, False)


cdef inline void _extend(KVCacheC* kv, ReqC* r, int32_t n_hashes, bint lookahead) noexcept nogil:
    cdef slot_t s = r.slot
    cdef hash_t* hashes = kv_hashes(kv, s)
    cdef int32_t j = kv.num_hashed[s]
    cdef int32_t seg = kv.cur_seg[s]
    cdef tok_t off = kv.cur_off[s]
    cdef tok_t size = kv.hash_block_size
    cdef hash_t mixed_size = mix64(<hash_t>size)
    cdef hash_t h, stream
    cdef tok_t first, length, skip
    if kv.pre_hashes != NULL and j < r.tag_n:
        # A deployment's router hashed the prompt already (the same chain): copy its full blocks
        # and move the cursor past their tokens.
        skip = <tok_t>(min(n_hashes, r.tag_n) - j)
        memcpy(&hashes[j], &kv.pre_hashes[r.tag_off + j], skip * sizeof(hash_t))
        j += <int32_t>skip
        skip *= size
        while skip > 0:
            length = kv.seg_len[r.seg_off + seg]
            if length - off > skip:
                off += skip
                break
            skip -= length - off
            seg += 1
            off = 0
    while j < n_hashes:
        h = hashes[j - 1] if j > 0 else <hash_t>NONE_HASH_SEED
        if seg < r.seg_cnt:
            stream = kv.seg_stream[r.seg_off + seg]
            first = kv.seg_first[r.seg_off + seg]
            length = kv.seg_len[r.seg_off + seg]
        else:
            stream = r.out_stream
            first = 0
            length = r.num_output
        if length - off >= size:
            # The common block: one run of its cursor's stream, the key _hash_tokens gives it
            # (hash_run), with the block size's mix made once per call.
            h = hash_combine_mixed(hash_combine(hash_combine(h, stream), <hash_t>(first + off)), mixed_size)
            off += size
            if off == length and seg < r.seg_cnt:
                seg += 1
                off = 0
        else:
            h = _hash_tokens(kv, r, h, size, &seg, &off)
        if lookahead:
            h = _fold_lookahead(kv, r, h, seg, off)
        hashes[j] = hash_finish(h)
        j += 1
    kv.num_hashed[s] = j
    kv.cur_seg[s] = seg
    kv.cur_off[s] = off
