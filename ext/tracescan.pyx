"""The trace readers' kernels: uniform JSON lines, hash ids' token streams, ids made of line numbers,
the requests' output streams.

:func:`scan_lines` (used by ``aisim.traces.jsonlines``) reads JSON lines of
one shape straight into typed columns; :func:`unit_streams` gives Mooncake
hash ids their token streams and :func:`line_ids` makes the ``stem:line``
request ids of lines without one (both used by ``aisim.traces.mooncake``);
:func:`id_streams` gives every request id its output tokens' stream
(``aisim.traces.schema.output_streams``).

A block whose lines all repeat its first line's shape -- the same keys in
the same order, the same separators -- is a fixed program: the literal
before the first value (``{"key":``), a value of that key's type, the
literal before the next value (``,"key":``), ..., the closing brace, a line
break.  :func:`scan_lines` runs the program over every line once and
writes each value into its column's arrays; the first byte it does not
expect refuses the whole block, which the caller then reads another way.

The values it takes are exactly these (the JSON grammar's subset that
converts without doubt), each possibly ``null``:

- int: ``-?(0|[1-9][0-9]*)`` within int64;
- float: a JSON number whose decimal digits make an integer ``m <= 2**53``
  scaled by ``10**e``, ``|e| <= 22``: ``m * 10**e`` (or ``m / 10**-e``) is
  then one correctly rounded IEEE operation on two exact doubles, the value
  any correctly rounding parser gives (Clinger's fast path);
- string: ``"`` then bytes other than ``"``, ``\\`` and controls, then ``"``
  (no escapes); the caller checks UTF-8 when a byte >= 0x80 was seen;
- list: ``[`` non-negative int64 items joined by the block's item separator ``]``.

The caller allocates every array (:func:`scan_lines`' ``cap`` rows) and
builds the Arrow arrays over them; nothing here allocates.
"""

from libc.string cimport memcpy

from aisim._core.types cimport int8_t, int32_t, int64_t, scan_col_t, uint8_t, uint64_t
from aisim._core.util cimport mix64

# Value kinds (aisim.traces.jsonlines maps Arrow types onto them).
cdef enum:
    SCAN_INT = 0
    SCAN_FLOAT = 1
    SCAN_STRING = 2
    SCAN_LIST = 3

KINDS = {"int": SCAN_INT, "float": SCAN_FLOAT, "string": SCAN_STRING, "list": SCAN_LIST}

# Columns of one shape (more keys: the caller reads the block another way).
MAX_COLUMNS = 16

# A value, a literal or a line not of the program: the block is refused.  FULL: more list items than
# the caller's item array holds (it may scan again with a longer one).
cdef enum:
    REFUSED = -1
    FULL = -2

cdef double _POW10[23]
_p = 1.0
for _k in range(23):  # 10**k for k <= 22: every one an exact double, each product exact
    _POW10[_k] = _p
    _p *= 10.0
del _p, _k

cdef uint64_t _INT64_MAX = 9223372036854775807ULL
cdef uint64_t _EXACT_MAX = 9007199254740992ULL  # 2**53: every integer up to it is an exact double


cdef inline bint _digit(uint8_t c) noexcept nogil:
    return 48 <= c <= 57


cdef inline bint _has(const uint8_t* p, int64_t size, int64_t pos, const uint8_t* lit, int64_t n) noexcept nogil:
    # Whether p[pos:pos + n] == lit[:n] (literals are a few bytes: a loop beats a call to memcmp).
    cdef int64_t i
    if size - pos < n:
        return False
    for i in range(n):
        if p[pos + i] != lit[i]:
            return False
    return True


cdef inline int64_t _uint(const uint8_t* p, int64_t size, int64_t pos, uint64_t* out) noexcept nogil:
    # ``0|[1-9][0-9]*`` at ``pos`` within int64 into ``out[0]``; the position after it, or REFUSED.
    cdef uint64_t v = 0
    cdef int64_t start = pos
    if pos >= size or not _digit(p[pos]):
        return REFUSED
    if p[pos] == 48:  # "0": a digit after it would be a leading zero, which the next literal refuses
        out[0] = 0
        return pos + 1
    while pos < size and _digit(p[pos]):
        if pos - start == 19:  # twenty digits: beyond int64
            return REFUSED
        v = v * 10 + (p[pos] - 48)
        pos += 1
    if v > _INT64_MAX:
        return REFUSED
    out[0] = v
    return pos


