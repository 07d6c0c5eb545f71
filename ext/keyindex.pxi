# Included by deploy.pyx: the router's key index, one open-addressing table from a block key to
# which replicas cache it and which hold it active (count rows), as Dynamo's KV router keeps one.

# Lookups issued ahead of the one in hand: the index is larger than the caches and a probe's
# cost is its memory miss, so a run of lookups keeps several misses in flight.
cdef int64_t AHEAD = 8


cdef inline void km_prefetch(const KeyMapC* m, hash_t key) noexcept nogil:
    __builtin_prefetch(&m.e[mix64(key) & m.mask])



cdef int km_init(KeyMapC* m, int64_t cap, int32_t n_rep) except -1 nogil:
    cdef int64_t c = 16, i
    while c < cap:
        c <<= 1
    m.e = <KeyEntC*>mem_calloc(c, sizeof(KeyEntC))
    for i in range(c):
        m.e[i].crow = -1
    m.mask = <hash_t>(c - 1)
    m.n = 0
    m.n_rep = n_rep
    return 0


cdef void km_release(KeyMapC* m) noexcept nogil:
    mem_free(m.e)
    mem_free(m.cnt)
    mem_free(m.row_next)
    memset(m, 0, sizeof(KeyMapC))


cdef inline hash_t _km_slot(const KeyMapC* m, hash_t key) noexcept nogil:
    # The key's slot, or the empty slot where it would go.
    cdef hash_t s = mix64(key) & m.mask
    while m.e[s].key != 0 and m.e[s].key != key:
        s = (s + 1) & m.mask
    return s


cdef int _km_grow(KeyMapC* m) except -1 nogil:
    cdef KeyEntC* old = m.e
    cdef hash_t i, s, old_mask = m.mask
    cdef int64_t c = 2 * (<int64_t>old_mask + 1), j
    m.e = <KeyEntC*>mem_calloc(c, sizeof(KeyEntC))
    for j in range(c):
        m.e[j].crow = -1
    m.mask = <hash_t>(c - 1)
    m.grows += 1
    for i in range(old_mask + 1):
        if old[i].key != 0:
            s = _km_slot(m, old[i].key)
            m.e[s] = old[i]
    mem_free(old)
    return 0


cdef inline int64_t km_find(const KeyMapC* m, hash_t key) noexcept nogil:
    """The key's slot, or -1."""
    cdef hash_t s = _km_slot(m, key)
    return <int64_t>s if m.e[s].key != 0 else -1


cdef int64_t km_insert(KeyMapC* m, hash_t key) except -1 nogil:
    """The key's slot, made (both masks empty, no row) when absent."""
    cdef hash_t s = _km_slot(m, key)
    if m.e[s].key != 0:
        return <int64_t>s
    if 2 * (m.n + 1) > <int64_t>(m.mask + 1):
        _km_grow(m)
        s = _km_slot(m, key)
    m.e[s].key = key
    m.e[s].cm = 0
    m.e[s].am = 0
    m.e[s].crow = -1
    m.n += 1
    return <int64_t>s


cdef int32_t _km_row(KeyMapC* m) except -1 nogil:
    """A zeroed row of counts."""
    cdef int32_t r, i, new
    if m.row_free < 0:
        new = m.rows_cap * 2 if m.rows_cap > 0 else 1024
        mem_grow(<void**>&m.cnt, <size_t>m.rows_cap * m.n_rep, <size_t>new * m.n_rep, sizeof(int32_t))
        mem_grow(<void**>&m.row_next, m.rows_cap, new, sizeof(int32_t))
        for i in range(new - 1, m.rows_cap - 1, -1):
            m.row_next[i] = m.row_free
            m.row_free = i
        m.rows_cap = new
    r = m.row_free
    m.row_free = m.row_next[r]
    memset(&m.cnt[<int64_t>r * m.n_rep], 0, m.n_rep * sizeof(int32_t))
    return r


cdef void km_tidy(KeyMapC* m, hash_t s) noexcept nogil:
    """Drop slot ``s``'s row when no replica has the key active, and the entry when none caches it
    either (backward-shift deletion keeps every probe chain gap-free, no tombstones)."""
    cdef hash_t j, home
    cdef KeyEntC* x = &m.e[s]
    if x.am == 0 and x.crow >= 0:
        m.row_next[x.crow] = m.row_free
        m.row_free = <int32_t>x.crow
        x.crow = -1
    if x.am != 0 or x.cm != 0:
        return
    x.key = 0
    m.n -= 1
    j = s
    while True:
        j = (j + 1) & m.mask
        if m.e[j].key == 0:
            return
        home = mix64(m.e[j].key) & m.mask
        if ((j - home) & m.mask) >= ((j - s) & m.mask):
            m.e[s] = m.e[j]
            m.e[j].key = 0
            m.e[j].crow = -1
            s = j
