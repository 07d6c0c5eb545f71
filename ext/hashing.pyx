"""The block-hash chain of one request, extended as its tokens become known.

A request's hashes live in its row of ``KVCacheC.hashes`` (one per full hash
block of ``hash_block_size`` tokens); a cursor (segment, offset) remembers
where the last call stopped, so every token is hashed once over the life of
the request, prompt segments first and then its output stream.  The mixing
functions and the chain rule are in ``hashing.pxd``; vLLM's counterpart is
``Request.update_block_hashes`` with ``hash_block_tokens``
(vllm/v1/core/kv_cache_utils.py).
"""

from libc.string cimport memcpy, memset

import numpy as np

from aisim._core.kvcache cimport KVCacheC
from aisim._core.kvrows cimport kv_hashes
from aisim._core.request cimport ReqC
from aisim._core.memory cimport mem_calloc, mem_free
from aisim._core.types cimport hash_t, int32_t, int64_t, slot_t, tok_t
from aisim._core.util cimport __builtin_prefetch


cdef struct TokensC:
    # Where a chain reads its tokens: prompt segments (stream, first offset, length), then one
    # output stream (offset = output index) of ``n_out`` tokens.
    const hash_t* stream
    const tok_t* first
    const tok_t* length
    int32_t n_seg
    hash_t out_stream
    tok_t n_out


cdef inline tok_t _run_at(const TokensC* t, int32_t seg, hash_t* stream, tok_t* first) noexcept nogil:
    # The run of the cursor's segment ``seg`` (a prompt segment, or the output stream): its stream
    # and first offset; returns its length.
    if seg < t.n_seg:
        stream[0] = t.stream[seg]
        first[0] = t.first[seg]
        return t.length[seg]
    stream[0] = t.out_stream
    first[0] = 0
    return t.n_out


cdef inline hash_t _digest_tokens(const TokensC* t, tok_t need, int32_t* seg, tok_t* off) noexcept nogil:
    # The digest (run_digest, digest_then) of the next ``need`` tokens from the cursor (seg, off),
    # as runs, and move the cursor past them: prompt segments first, then the output stream.
    cdef tok_t take, avail, length, first
    cdef hash_t stream, run, digest = 0
    cdef bint started = False
    while need > 0:
        length = _run_at(t, seg[0], &stream, &first)
        avail = length - off[0]
        take = need if need < avail else avail
        run = run_digest(stream, first + off[0], length_mix(take))
        digest = digest_then(digest, run) if started else run
        started = True
        off[0] += take
        need -= take
        if off[0] == length and seg[0] < t.n_seg:
            seg[0] += 1
            off[0] = 0
    return digest


cdef inline hash_t _hash_block(const TokensC* t, hash_t h, tok_t size, hash_t mixed_size, int32_t* seg,
                               tok_t* off) noexcept nogil:
    # The chain's next full block of ``size`` tokens from the cursor (not yet finished);
    # ``mixed_size`` is length_mix(size), made once by the caller.
    cdef hash_t stream
    cdef tok_t first, length
    length = _run_at(t, seg[0], &stream, &first)
    if length - off[0] < size:
        return hash_combine_mixed(h, _digest_tokens(t, size, seg, off))
    # The common block: one run of its cursor's stream (the digest _digest_tokens gives it).
    h = hash_combine_mixed(h, run_digest(stream, first + off[0], mixed_size))
    off[0] += size
    if off[0] == length and seg[0] < t.n_seg:
        seg[0] += 1
        off[0] = 0
    return h


cdef inline void _advance(const TokensC* t, int32_t* seg, tok_t* off, tok_t tokens) noexcept nogil:
    # Move the cursor (seg, off) past ``tokens`` prompt tokens without hashing them (a segment
    # ended exactly is left for the next one, as the hashing loops leave it).
    cdef tok_t rest
    while tokens > 0:
        rest = t.length[seg[0]] - off[0]
        if rest > tokens:
            off[0] += tokens
            return
        tokens -= rest
        seg[0] += 1
        off[0] = 0


cdef inline TokensC _tokens_of(const KVCacheC* kv, const ReqC* r) noexcept nogil:
    cdef TokensC t
    t.stream = &kv.seg_stream[r.seg_off]
    t.first = &kv.seg_first[r.seg_off]
    t.length = &kv.seg_len[r.seg_off]
    t.n_seg = r.seg_cnt
    t.out_stream = r.out_stream
    t.n_out = r.num_output
    return t


