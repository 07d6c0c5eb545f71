# Included by deploy.pyx: building a deployment's trace view and routers, and the disaggregated
# pools' transfer arithmetic.

cdef list _borrow_trace(TraceC* t, trace):
    """Point ``t`` at ``trace``'s arrays (contiguous copies where needed); the arrays to keep alive."""
    cdef int64_t n = len(trace.prompt_len)
    cdef const tok_t[::1] p_len = _c(trace.prompt_len, np.int64)
    cdef const tok_t[::1] m_tok = _c(trace.max_tokens, np.int64)
    cdef const int32_t[::1] prio = _c(trace.priority, np.int32)
    cdef const sec_t[::1] a_key = _c(trace.arrival_key, np.float64)
    cdef const int32_t[::1] rank = _c(trace.id_rank, np.int32)
    cdef const int32_t[::1] s_off = _c(trace.seg_off, np.int32)
    cdef const int32_t[::1] s_cnt = _c(trace.seg_cnt, np.int32)
    cdef const hash_t[::1] o_str = _c(trace.out_stream, np.uint64)
    cdef const hash_t[::1] g_str = _c(trace.seg_stream, np.uint64)
    cdef const tok_t[::1] g_first = _c(trace.seg_first, np.int64)
    cdef const tok_t[::1] g_len = _c(trace.seg_len, np.int64)
    cdef const sec_t[::1] a_time = _c(trace.arrival_time, np.float64)
    cdef const int32_t[::1] acc_o
    cdef const int32_t[::1] acc_c
    cdef const int64_t[::1] acc_v
    keep = [p_len, m_tok, prio, a_key, rank, s_off, s_cnt, o_str, g_str, g_first, g_len, a_time]
    t.n = n
    if n:
        t.prompt_len = &p_len[0]
        t.max_tokens = &m_tok[0]
        t.priority = &prio[0]
        t.arrival_key = &a_key[0]
        t.id_rank = &rank[0]
        t.seg_off = &s_off[0]
        t.seg_cnt = &s_cnt[0]
        t.out_stream = &o_str[0]
        t.arrival_time = &a_time[0]
    if g_str.shape[0]:
        t.seg_stream = &g_str[0]
        t.seg_first = &g_first[0]
        t.seg_len = &g_len[0]
    if n and trace.accept_values is not None and len(trace.accept_values) > 0:
        acc_o = _c(trace.accept_off, np.int32)
        acc_c = _c(trace.accept_cnt, np.int32)
        acc_v = _c(trace.accept_values, np.int64)
        keep += [acc_o, acc_c, acc_v]
        t.acc_off = &acc_o[0]
        t.acc_cnt = &acc_c[0]
        t.acc_values = &acc_v[0]
    cdef const int32_t[::1] nt
    cdef const sec_t[::1] th
    cdef const flag_t[::1] fol
    if n and trace.next_turn is not None:
        nt_np = np.ascontiguousarray(trace.next_turn, dtype=np.int32)
        fol_np = np.zeros(n, dtype=np.int8)
        fol_np[nt_np[nt_np >= 0]] = 1
        nt, th, fol = nt_np, _c(trace.think_s, np.float64), fol_np
        keep += [nt, th, fol]
        t.next_turn = &nt[0]
        t.think_s = &th[0]
        t.follows = &fol[0]
    cdef const sec_t[::1] front
    if n and getattr(trace, "frontend_s", None) is not None:
        front = _c(trace.frontend_s, np.float64)
        keep.append(front)
        t.frontend_s = &front[0]
    cdef const flag_t[::1] priv
    if n and getattr(trace, "private", None) is not None:
        priv = _c(trace.private, np.int8)
        keep.append(priv)
        t.private_req = &priv[0]
    return keep