cdef inline int64_t _float(const uint8_t* p, int64_t size, int64_t pos, double* out) noexcept nogil:
    # A JSON number at ``pos`` converted exactly (see the module docstring); the position after it, or REFUSED.
    cdef bint neg = False
    cdef uint64_t m = 0
    cdef int64_t e = 0, ex = 0, nd = 0, start
    cdef bint eneg = False
    cdef double v
    if pos < size and p[pos] == 45:  # "-"
        neg = True
        pos += 1
    if pos >= size or not _digit(p[pos]):
        return REFUSED
    if p[pos] == 48:
        pos += 1
    else:
        while pos < size and _digit(p[pos]):
            if nd == 19:
                return REFUSED
            m = m * 10 + (p[pos] - 48)
            nd += 1
            pos += 1
    if pos < size and p[pos] == 46:  # "." and at least one digit
        pos += 1
        start = pos
        while pos < size and _digit(p[pos]):
            if m != 0 or p[pos] != 48:  # leading zeros of the fraction add no significant digit
                if nd == 19:
                    return REFUSED
                nd += 1
            m = m * 10 + (p[pos] - 48)
            e -= 1
            pos += 1
        if pos == start:
            return REFUSED
    if pos < size and (p[pos] == 101 or p[pos] == 69):  # "e" or "E", a sign, at least one digit
        pos += 1
        if pos < size and (p[pos] == 43 or p[pos] == 45):
            eneg = p[pos] == 45
            pos += 1
        start = pos
        while pos < size and _digit(p[pos]):
            if ex < 100000:
                ex = ex * 10 + (p[pos] - 48)
            pos += 1
        if pos == start:
            return REFUSED
        e += -ex if eneg else ex
    if m == 0:
        v = 0.0
    elif m > _EXACT_MAX or e < -22 or e > 22:
        return REFUSED
    elif e >= 0:
        v = <double>m * _POW10[e]
    else:
        v = <double>m / _POW10[-e]
    out[0] = -v if neg else v
    return pos


cdef inline int64_t _value(const uint8_t* p, int64_t size, int64_t pos, scan_col_t* col, int64_t row,
                           const uint8_t* sep, int64_t sep_len, int64_t item_cap) noexcept nogil:
    # One value of ``col``'s kind (or null) at ``pos`` into row ``row``; the position after it, or REFUSED.
    cdef uint64_t u = 0
    cdef int64_t start, used
    cdef uint8_t c
    cdef int8_t kind = col.kind
    if pos < size and p[pos] == 110:  # "null"
        if size - pos < 4 or p[pos + 1] != 117 or p[pos + 2] != 108 or p[pos + 3] != 108:
            return REFUSED
        col.valid[row] = 0
        col.nulls += 1
        if kind == SCAN_INT:
            col.ints[row] = 0
        elif kind == SCAN_FLOAT:
            col.floats[row] = 0.0
        elif kind == SCAN_STRING:
            col.ints[row] = 0
            col.offsets[row + 1] = col.offsets[row]
        else:
            col.offsets[row + 1] = col.offsets[row]
        return pos + 4
    col.valid[row] = 1
    if kind == SCAN_INT:
        if pos < size and p[pos] == 45:
            pos = _uint(p, size, pos + 1, &u)
            if pos < 0:
                return REFUSED
            col.ints[row] = -<int64_t>u
        else:
            pos = _uint(p, size, pos, &u)
            if pos < 0:
                return REFUSED
            col.ints[row] = <int64_t>u
        return pos
    if kind == SCAN_FLOAT:
        return _float(p, size, pos, &col.floats[row])
    if kind == SCAN_STRING:
        if pos >= size or p[pos] != 34:  # '"'
            return REFUSED
        pos += 1
        start = pos
        while True:
            if pos >= size:
                return REFUSED
            c = p[pos]
            if c == 34:
                break
            if c < 32 or c == 92:  # a control character or an escape
                return REFUSED
            if c >= 128:
                col.wide = 1
            pos += 1
        col.ints[row] = start
        col.offsets[row + 1] = col.offsets[row] + <int32_t>(pos - start)
        return pos + 1
    # SCAN_LIST
    if pos >= size or p[pos] != 91:  # "["
        return REFUSED
    pos += 1
    used = col.used
    if pos < size and p[pos] != 93:  # not "]": items
        while True:
            pos = _uint(p, size, pos, &u)
            if pos < 0:
                return REFUSED
            if used == item_cap:
                return FULL
            col.items[used] = <int64_t>u
            used += 1
            if _has(p, size, pos, sep, sep_len):
                pos += sep_len
            else:
                break
    if pos >= size or p[pos] != 93:
        return REFUSED
    col.used = used
    col.offsets[row + 1] = <int32_t>used
    return pos + 1


