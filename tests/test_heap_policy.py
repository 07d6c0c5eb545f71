"""The heap policy replays run under (aisim/_core/__init__.py keep_freed_heap): freed memory stays
for the next replay instead of going back to the system."""

import ctypes
import platform
import subprocess
import sys

import pytest

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

# 40 blocks of 6 MiB (below the heap's block threshold, so from the heap, not mappings of their
# own) allocated, then freed: the bytes the blocks took as mappings of their own, and the heap's
# size once they are freed (glibc's mallinfo2).
PROBE = """
import ctypes, sys
if sys.argv[1] == "core":
    import aisim._core
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                  "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
before = libc.mallinfo2().hblkhd
blocks = [libc.malloc(6 << 20) for _ in range(40)]
for b in blocks:
    ctypes.memset(b, 1, 6 << 20)
mapped = libc.mallinfo2().hblkhd - before
for b in reversed(blocks):
    libc.free(b)
print(mapped, libc.mallinfo2().arena)
"""


def _probe(mode):
    out = subprocess.run([sys.executable, "-c", PROBE, mode], check=True, capture_output=True, text=True)
    mapped, arena = map(int, out.stdout.split())
    return mapped, arena


@pytest.mark.skipif(not GLIBC or not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="glibc's heap only")
def test_freed_heap_is_kept_for_the_next_replay():
    # Without the policy glibc maps the first large blocks on their own and hands the top of the
    # heap back once more than its trim threshold is free; with it, 240 MiB of blocks come from the
    # heap and stay there, freed.
    mapped, arena = _probe("plain")
    assert mapped == 40 * ((6 << 20) + 4096)  # each block its own mapping, a page of header with it
    assert arena < 64 << 20
    mapped, arena = _probe("core")
    assert mapped == 0
    assert arena >= 240 << 20


@pytest.mark.skipif(not GLIBC, reason="glibc's heap only")
def test_policy_reports_it_was_set():
    from aisim._core import HEAP_BLOCK_MAX, HEAP_KEEP, keep_freed_heap

    assert keep_freed_heap() is True
    assert (HEAP_BLOCK_MAX, HEAP_KEEP) == (32 << 20, 1 << 30)


def test_policy_is_a_no_op_off_linux(monkeypatch):
    from aisim import _core

    monkeypatch.setattr(_core.sys, "platform", "darwin")
    assert _core.keep_freed_heap() is False