cdef inline hash_t _fold_lookahead(const TokensC* t, tok_t lookahead, hash_t h, int32_t seg,
                                   tok_t off) noexcept nogil:
    # The next ``lookahead`` tokens from the cursor (seg, off), as runs, without moving the
    # request's cursor (a copy moves); a marker keeps these keys apart from plain ones.
    h = hash_combine(h, <hash_t>0x6c6f6f6b61686561)
    return hash_combine_mixed(h, _digest_tokens(t, lookahead, &seg, &off))


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
    cdef hash_t mixed_size = length_mix(size)
    cdef hash_t h
    cdef tok_t skip
    cdef TokensC t = _tokens_of(kv, r)
    if kv.pre_hashes != NULL and j < r.tag_n:
        # A deployment's router hashed the prompt already (hash_prompt, the same chain): copy its
        # full blocks and move the cursor past their tokens.
        skip = <tok_t>(min(n_hashes, r.tag_n) - j)
        memcpy(&hashes[j], &kv.pre_hashes[r.tag_off + j], skip * sizeof(hash_t))
        j += <int32_t>skip
        _advance(&t, &seg, &off, skip * size)
    if kv.node_hash != NULL and r.node_n > 0 and not lookahead:
        j = _extend_shared(kv, r, &t, hashes, j, n_hashes, &seg, &off)
    while j < n_hashes:
        h = _hash_block(&t, hashes[j - 1] if j > 0 else <hash_t>NONE_HASH_SEED, size, mixed_size, &seg, &off)
        if lookahead:
            h = _fold_lookahead(&t, kv.hash_lookahead, h, seg, off)
        hashes[j] = hash_finish(h)
        j += 1
    kv.num_hashed[s] = j
    kv.cur_seg[s] = seg
    kv.cur_off[s] = off


cdef inline void _skip(const TokensC* t, int32_t* seg, tok_t* off, tok_t tokens) noexcept nogil:
    # Move the cursor past ``tokens`` tokens as _digest_tokens does, without hashing them.
    cdef hash_t stream
    cdef tok_t first, length, take
    while tokens > 0:
        length = _run_at(t, seg[0], &stream, &first)
        take = tokens if tokens < length - off[0] else length - off[0]
        off[0] += take
        tokens -= take
        if off[0] == length and seg[0] < t.n_seg:
            seg[0] += 1
            off[0] = 0