cdef int64_t _scan(const uint8_t* p, int64_t size, scan_col_t* cols, int ncols, const uint8_t* end_lit,
                   int64_t end_len, const uint8_t* sep, int64_t sep_len, int64_t cap,
                   int64_t item_cap) noexcept nogil:
    # Every line of p[:size] through the program; the rows read, REFUSED or FULL.
    cdef int64_t pos = 0, row = 0
    cdef int c
    cdef scan_col_t* col
    while pos < size:
        if row == cap:
            return REFUSED
        for c in range(ncols):
            col = &cols[c]
            if not _has(p, size, pos, col.lit, col.lit_len):
                return REFUSED
            pos = _value(p, size, pos + col.lit_len, col, row, sep, sep_len, item_cap)
            if pos < 0:
                return pos
        if not _has(p, size, pos, end_lit, end_len):
            return REFUSED
        pos += end_len
        if pos < size:  # a line break ("\n" or "\r\n"), or the block ends after the last line
            if p[pos] == 13:
                pos += 1
            if pos >= size or p[pos] != 10:
                return REFUSED
            pos += 1
        row += 1
    return row


def scan_lines(const uint8_t[::1] data not None, list lits not None, const int8_t[::1] kinds not None,
               bytes end not None, bytes sep not None, list arrays not None, int64_t cap, int64_t item_cap):
    """Scan ``data``'s lines into the caller's arrays; the rows read, -1 (a line not of the shape) or -2.

    Parameters
    ----------
    data : bytes-like
        Whole lines of JSON objects.
    lits : list of bytes
        Per column, the literal before its value.
    kinds : numpy.ndarray of int8
        Per column, its kind (:data:`KINDS`).
    end : bytes
        The literal after the last value (``}``).
    sep : bytes
        The separator of list items.
    arrays : list of tuple
        Per column, ``(ints, floats, valid, offsets, items)``: int64 ``cap``,
        float64 ``cap``, uint8 ``cap``, int32 ``cap + 1`` (its first entry 0),
        int64 ``item_cap`` (arrays a kind does not use may be length 1).
    cap, item_cap : int
        Rows and list items the arrays hold.

    Returns
    -------
    tuple
        ``(rows, nulls, wide)``: rows read (-1: refused; -2: more list items
        than ``item_cap``), per column its nulls and whether a string
        column holds a byte >= 0x80.
    """
    cdef scan_col_t cols[16]
    cdef int ncols = len(lits)
    cdef int c
    cdef int64_t rows
    cdef int64_t[::1] ints
    cdef double[::1] floats
    cdef uint8_t[::1] valid
    cdef int32_t[::1] offsets
    cdef int64_t[::1] items
    cdef const uint8_t[::1] lit
    if ncols > MAX_COLUMNS or ncols != kinds.shape[0] or ncols != len(arrays):
        raise ValueError("scan_lines: one literal, kind and array set per column, at most 16 columns")
    for c in range(ncols):
        ints, floats, valid, offsets, items = arrays[c]
        if ints.shape[0] < (cap if kinds[c] == SCAN_INT or kinds[c] == SCAN_STRING else 1) \
                or floats.shape[0] < (cap if kinds[c] == SCAN_FLOAT else 1) or valid.shape[0] < cap \
                or offsets.shape[0] < cap + 1 or items.shape[0] < (item_cap if kinds[c] == SCAN_LIST else 1) \
                or not 0 <= kinds[c] <= SCAN_LIST or len(lits[c]) == 0:
            raise ValueError("scan_lines: arrays shorter than cap, or a kind or literal out of range")
        lit = lits[c]
        cols[c].lit = &lit[0]
        cols[c].lit_len = lit.shape[0]
        cols[c].kind = kinds[c]
        cols[c].ints = &ints[0]
        cols[c].floats = &floats[0]
        cols[c].valid = &valid[0]
        cols[c].offsets = &offsets[0]
        cols[c].items = &items[0]
        cols[c].nulls = 0
        cols[c].used = 0
        cols[c].wide = 0
        cols[c].offsets[0] = 0
    cdef const uint8_t* end_p = <const uint8_t*>(<char*>end)
    cdef const uint8_t* sep_p = <const uint8_t*>(<char*>sep)
    cdef int64_t end_len = len(end), sep_len = len(sep), size = data.shape[0]
    if size == 0:
        return 0, [0] * ncols, [False] * ncols
    with nogil:
        rows = _scan(&data[0], size, cols, ncols, end_p, end_len, sep_p, sep_len, cap, item_cap)
    return rows, [cols[c].nulls for c in range(ncols)], [bool(cols[c].wide) for c in range(ncols)]


cdef void _gather(const uint8_t* p, const int64_t* starts, const int32_t* offsets, int64_t n,
                  uint8_t* out) noexcept nogil:
    cdef int64_t i
    for i in range(n):
        memcpy(out + offsets[i], p + starts[i], offsets[i + 1] - offsets[i])