cdef int _router_init(RouterC* rt, dict router, int32_t n_rep, tok_t hash_block, const TraceC* tr, list keep,
                      bint need_keys) except -1:
    """Set up router ``rt`` over ``n_rep`` replicas; ``need_keys`` keeps every request's prompt
    keys even when the router itself does not read the caches."""
    cdef int64_t n = tr.n, i, total = 0
    cdef const int64_t[::1] sess = _c(router["session"], np.int64)
    keep.append(sess)
    if n:
        rt.session = <int64_t*>&sess[0]
    rt.kind = router["kind"]
    rt.n_rep = n_rep
    rt.by_tokens = router["by_tokens"]
    rt.weight = router["weight"]
    rt.fallback = router["fallback"]
    rt.slack = router["slack"]
    rt.delay = router["view_delay_s"]
    rt.rng = <hash_t>router["seed"]
    rt.kv = rt.kind == RT_KV_AWARE or (rt.kind == RT_SESSION and rt.fallback == RT_KV_AWARE)
    rt.block = router["block"]
    rt.hash_block = hash_block
    rt.group = router["group"]
    rt.out_reqs = <int64_t*>mem_calloc(n_rep, sizeof(int64_t))
    rt.out_toks = <int64_t*>mem_calloc(n_rep, sizeof(int64_t))
    rt.pf_toks = <int64_t*>mem_calloc(n_rep, sizeof(int64_t))
    rt.act_n = <int64_t*>mem_calloc(n_rep, sizeof(int64_t))
    rt.overlap = <int64_t*>mem_calloc(n_rep, sizeof(int64_t))
    rt.cost = <double*>mem_calloc(n_rep, sizeof(double))
    rt.cover = <int64_t*>mem_calloc(n_rep, sizeof(int64_t))
    rt.key_off = <int64_t*>mem_calloc(n + 1, sizeof(int64_t))
    rt.booked_pf = <int64_t*>mem_calloc(n if n else 1, sizeof(int64_t))
    rt.pf_open = <flag_t*>mem_calloc(n if n else 1, sizeof(flag_t))
    rt.sticky = <int32_t*>mem_calloc(max(router["n_sessions"], 1), sizeof(int32_t))
    for i in range(max(router["n_sessions"], 1)):
        rt.sticky[i] = -1
    rt.idx.n_rep = n_rep
    rt.idx.row_free = -1
    need_keys = need_keys or rt.kv
    cdef int32_t ratio = <int32_t>(rt.block // rt.hash_block) if need_keys else 1
    with nogil:
        if need_keys:
            for i in range(n):
                rt.key_off[i] = total
                total += tr.prompt_len[i] // rt.hash_block // ratio
            rt.key_off[n] = total
            rt.keys = <hash_t*>mem_calloc(total if total else 1, sizeof(hash_t))
            _all_prompt_keys(rt, tr, ratio)
        else:
            rt.keys = <hash_t*>mem_calloc(1, sizeof(hash_t))
    rt.quoted = <flag_t*>mem_calloc(n if n else 1, sizeof(flag_t))
    if rt.kv:
        rt.kid = <int32_t*>mem_calloc(total if total else 1, sizeof(int32_t))
        with nogil:
            _index_nodes(rt, n)
            if _quoted(rt.quoted, tr):
                _index_lookups(rt, n)
    return 0


cdef int _all_prompt_keys(RouterC* rt, const TraceC* tr, int32_t ratio) except -1 nogil:
    """Every request's chain hashes at its full prompt blocks.  A request whose first segment
    starts where an earlier one's does (a shared system prompt) takes the blocks both hold
    inside it from that request instead of hashing them again."""
    cdef int64_t i, j, m, nb, B = rt.hash_block * ratio
    cdef hash_t mask, s, key
    cdef hash_t* first = _table(tr.n, &mask)      # (stream, offset) of a first segment
    cdef int64_t* who = <int64_t*>mem_calloc(mask + 1, sizeof(int64_t))
    cdef int64_t* covers = <int64_t*>mem_calloc(mask + 1, sizeof(int64_t))
    for i in range(tr.n):
        m = 0
        if tr.seg_cnt[i] > 0:
            nb = min(tr.seg_len[tr.seg_off[i]] // B, rt.key_off[i + 1] - rt.key_off[i])
            key = hash_combine(hash_combine(<hash_t>NONE_HASH_SEED, tr.seg_stream[tr.seg_off[i]]),
                               <hash_t>tr.seg_first[tr.seg_off[i]]) | 1
            s = _slot(first, mask, key)
            j = who[s]
            if (first[s] == key and tr.seg_stream[tr.seg_off[j]] == tr.seg_stream[tr.seg_off[i]]
                    and tr.seg_first[tr.seg_off[j]] == tr.seg_first[tr.seg_off[i]]):
                m = min(nb, covers[s])
                memcpy(rt.keys + rt.key_off[i], rt.keys + rt.key_off[j], m * sizeof(hash_t))
                if nb > covers[s]:
                    who[s] = i
                    covers[s] = nb
            elif nb > 0:
                first[s] = key
                who[s] = i
                covers[s] = nb
        hash_prompt(&tr.seg_stream[tr.seg_off[i]], &tr.seg_first[tr.seg_off[i]], &tr.seg_len[tr.seg_off[i]],
                    tr.seg_cnt[i], tr.prompt_len[i], rt.hash_block, ratio, rt.keys + rt.key_off[i], m)
    mem_free(first)
    mem_free(who)
    mem_free(covers)
    return 0


cdef bint _quoted(flag_t* quoted, const TraceC* tr) except -1 nogil:
    """Mark the requests whose output tokens a prompt of the trace quotes (a session's next turn
    repeats the previous one's answer): their output blocks' keys may be prompt blocks."""
    cdef int64_t i, k, n_seg = 0
    cdef hash_t mask, s, v
    cdef hash_t* seen
    cdef bint zero = False, any_ = False
    if tr.n == 0 or tr.seg_stream == NULL:
        return False
    for i in range(tr.n):
        n_seg = max(n_seg, <int64_t>tr.seg_off[i] + tr.seg_cnt[i])
    seen = _table(n_seg, &mask)  # the prompts' streams (0, never a table key, by a flag)
    for k in range(n_seg):
        v = tr.seg_stream[k]
        if v == 0:
            zero = True
        else:
            s = _slot(seen, mask, v)
            seen[s] = v
    for i in range(tr.n):
        v = tr.out_stream[i]
        if (zero if v == 0 else seen[_slot(seen, mask, v)] == v):
            quoted[i] = 1
            any_ = True
    mem_free(seen)
    return any_


cdef void _router_release(RouterC* rt) noexcept nogil:
    mem_free(rt.out_reqs)
    mem_free(rt.out_toks)
    mem_free(rt.pf_toks)
    mem_free(rt.act_n)
    mem_free(rt.overlap)
    mem_free(rt.cost)
    mem_free(rt.key_off)
    mem_free(rt.keys)
    mem_free(rt.kid)
    mem_free(rt.path_off)
    mem_free(rt.path)
    mem_free(rt.quoted)
    mem_free(rt.cover)
    mem_free(rt.booked_pf)
    mem_free(rt.pf_open)
    mem_free(rt.sticky)
    mem_free(rt.q.a)
    index_release(&rt.idx)
    memset(rt, 0, sizeof(RouterC))


# ------------------------------------------------------------------ disaggregated pools

cdef sec_t _landing(Engine e) noexcept:
    """The earliest transfer landing among a decode replica's waiting and not yet added requests."""
    cdef sec_t t = sched_next_landing(&e.sched)
    cdef int64_t k
    cdef const ReqC* r
    for k in range(e.open_n):
        r = &e.reqs[e.open_q[(e.open_head + k) & (e.open_cap - 1)]]
        if r.remote != 0 and (t < 0 or r.remote_s < t):
            t = r.remote_s
    return t


cdef int64_t _blocks_to_move(const LinkC* link, const RouterC* rd, const KVCacheC* pkv, const ReqC* pr,
                             const KVCacheC* dkv, int64_t g) noexcept nogil:
    """The blocks request ``g``'s transfer moves: every block the prefill replica holds for it, in
    every group (vLLM's request_finished hands over each group's block ids); with ``missing`` only
    those past the decode replica's prefix hit (its full-attention group's leading prompt blocks
    cached now), as Nixl pulls only the blocks the decode side lacks."""
    cdef tok_t hit = 0
    cdef int64_t k, blocks = 0
    cdef int32_t gi, j
    cdef const block_id_t* table
    if link.missing:
        for k in range(rd.key_off[g], rd.key_off[g + 1]):
            if bp_lookup(&dkv.pool, _pool_key(rd, k)) < 0:
                break
            hit += rd.block
    for gi in range(pkv.n_groups):
        table = kv_table(pkv, gi, pr.slot)
        for j in range(<int32_t>(hit // pkv.groups[gi].spec.block_size), pkv.groups[gi].table_len[pr.slot]):
            if table[j] != 0:
                blocks += 1
    return blocks


cdef sec_t _transfer_s(const LinkC* link, int64_t blocks) noexcept nogil:
    """Transfer seconds: bytes / bandwidth + latency (an infinite bandwidth moves them in no time)."""
    cdef double bytes_ = <double>blocks * link.block_bytes
    if bytes_ == 0 or link.bandwidth == INFINITY:
        return link.latency
    return bytes_ / link.bandwidth + link.latency
