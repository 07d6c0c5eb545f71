# The record of gaps between a request's streamed outputs (types.pxd GapsC): one pair per distinct
# recent gap.  cimported by scheduler (update_from_output stamps every chunk) and engine (macro-steps,
# the handover).  Inline: a call per sampled request and step.
from aisim._core.memory cimport mem_free, mem_grow
from aisim._core.types cimport GapsC, int64_t, sec_t

# Pairs looked back at for an equal gap before a new pair is opened: a step's decodes share the
# gap since the step before, a resumed or newly decoding request brings one or two more.
cdef enum:
    GAPS_LOOKBACK = 4


cdef inline int gaps_add(GapsC* g, sec_t gap, int64_t count) except -1 nogil:
    # ``count`` chunks, each ``gap`` seconds after its request's previous one.
    cdef int64_t j = g.n - 1
    cdef int64_t lo = g.n - GAPS_LOOKBACK
    cdef int64_t new
    while j >= lo and j >= 0:
        if g.gap[j] == gap:
            g.count[j] += count
            return 0
        j -= 1
    if g.n == g.cap:
        new = g.cap * 2 if g.cap > 0 else 1024
        mem_grow(<void**>&g.gap, g.cap, new, sizeof(double))
        mem_grow(<void**>&g.count, g.cap, new, sizeof(int64_t))
        g.cap = new
    g.gap[g.n] = gap
    g.count[g.n] = count
    g.n += 1
    return 0


cdef inline void gaps_release(GapsC* g) noexcept nogil:
    mem_free(g.gap)
    mem_free(g.count)
    g.gap = NULL
    g.count = NULL
    g.n = g.cap = 0
