# Included by deploy.pyx: the router's prefix index of the trace's prompt blocks (PrefixIndexC,
# deploy.pxd).  Built once before the run from every request's prompt keys: a compressed prefix
# tree whose edges (nodes) are runs of blocks the same requests share, every block a dense id.
# A request's prompt is a path of whole nodes, so the blocks it holds active on a replica are a
# count per node, and the replicas that cache a block are one mask per id, set from the block
# tags the replicas' KV events carry (blockpool.pxd BlockC.tag) without a lookup.

# Key tables of the build: open addressing, linear probing, key 0 never stored (block keys are
# never 0), capacity a power of two at least twice the entries.


cdef hash_t* _table(int64_t entries, hash_t* mask) except NULL nogil:
    cdef int64_t c = 16
    while c < 2 * entries:
        c <<= 1
    mask[0] = <hash_t>(c - 1)
    return <hash_t*>mem_calloc(c, sizeof(hash_t))


cdef inline hash_t _slot(const hash_t* keys, hash_t mask, hash_t key) noexcept nogil:
    # The key's slot, or the empty slot where it would go.
    cdef hash_t s = mix64(key) & mask
    while keys[s] != 0 and keys[s] != key:
        s = (s + 1) & mask
    return s


cdef int _index_nodes(RouterC* rt, int64_t n) except -1 nogil:
    """Build the tree: every request's prompt keys from the root, a node split where a prompt
    leaves it or ends inside it.  A node is found by its first key (keys chain their prefix, so
    the key alone names the node that starts with it); ``src`` holds where its keys are read."""
    cdef PrefixIndexC* x = &rt.idx
    cdef int64_t i, pos, L, base, lim, t, src, cap = 1024
    cdef int64_t* node_src = <int64_t*>mem_calloc(cap, sizeof(int64_t))
    cdef hash_t mask, s
    cdef hash_t* fk = _table(2 * n + 1, &mask)        # first key of each node
    cdef int32_t* fk_node = <int32_t*>mem_calloc(mask + 1, sizeof(int32_t))
    cdef int32_t c, d
    x.node = <NodeC*>mem_calloc(cap, sizeof(NodeC))
    x.n_nodes = 0
    for i in range(n):
        base = rt.key_off[i]
        L = rt.key_off[i + 1] - base
        pos = 0
        while pos < L:
            s = _slot(fk, mask, rt.keys[base + pos])
            if x.n_nodes + 2 > cap:  # room for a new node and a split
                mem_grow(<void**>&x.node, cap, 2 * cap, sizeof(NodeC))
                mem_grow(<void**>&node_src, cap, 2 * cap, sizeof(int64_t))
                cap *= 2
            if fk[s] == 0:
                # A new run: the rest of the prompt.
                c = x.n_nodes
                x.n_nodes += 1
                x.node[c].n = <int32_t>(L - pos)
                node_src[c] = base + pos
                fk[s] = rt.keys[base + pos]
                fk_node[s] = c
                break
            c = fk_node[s]
            src = node_src[c]
            lim = min(<int64_t>x.node[c].n, L - pos)
            t = 1
            while t < lim and rt.keys[src + t] == rt.keys[base + pos + t]:
                t += 1
            if t < x.node[c].n:
                # The prompt leaves the node or ends inside it: split at t.
                d = x.n_nodes
                x.n_nodes += 1
                x.node[d].n = <int32_t>(x.node[c].n - t)
                node_src[d] = src + t
                x.node[c].n = <int32_t>t
                s = _slot(fk, mask, rt.keys[src + t])
                fk[s] = rt.keys[src + t]
                fk_node[s] = d
            pos += t
    # Ids in node order; then every request's path, and each key's id.
    cdef int64_t ids = 0, n_path = 0
    for c in range(x.n_nodes):
        x.node[c].first = <int32_t>ids
        x.node[c].crow = -1
        ids += x.node[c].n
        if ids > INT32_MAX_IDS:
            with gil:
                raise ValueError(f"the trace has more than {INT32_MAX_IDS} distinct prompt blocks; "
                                 "a KV-aware router indexes at most that many")
    x.n_ids = <int32_t>ids
    rt.path_off = <int64_t*>mem_calloc(n + 1, sizeof(int64_t))
    cap = n + 16
    rt.path = <int32_t*>mem_calloc(cap, sizeof(int32_t))
    for i in range(n):
        base = rt.key_off[i]
        L = rt.key_off[i + 1] - base
        rt.path_off[i] = n_path
        pos = 0
        while pos < L:
            c = fk_node[_slot(fk, mask, rt.keys[base + pos])]
            if n_path == cap:
                mem_grow(<void**>&rt.path, cap, 2 * cap, sizeof(int32_t))
                cap *= 2
            rt.path[n_path] = c
            n_path += 1
            for t in range(x.node[c].n):
                rt.kid[base + pos + t] = x.node[c].first + <int32_t>t
            pos += x.node[c].n
    rt.path_off[n] = n_path
    mem_free(fk)
    mem_free(fk_node)
    mem_free(node_src)
    x.cm = <hash_t*>mem_calloc(ids if ids else 1, sizeof(hash_t))
    return 0


