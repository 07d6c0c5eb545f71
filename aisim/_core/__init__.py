"""The compiled replay core (built from ``ext/``); private, not public API.

Importing it sets the heap policy replays run under (:func:`keep_freed_heap`).
"""

import ctypes
import sys

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: Blocks below this size come from the heap, not from a mapping of their own: glibc's own
#: ceiling for the threshold it adjusts by itself (32 MiB on 64-bit).
HEAP_BLOCK_MAX = 32 << 20

#: Freed memory the heap keeps for the next allocations before it gives the rest back.
HEAP_KEEP = 1 << 30


def keep_freed_heap(block_max: int = HEAP_BLOCK_MAX, keep: int = HEAP_KEEP) -> bool:
    """Keep freed heap memory for the next replay instead of handing it back to the system.

    A replay fills its columns, tables and (with a KV offload tier) the tier's arrays on the
    heap, a few hundred bytes to a few hundred MB, and frees them when its result is dropped.
    glibc returns the top of the heap to the system once more than 64 MiB of it is free, so
    the next replay in the same process (a sweep, a pipeline worker, a benchmark's repeats)
    takes every page again as a fresh page fault: on the Mooncake sample with a CPU tier,
    about an eighth of the replay's time.  With ``keep``, up to that much freed memory stays
    mapped; the process's peak is unchanged.

    Parameters
    ----------
    block_max : int
        Allocations below this many bytes come from the heap (glibc's ``M_MMAP_THRESHOLD``).
    keep : int
        Free bytes at the top of the heap kept mapped (glibc's ``M_TRIM_THRESHOLD``).

    Returns
    -------
    bool
        Whether the policy was set: False where the C library is not glibc's.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # Setting either parameter ends glibc's own adjustment of both: set both.
    return bool(mallopt(_M_MMAP_THRESHOLD, block_max)) and bool(mallopt(_M_TRIM_THRESHOLD, keep))


keep_freed_heap()