cdef int32_t _extend_shared(KVCacheC* kv, ReqC* r, const TokensC* t, hash_t* hashes, int32_t j, int32_t n_hashes,
                            int32_t* seg, tok_t* off) noexcept nogil:
    # The hashes of the blocks ending in the runs ``r`` shares with other requests (its leading
    # ReqC.node_n runs): every request holding a run has the same tokens before it and, up to
    # its own length, in it, so a block ending there has the same hash for all of them; the
    # first one to hash it leaves it with the run's node (KVCacheC.node_hash) for the others.
    # Returns the next block to hash.
    cdef tok_t size = kv.hash_block_size
    cdef hash_t mixed_size = length_mix(size)
    cdef hash_t stream
    cdef tok_t first, run_start = 0, run_end = _run_at(t, 0, &stream, &first)
    cdef int32_t m = 0, node = kv.run_node[r.node_off], k, c
    cdef int64_t base = kv.node_hash_base[node], first_block = 0
    while j < n_hashes:
        if run_end <= (j + 1) * size - 1:
            while run_end <= (j + 1) * size - 1:
                m += 1
                if m >= r.node_n:
                    return j
                run_start = run_end
                run_end += _run_at(t, m, &stream, &first)
            node = kv.run_node[r.node_off + m]
            base = kv.node_hash_base[node]
            first_block = run_start // size  # the block holding the run's first token
        k = <int32_t>(j - first_block)
        if k < kv.node_hash_n[node]:
            # The run's hashes left by others, as many as end in the run at once: copied, and
            # the cursor moved past their tokens in one move.
            c = <int32_t>min(kv.node_hash_n[node] - k, run_end // size - j, n_hashes - j)
            memcpy(&hashes[j], &kv.node_hash[base + k], c * sizeof(hash_t))
            _skip(t, seg, off, c * size)
            j += c
            continue
        else:
            hashes[j] = hash_finish(_hash_block(t, hashes[j - 1] if j > 0 else <hash_t>NONE_HASH_SEED, size,
                                                mixed_size, seg, off))
            if k == kv.node_hash_n[node] and k < kv.node_hash_base[node + 1] - base:
                kv.node_hash[base + k] = hashes[j]
                kv.node_hash_n[node] += 1
        j += 1
    return j


cdef int64_t hash_prompt(const hash_t* stream, const tok_t* first, const tok_t* length, int32_t n_seg,
                         tok_t prompt_len, tok_t size, int32_t ratio, hash_t* out, int64_t start) noexcept nogil:
    """The chain (``hash_extend``'s, before ``group_key``) of a prompt given as its segments, at
    every ``ratio``-th full hash block of ``size`` tokens: written to ``out`` from entry ``start``
    on (those before it are there already, all inside the first segment); returns the entries."""
    cdef TokensC t
    cdef int64_t j, n = start, n_raw = prompt_len // size
    cdef int32_t seg = 0
    cdef tok_t off = 0
    cdef hash_t h = out[start - 1] if start > 0 else <hash_t>NONE_HASH_SEED
    cdef hash_t mixed_size = length_mix(size)
    t.stream = stream
    t.first = first
    t.length = length
    t.n_seg = n_seg
    t.out_stream = 0
    t.n_out = 0
    _advance(&t, &seg, &off, start * ratio * size)
    for j in range(start * ratio, n_raw):
        h = hash_finish(_hash_block(&t, h, size, mixed_size, &seg, &off))
        if (j + 1) % ratio == 0:
            out[n] = h
            n += 1
    return n


cdef struct TraceColsC:
    # A whole trace's request and segment columns (CoreTrace) as the hashing passes read them.
    Py_ssize_t n                 # requests
    Py_ssize_t n_runs            # prompt segments
    const tok_t* max_tokens
    const int32_t* seg_off
    const int32_t* seg_cnt
    const hash_t* out_stream
    const hash_t* seg_stream     # NULL when no request has a segment
    const tok_t* seg_first
    const tok_t* seg_len


cdef list _trace_cols(trace, TraceColsC* c):
    """Point ``c`` at ``trace``'s columns (contiguous, in the core's types); returns the arrays,
    which the caller holds while it reads ``c``."""
    held = [np.ascontiguousarray(trace.max_tokens, dtype=np.int64),
            np.ascontiguousarray(trace.seg_off, dtype=np.int32),
            np.ascontiguousarray(trace.seg_cnt, dtype=np.int32),
            np.ascontiguousarray(trace.out_stream, dtype=np.uint64),
            np.ascontiguousarray(trace.seg_stream, dtype=np.uint64),
            np.ascontiguousarray(trace.seg_first, dtype=np.int64),
            np.ascontiguousarray(trace.seg_len, dtype=np.int64)]
    cdef const tok_t[::1] m_tok = held[0]
    cdef const int32_t[::1] s_off = held[1]
    cdef const int32_t[::1] s_cnt = held[2]
    cdef const hash_t[::1] o_str = held[3]
    cdef const hash_t[::1] g_str = held[4]
    cdef const tok_t[::1] g_first = held[5]
    cdef const tok_t[::1] g_len = held[6]
    c.n = m_tok.shape[0]
    c.n_runs = g_str.shape[0]
    c.max_tokens = &m_tok[0] if c.n else NULL
    c.seg_off = &s_off[0] if c.n else NULL
    c.seg_cnt = &s_cnt[0] if c.n else NULL
    c.out_stream = &o_str[0] if c.n else NULL
    c.seg_stream = &g_str[0] if c.n_runs else NULL
    c.seg_first = &g_first[0] if c.n_runs else NULL
    c.seg_len = &g_len[0] if c.n_runs else NULL
    return held


cdef inline TokensC _request_tokens(const TraceColsC* c, Py_ssize_t i) noexcept nogil:
    # Request i's tokens: its prompt segments, then its output stream.
    cdef TokensC t
    cdef int32_t off = c.seg_off[i]
    t.n_seg = c.seg_cnt[i]
    t.stream = c.seg_stream + off if t.n_seg else NULL
    t.first = c.seg_first + off if t.n_seg else NULL
    t.length = c.seg_len + off if t.n_seg else NULL
    t.out_stream = c.out_stream[i]
    t.n_out = c.max_tokens[i]
    return t


def first_block_keys(trace, tok_t size):
    """The chain hash (before ``group_key``) of every request's first block of ``size`` tokens,
    prompt then output stream (``trace`` a CoreTrace of a whole trace); 0 where the request's
    prompt and output together are shorter than one block, so that no block of it is ever full.

    Two requests share a block key only if they share their first block's (the chain), so a
    request whose first block's hash no other request has shares no block with any.
    """
    cdef const tok_t[::1] p_len = np.ascontiguousarray(trace.prompt_len, dtype=np.int64)
    cdef TraceColsC c
    cdef list held = _trace_cols(trace, &c)
    cdef Py_ssize_t i, n = c.n
    out = np.zeros(n, dtype=np.uint64)
    cdef hash_t[::1] keys = out
    cdef hash_t mixed_size = length_mix(size)
    cdef TokensC t
    cdef int32_t seg
    cdef tok_t off
    with nogil:
        for i in range(n):
            if p_len[i] + c.max_tokens[i] < size:
                continue
            t = _request_tokens(&c, i)
            seg = 0
            off = 0
            keys[i] = hash_finish(_hash_block(&t, <hash_t>NONE_HASH_SEED, size, mixed_size, &seg, &off))
    return out


# ---------------------------------------------------------------- shared prefixes of a whole trace

cdef struct ShareEntC:
    # One key of shared_prefix_tokens' table: a run's start (the tokens before it, its stream and
    # first offset).  Run lengths fit 32 bits (a request is at most max_model_len).
    hash_t key                 # 0 = empty slot
    int32_t count              # requests holding the key
    int32_t top_n              # of those, how many have the longest run
    int32_t top                # the longest run's length
    int32_t second             # the longest length shorter than top (0: none)
    int32_t node               # held by several requests: 1 + its node id (0: not numbered yet)


cdef struct ShareC:
    # shared_prefix_tokens' passes: the table, and every request's runs as their start keys and
    # lengths, request by request (request i's from ``first[i]``; ``first`` is padded past the
    # last request with the end, so a look-ahead past it needs no bound check).
    ShareEntC* starts
    hash_t mask
    hash_t* key
    int32_t* length
    int64_t* first
    int64_t n                  # runs written


# How many runs ahead shared_prefix_tokens fetches the table slot of (its table outgrows the caches).
cdef enum:
    SHARE_AHEAD = 8


cdef inline ShareEntC* _share_slot(ShareEntC* table, hash_t mask, hash_t key) noexcept nogil:
    # The slot of ``key`` (open addressing, linear probing; the caller sized the table).
    cdef hash_t s = key & mask
    while table[s].key != 0 and table[s].key != key:
        s = (s + 1) & mask
    return &table[s]


cdef inline int32_t _share_run(const TokensC* t, int32_t m, hash_t* stream, tok_t* first) noexcept nogil:
    # Run m of a request's tokens: its prompt segments, then its output stream (m == n_seg).
    return <int32_t>_run_at(t, m, stream, first)


cdef inline hash_t _start_key(hash_t before, hash_t stream, tok_t first) noexcept nogil:
    return hash_finish(hash_combine(hash_combine(before, stream), <hash_t>first + <hash_t>RUN_FIRST))


cdef inline hash_t _whole_key(hash_t start, tok_t length) noexcept nogil:
    return hash_finish(hash_combine(start, <hash_t>length + <hash_t>RUN_LENGTH))


def shared_prefix_tokens(trace, bint nodes=False):
    """How many leading tokens of every request (prompt, then its whole output stream) some other
    request of ``trace`` (a CoreTrace of a whole trace) has as its own leading tokens, run for run.

    Two requests share a block key only if they share every token of the block and of every block
    before it, in the same runs (hashing.pxd): a request's block ``i`` of ``B`` tokens can be
    another request's only if ``(i + 1) * B`` is at most this count, so no other request can ever
    look up the keys of its later blocks.  Whole segments are compared at once: two requests
    that agree on every run before one and start it alike share ``min`` of their lengths of it,
    and go on only if those lengths are equal.

    With ``nodes``: also the node of every run of every request (its prompt segments, then its
    output stream: request ``i``'s runs from ``seg_off[i] + i`` on, a whole trace's segments in
    request order), a dense id for the start of a run that several requests hold (the tokens
    before it, its stream and first offset), -1 for one only that request holds; and the longest
    run of each node.  Returns (shared tokens, nodes, longest runs).
    """
    cdef TraceColsC c
    cdef list held = _trace_cols(trace, &c)
    cdef Py_ssize_t i, n = c.n
    out = np.zeros(n, dtype=np.int64)
    cdef tok_t[::1] shared = out
    cdef int64_t runs = c.n_runs + n, counted = 0
    cdef hash_t cap = 16
    while 2 * cap < <hash_t>(3 * runs):  # at most two thirds full
        cap <<= 1
    for i in range(n):
        counted += c.seg_cnt[i] + 1
    node_arr = np.full(runs if nodes else 1, -1, dtype=np.int32)
    top_arr = np.zeros(runs if nodes else 1, dtype=np.int32)
    cdef int32_t[::1] node_of = node_arr
    cdef int32_t[::1] node_top = top_arr
    cdef int32_t n_nodes = 0
    cdef ShareC sh
    memset(&sh, 0, sizeof(ShareC))
    sh.mask = cap - 1
    try:
        sh.starts = <ShareEntC*>mem_calloc(cap, sizeof(ShareEntC))
        sh.key = <hash_t*>mem_calloc(counted, sizeof(hash_t))
        sh.length = <int32_t*>mem_calloc(counted, sizeof(int32_t))
        sh.first = <int64_t*>mem_calloc(n + SHARE_AHEAD + 1, sizeof(int64_t))
        with nogil:
            for i in range(n):
                _share_keys(&sh, i, _request_tokens(&c, i))
            for i in range(n, n + SHARE_AHEAD + 1):
                sh.first[i] = sh.n
            _share_count(&sh)
            for i in range(n):
                shared[i] = _share_of(&sh, i, &node_of[c.seg_off[i] + i] if nodes else NULL, &node_top[0],
                                      &n_nodes)
    finally:
        mem_free(sh.starts)
        mem_free(sh.key)
        mem_free(sh.length)
        mem_free(sh.first)
    return (out, node_arr, top_arr[:n_nodes]) if nodes else out


cdef void _share_keys(ShareC* sh, Py_ssize_t i, TokensC t) noexcept nogil:
    # Request i's runs as start keys and lengths, after those of the requests before it.  A run's
    # key chains the whole runs before it, so a request's keys need no table.
    cdef int32_t m
    cdef hash_t before = <hash_t>NONE_HASH_SEED, stream, start
    cdef tok_t first, length
    sh.first[i] = sh.n
    for m in range(t.n_seg + 1):
        length = _share_run(&t, m, &stream, &first)
        if length <= 0 and m == t.n_seg:
            break  # no output (an empty prompt segment is a run of its own: it splits a block's runs)
        start = _start_key(before, stream, first)
        sh.key[sh.n] = start
        sh.length[sh.n] = <int32_t>length
        sh.n += 1
        before = _whole_key(start, length)


cdef void _share_count(ShareC* sh) noexcept nogil:
    # Count every run in the table, its lengths' longest, how many have it and the second longest.
    # The slot of the run SHARE_AHEAD on is fetched first (a fetch written in a helper function
    # of its own is compiled away: the helper has no effect).
    cdef int64_t x
    cdef tok_t length
    cdef ShareEntC* e
    for x in range(sh.n):
        if x + SHARE_AHEAD < sh.n:
            __builtin_prefetch(&sh.starts[sh.key[x + SHARE_AHEAD] & sh.mask])
        length = sh.length[x]
        e = _share_slot(sh.starts, sh.mask, sh.key[x])
        e.key = sh.key[x]
        e.count += 1
        if length > e.top:
            e.second = e.top
            e.top = <int32_t>length
            e.top_n = 1
        elif length == e.top:
            e.top_n += 1
        elif length > e.second:
            e.second = <int32_t>length


cdef tok_t _share_of(ShareC* sh, Py_ssize_t i, int32_t* node_of, int32_t* node_top,
                     int32_t* n_nodes) noexcept nogil:
    # The leading tokens of request i that another request has too; with ``node_of``, the node
    # of each of its runs that several requests hold (numbered as first met).  Another request
    # that starts a run alike has as much of it as the longest other length: the second longest
    # when this run is the only longest one, else the longest.  It goes on past the run only with
    # this run's length, and then holds the next run's start too (the start chains the run): a
    # run whose start no other request holds ends the count.  The slots of the first run of the
    # request SHARE_AHEAD on and of this request's run SHARE_AHEAD on are fetched first (many
    # requests stop at their first runs, others go on through all of them).
    cdef int64_t x, lo = sh.first[i], hi = sh.first[i + 1], ahead = sh.first[i + SHARE_AHEAD]
    cdef tok_t length, done = 0
    cdef ShareEntC* e
    if ahead < sh.n:
        __builtin_prefetch(&sh.starts[sh.key[ahead] & sh.mask])
    for x in range(lo, hi):
        if x + SHARE_AHEAD < hi:
            __builtin_prefetch(&sh.starts[sh.key[x + SHARE_AHEAD] & sh.mask])
        length = sh.length[x]
        e = _share_slot(sh.starts, sh.mask, sh.key[x])
        if e.count < 2:
            return done
        if node_of != NULL:
            if e.node == 0:  # first met: number it (and say how long its longest run is)
                node_top[n_nodes[0]] = e.top
                n_nodes[0] += 1
                e.node = n_nodes[0]
            node_of[x - lo] = e.node - 1
        if length == e.top and e.top_n == 1:
            return done + e.second
        done += length
    return done
