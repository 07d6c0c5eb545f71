# The one allocation pair of the replay core: overflow-checked, zero-filled.
# cimported by every module of ext/ that owns C arrays (blockpool, kvcache,
# scheduler, engine, testing).  Inline, so a growth costs no cross-module call.
# Memory comes from PyMem_Raw* (callable without the GIL, traced by tracemalloc).
from cpython.mem cimport PyMem_RawCalloc, PyMem_RawFree, PyMem_RawRealloc
from libc.string cimport memset


cdef inline int _raise_no_memory(size_t n, size_t item) except -1 nogil:
    # Out of memory, or n * item does not fit a size_t.
    with gil:
        raise MemoryError(f"replay core: cannot allocate {n} items of {item} bytes")


cdef inline void* mem_calloc(size_t n, size_t item) except NULL nogil:
    """``n`` zeroed items (at least one, so NULL always means failure)."""
    cdef void* p
    if n > (<size_t>-1) // item:
        _raise_no_memory(n, item)
    p = PyMem_RawCalloc(n if n > 0 else 1, item)
    if p == NULL:
        _raise_no_memory(n, item)
    return p


cdef inline int mem_resize(void** p, size_t new_n, size_t item) except -1 nogil:
    """Resize ``p[0]`` to ``new_n`` items, items past the old size left unwritten (for rows the
    caller writes whole before any is read: untouched memory costs no page).

    ``p[0]`` is left untouched when the allocation fails.
    """
    cdef void* q
    if new_n > (<size_t>-1) // item:
        _raise_no_memory(new_n, item)
    q = PyMem_RawRealloc(p[0], new_n * item if new_n > 0 else item)
    if q == NULL:
        _raise_no_memory(new_n, item)
    p[0] = q
    return 0


cdef inline int mem_grow(void** p, size_t old_n, size_t new_n, size_t item) except -1 nogil:
    """Resize ``p[0]`` from ``old_n`` to ``new_n`` items; items past ``old_n`` are zeroed.

    ``p[0]`` is left untouched when the allocation fails.
    """
    mem_resize(p, new_n, item)
    if new_n > old_n:
        memset(<char*>p[0] + old_n * item, 0, (new_n - old_n) * item)
    return 0


cdef inline void mem_free(void* p) noexcept nogil:
    PyMem_RawFree(p)