cdef int _index_lookups(RouterC* rt, int64_t n) except -1 nogil:
    """The key -> id table, for the blocks past a quoted request's prompt (TAG_LOOKUP)."""
    cdef PrefixIndexC* x = &rt.idx
    cdef int64_t k
    cdef hash_t s
    x.lk_key = _table(x.n_ids, &x.lk_mask)
    x.lk_id = <int32_t*>mem_calloc(x.lk_mask + 1, sizeof(int32_t))
    cdef hash_t key
    for k in range(rt.key_off[n]):
        key = _pool_key(rt, k)
        s = _slot(x.lk_key, x.lk_mask, key)
        x.lk_key[s] = key
        x.lk_id[s] = rt.kid[k]
    return 0


cdef inline int32_t index_id(const PrefixIndexC* x, hash_t key, int32_t tag) noexcept nogil:
    """The id of a key a replica reports with ``tag``; -1 when it is no prompt block of the trace."""
    cdef hash_t s
    if tag >= 0:
        return tag
    if tag == TAG_NONE or x.lk_key == NULL:
        return -1
    s = _slot(x.lk_key, x.lk_mask, key)
    return x.lk_id[s] if x.lk_key[s] != 0 else -1


cdef int32_t index_row(PrefixIndexC* x) except -1 nogil:
    """A zeroed row of counts."""
    cdef int32_t r, i, new
    if x.row_free < 0:
        new = x.rows_cap * 2 if x.rows_cap > 0 else 1024
        mem_grow(<void**>&x.cnt, <size_t>x.rows_cap * x.n_rep, <size_t>new * x.n_rep, sizeof(int32_t))
        mem_grow(<void**>&x.row_next, x.rows_cap, new, sizeof(int32_t))
        for i in range(new - 1, x.rows_cap - 1, -1):
            x.row_next[i] = x.row_free
            x.row_free = i
        x.rows_cap = new
    r = x.row_free
    x.row_free = x.row_next[r]
    memset(&x.cnt[<int64_t>r * x.n_rep], 0, x.n_rep * sizeof(int32_t))
    return r


cdef inline void index_drop_row(PrefixIndexC* x, NodeC* nd) noexcept nogil:
    """Give a node's row back once no replica has it active."""
    x.row_next[nd.crow] = x.row_free
    x.row_free = nd.crow
    nd.crow = -1


cdef void index_release(PrefixIndexC* x) noexcept nogil:
    mem_free(x.node)
    mem_free(x.cm)
    mem_free(x.cnt)
    mem_free(x.row_next)
    mem_free(x.lk_key)
    mem_free(x.lk_id)
    memset(x, 0, sizeof(PrefixIndexC))
