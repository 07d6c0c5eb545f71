"""Reading a text trace in byte-range blocks, each on its own, with exact line numbers.

A file of ``size`` bytes is cut into blocks of :data:`BLOCK_BYTES` bytes
(:func:`block_ranges`); block ``k`` owns the lines that *start* in its byte
range, so every line belongs to exactly one block whatever the block size,
and a block can be read by any worker without reading the others
(:func:`block_text`).  Its first line's number is one plus the line breaks
before it: :func:`count_breaks` counts them per fixed range (in parallel,
one task per block) and :func:`first_lines` sums them up.  Line breaks are
counted as the line-by-line readers see them (Python's universal newlines:
``\\n``, ``\\r\\n`` and a lone ``\\r``), so a block's line numbers are the
ones the whole-file reader would give.

Each format parses a block with Arrow's C++ readers first (``pyarrow.json``,
``pyarrow.csv``) and checks the columns at once; a block they refuse, or
whose values a check finds wrong, is parsed again line by line
(:func:`lines`) with the format's row function, which names the
``file:line`` and field of every bad line.
"""

from __future__ import annotations

import io
import os

from aisim.errors import TraceError

# Bytes per block.  Large enough that a block's fixed costs vanish, small enough that a
# worker holds a few of them at once.
BLOCK_BYTES = 32 << 20

# Bytes past a block's end read at a time while looking for the end of its last line.
_TAIL_READ = 1 << 16


def block_ranges(size: int, block_bytes: int | None = None) -> list:
    """``[(start, end), ...]``: the byte ranges of the blocks of a file of ``size`` bytes (one for an empty file)."""
    step = block_bytes or BLOCK_BYTES
    if size <= step:
        return [(0, size)]
    return [(a, min(a + step, size)) for a in range(0, size, step)]


def _open(path: str):
    try:
        return open(path, "rb")
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None


def _breaks(data: bytes, next_byte: bytes) -> int:
    """Universal line breaks in ``data``: ``\\n``, and ``\\r`` not followed by ``\\n`` (``next_byte`` follows)."""
    n = _count_newlines(data)
    cr = b"\r" in data and data.count(b"\r")
    if cr:
        n += cr - data.count(b"\r\n") - (1 if data.endswith(b"\r") and next_byte == b"\n" else 0)
    return n


def _count_newlines(data: bytes) -> int:
    """``data.count(b"\\n")``; numpy's vectorised compare is faster on a long block."""
    if len(data) < 1 << 20:
        return data.count(b"\n")
    import numpy as np

    arr = np.frombuffer(data, dtype=np.uint8)
    step = 1 << 18  # compared a piece at a time: the temporary stays in cache
    return sum(int(np.count_nonzero(arr[i:i + step] == 10)) for i in range(0, len(arr), step))


def count_breaks(path: str, start: int, end: int) -> int:
    """Line breaks in the bytes ``[start, end)`` of ``path`` (a lone ``\\r`` counts; ``\\r\\n`` once)."""
    total = 0
    with _open(path) as fh:
        fh.seek(start)
        pos = start
        while pos < end:
            chunk = fh.read(min(1 << 24, end - pos))
            if not chunk:
                break
            pos += len(chunk)
            nxt = b""
            if chunk.endswith(b"\r"):
                nxt = fh.read(1)
                fh.seek(pos)
            total += _breaks(chunk, nxt)
    return total


def first_lines(counts: list) -> list:
    """The line number before each fixed range: ``[0, c0, c0 + c1, ...]`` (``counts`` per range)."""
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out


def block_text(path: str, start: int, end: int, breaks_before: int) -> tuple:
    """The bytes of the lines that start in ``[start, end)``, and the number of the first one.

    Parameters
    ----------
    path : str
    start, end : int
        The block's byte range (:func:`block_ranges`).
    breaks_before : int
        Line breaks in ``[0, start)`` (:func:`first_lines`).

    Returns
    -------
    data : bytes
        From the first line start at or after ``start`` to the first line
        start at or after ``end`` (or the end of the file); empty when no
        line starts in the range.
    first_line : int
        The 1-based number of the first line in ``data``.
    """
    with _open(path) as fh:
        begin = start
        line = breaks_before + 1
        if start > 0:
            fh.seek(start - 1)
            prev = fh.read(1)
            if prev == b"\r":  # a line break when the next byte is not "\n"
                cur = fh.read(1)
                at_start = cur != b"\n"
                fh.seek(start)
            else:
                at_start = prev == b"\n"
            if not at_start:
                # The line spanning ``start`` belongs to an earlier block: skip past its end.
                skipped = _skip_line(fh, start)
                if skipped is None or skipped >= end:
                    return b"", line
                line += _breaks_between(path, start, skipped)
                begin = skipped
        if end <= begin:
            return b"", line
        stop = _line_end(fh, end)
        fh.seek(begin)
        return fh.read(stop - begin), line  # one read, one copy: the block and its last line's tail