def gather_strings(const uint8_t[::1] data not None, const int64_t[::1] starts not None,
                   const int32_t[::1] offsets not None, uint8_t[::1] out not None):
    """Copy a string column's texts (``data[starts[i]:starts[i] + len_i]``) one after another into ``out``."""
    cdef int64_t n = starts.shape[0]
    if offsets.shape[0] != n + 1 or out.shape[0] < offsets[n] or (n and data.shape[0] == 0):
        raise ValueError("gather_strings: offsets must be one longer than starts, out as long as the texts")
    if n == 0 or offsets[n] == 0:
        return
    with nogil:
        _gather(&data[0], &starts[0], &offsets[0], n, &out[0])


cdef int64_t _line_ids(const uint8_t* prefix, int64_t plen, const int64_t* lines, int64_t n, int32_t* offsets,
                       uint8_t* out) noexcept nogil:
    # "<prefix><line>" for each of lines[:n] (each >= 0); with out NULL only the offsets. The bytes written.
    cdef int64_t i, v, pos = 0, k
    cdef uint8_t digits[24]
    offsets[0] = 0
    for i in range(n):
        v = lines[i]
        k = 0
        while True:
            digits[k] = <uint8_t>(48 + v % 10)
            k += 1
            v //= 10
            if v == 0:
                break
        if out != NULL:
            memcpy(out + pos, prefix, plen)
            pos += plen
            while k > 0:
                k -= 1
                out[pos] = digits[k]
                pos += 1
        else:
            pos += plen + k
        offsets[i + 1] = <int32_t>pos
    return pos


def line_ids(bytes prefix not None, const int64_t[::1] lines not None, int32_t[::1] offsets not None):
    """The ids ``prefix + str(line)`` of ``lines`` (each >= 0) as an Arrow string column's buffers.

    ``offsets`` (one more entry than ``lines``) receives the offsets; returns the text (a bytearray).
    """
    cdef const uint8_t* pre = <const uint8_t*>(<char*>prefix)
    cdef int64_t plen = len(prefix), total, n = lines.shape[0], i
    cdef uint8_t[::1] view
    if offsets.shape[0] != n + 1:
        raise ValueError("line_ids: one more offset than lines")
    for i in range(n):
        if lines[i] < 0:
            raise ValueError("line_ids: a negative line")
    with nogil:
        total = _line_ids(pre, plen, &lines[0] if n else NULL, n, &offsets[0], NULL)
    if total >= 2**31:
        raise ValueError("line_ids: beyond int32 offsets")
    text = bytearray(total)
    if total:
        view = text
        with nogil:
            _line_ids(pre, plen, &lines[0], n, &offsets[0], &view[0])
    return text


cdef inline uint64_t _stream_mix(uint64_t x) noexcept nogil:
    # splitmix64's finaliser; 0 becomes 1 (0 is no stream).
    x = mix64(x)
    return x if x != 0 else 1


cdef void _splitmix(const uint64_t* ids, int64_t n, uint64_t seed, uint64_t* out) noexcept nogil:
    # splitmix64 of id * golden + seed.
    cdef int64_t i
    for i in range(n):
        out[i] = _stream_mix(ids[i] * 0x9E3779B97F4A7C15ULL + seed)


def unit_streams(const uint64_t[::1] ids not None, uint64_t seed, uint64_t[::1] out not None):
    """``out[i]``: the token stream of hash id ``ids[i]`` (splitmix64 of ``ids[i] * golden + seed``, never 0)."""
    cdef int64_t n = ids.shape[0]
    if out.shape[0] != n:
        raise ValueError("unit_streams: out must be as long as ids")
    if n == 0:
        return
    with nogil:
        _splitmix(&ids[0], n, seed, &out[0])


cdef void _id_streams(const uint8_t* data, const int64_t* offsets, int64_t n, uint64_t* out) noexcept nogil:
    # FNV-1a over each id's bytes, its length folded in with the golden ratio (the "output" domain),
    # finished with splitmix64's finaliser.
    cdef int64_t i, j
    cdef uint64_t h
    for i in range(n):
        h = 0xCBF29CE484222325ULL
        for j in range(offsets[i], offsets[i + 1]):
            h = (h ^ data[j]) * 0x100000001B3ULL
        h ^= <uint64_t>(offsets[i + 1] - offsets[i]) + 0x9E3779B97F4A7C15ULL
        out[i] = _stream_mix(h)


def id_streams(const uint8_t[::1] data not None, const int64_t[::1] offsets not None, uint64_t[::1] out not None):
    """``out[i]``: the output token stream of the id in ``data[offsets[i]:offsets[i + 1]]`` (its UTF-8
    bytes; see ``aisim.traces.schema.output_streams``)."""
    cdef int64_t n = out.shape[0]
    if offsets.shape[0] != n + 1:
        raise ValueError("id_streams: offsets must hold one more entry than out")
    if n == 0:
        return
    if offsets[0] < 0 or offsets[n] > data.shape[0]:
        raise ValueError("id_streams: offsets beyond data")
    with nogil:
        _id_streams(&data[0] if data.shape[0] else NULL, &offsets[0], n, &out[0])
