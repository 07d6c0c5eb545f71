# One binary min-heap of requests, ordered by (major, key, tie).  cimported by
# scheduler (the priority waiting queue, vllm/v1/core/sched/request_queue.py
# PriorityRequestQueue: (priority, arrival_time, request_id)) and engine (the
# closed-loop release queue: (0, release time, request index)).  The tie is
# unique per request, so the order is total and the heap's pop order does not
# depend on its internal layout.  Inline: both users sift in their hot loops.
from aisim._core.memory cimport mem_calloc, mem_free
from aisim._core.types cimport int32_t, int64_t, req_t, sec_t

cdef struct HeapItemC:
    int64_t major              # most significant: the priority (0 when unused)
    sec_t key                  # then: a time (arrival or release)
    int64_t tie                # then: unique per request (id rank or index)
    req_t item                 # the request

cdef struct HeapC:
    HeapItemC* a               # [cap] the heap, a[0] first
    int32_t n                  # items held
    int32_t cap                # capacity (fixed at init: one entry per request)


cdef inline bint heap_before(const HeapItemC* x, const HeapItemC* y) noexcept nogil:
    # Lexicographic (major, key, tie), as Request.__lt__ compares.
    if x.major != y.major:
        return x.major < y.major
    if x.key != y.key:
        return x.key < y.key
    return x.tie < y.tie


cdef inline int heap_init(HeapC* h, int32_t cap) except -1 nogil:
    h.a = <HeapItemC*>mem_calloc(cap, sizeof(HeapItemC))
    h.n = 0
    h.cap = cap
    return 0


cdef inline void heap_release(HeapC* h) noexcept nogil:
    mem_free(h.a)
    h.a = NULL
    h.n = h.cap = 0


cdef inline void _heap_down(HeapC* h, int32_t i) noexcept nogil:
    # Sift a[i] down to its place (the smaller child moves up).
    cdef HeapItemC x = h.a[i]
    cdef int32_t c
    while True:
        c = 2 * i + 1
        if c >= h.n:
            break
        if c + 1 < h.n and heap_before(&h.a[c + 1], &h.a[c]):
            c += 1
        if not heap_before(&h.a[c], &x):
            break
        h.a[i] = h.a[c]
        i = c
    h.a[i] = x


cdef inline void heap_push(HeapC* h, int64_t major, sec_t key, int64_t tie, req_t item) noexcept nogil:
    # The caller sized the heap for every request, so there is always room.
    cdef int32_t i = h.n
    cdef int32_t p
    cdef HeapItemC x
    x.major = major
    x.key = key
    x.tie = tie
    x.item = item
    h.n += 1
    while i > 0:
        p = (i - 1) >> 1
        if not heap_before(&x, &h.a[p]):
            break
        h.a[i] = h.a[p]
        i = p
    h.a[i] = x


cdef inline req_t heap_pop(HeapC* h) noexcept nogil:
    # Remove and return the first request; the heap must not be empty.
    cdef req_t r = h.a[0].item
    h.n -= 1
    if h.n > 0:
        h.a[0] = h.a[h.n]
        _heap_down(h, 0)
    return r


cdef inline void heap_remove(HeapC* h, req_t item) noexcept nogil:
    # Drop ``item`` and restore the heap (O(n): rare, see the scheduler).
    cdef int32_t i, j = 0
    for i in range(h.n):
        if h.a[i].item != item:
            h.a[j] = h.a[i]
            j += 1
    h.n = j
    for i in range(h.n // 2 - 1, -1, -1):
        _heap_down(h, i)