def _line_end(fh, end: int) -> int:
    """The position just past the line break that ends the line holding byte ``end - 1`` (or the file's end)."""
    fh.seek(end - 1)
    last = fh.read(1)
    if not last or last == b"\n":
        return end
    if last == b"\r":
        return end + 1 if fh.read(1) == b"\n" else end  # "\r\n" across ``end``, or a lone "\r" ending the line
    stop = _skip_line(fh, end)
    return fh.seek(0, os.SEEK_END) if stop is None else stop


def block_texts(path: str, ranges: list):
    """:func:`block_text` of every range of ``ranges`` in order, reading the file once.

    Block ``k``'s lines follow block ``k - 1``'s without a gap, so its first
    line's number is one plus the line breaks of the blocks before it (no
    separate count of the file's line breaks).
    """
    breaks = 0
    for k, (a, b) in enumerate(ranges):
        data, _ = block_text(path, a, b, 0)
        yield data, breaks + 1
        if k + 1 < len(ranges):  # the last block's breaks number no later line
            breaks += _breaks(data, b"")


def _first_break(chunk: bytes):
    """``(end, kind)``: the position just past the first line break in ``chunk``, or None."""
    n = chunk.find(b"\n")
    r = chunk.find(b"\r")
    if r < 0 and n < 0:
        return None
    if r < 0 or (0 <= n < r):
        return n + 1, "\n"
    if r + 1 < len(chunk) and chunk[r + 1:r + 2] == b"\n":
        return r + 2, "\r\n"
    return r + 1, "\r"


def _skip_line(fh, start: int):
    """The position just past the first line break at or after ``start`` (None at the end of the file)."""
    fh.seek(start)
    pos = start
    while True:
        chunk = fh.read(_TAIL_READ)
        if not chunk:
            return None
        cut = _first_break(chunk)
        if cut is not None:
            stop, kind = cut
            if kind == "\r" and stop == len(chunk):
                nxt = fh.read(1)
                if nxt == b"\n":
                    stop += 1
            return pos + stop
        pos += len(chunk)


def _breaks_between(path: str, start: int, end: int) -> int:
    return count_breaks(path, start, end)


def lines(data: bytes, first_line: int):
    """``(line number, text)`` of every line of ``data``, as the line-by-line readers see them.

    Text is decoded as UTF-8 with ``surrogateescape`` (a bad byte spoils only
    its line, :func:`aisim.textin.check_decoded`) and split with universal
    newlines, the terminators kept.
    """
    text = data.decode("utf-8", errors="surrogateescape")
    for i, line in enumerate(io.StringIO(text, newline=""), first_line):
        yield i, line


def plain_lines(data: bytes):
    """Whether ``data``'s line breaks are all ``\\n`` or ``\\r\\n`` (no lone ``\\r``): Arrow then sees its lines."""
    if b"\r" not in data:
        return True
    return data.count(b"\r") == data.count(b"\r\n")


def line_numbers(data: bytes, first_line: int, rows: int):
    """The line numbers of the first ``rows`` non-blank lines of ``data`` (int64), or None.

    A line is blank when it holds only spaces, tabs and ``\\r``: the JSON
    reader skips it, as the line-by-line readers skip a line whose text
    strips to nothing.  Returns None when ``data`` does not have exactly
    ``rows`` non-blank lines (the caller then reads the block line by line).
    """
    import numpy as np

    total = _count_newlines(data) + (0 if data.endswith(b"\n") or not data else 1)
    if total == rows:
        return np.arange(first_line, first_line + rows, dtype=np.int64)
    arr = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(arr == 10)
    starts = np.concatenate([[0], ends + 1])
    stops = np.concatenate([ends, [len(arr)]])
    keep = starts < len(arr)
    starts, stops = starts[keep], stops[keep]
    ink = ~np.isin(arr, np.frombuffer(b" \t\r", dtype=np.uint8))
    cum = np.concatenate([[0], np.cumsum(ink, dtype=np.int64)])
    full = (cum[stops] - cum[starts]) > 0
    numbers = np.flatnonzero(full).astype(np.int64) + first_line
    return numbers if len(numbers) == rows else None


def file_size(path: str) -> int:
    """The file's size; an unreadable file is a :class:`TraceError` naming it."""
    try:
        return os.path.getsize(path)
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None
