"""JSON lines of one shape read straight into Arrow columns, several times faster than ``pyarrow.json``.

Machine-written JSONL traces (DuckDB's ``COPY ... (FORMAT JSON)``, Python's
``json.dumps`` one object a line) repeat one shape on every line: the same
keys in the same order, the same spacing, strings without escapes.  For
such a block :func:`read_uniform` gives the table ``pyarrow.json`` would
give with the same explicit schema, several times faster:

1. the first line names the keys and the spacing (``,``/``:`` or ``, ``/``: ``);
2. one typed scan (:mod:`aisim._core.tracescan`) reads every line as that
   shape straight into the columns: integers within int64, floats it
   converts exactly, strings without escapes, lists of ids.  A block it
   refuses (say a float with more digits than a double holds) takes the
   next steps;
3. one regular expression (RE2, linear time) checks that *every* line is
   that shape with JSON values of the schema's types: integers, numbers,
   strings without escapes or control characters, lists of non-negative
   integers, ``null``.  A block it refuses goes back to the caller, which
   reads it another way (``pyarrow.json``, then line by line);
4. the separators around the keys become one delimiter and the CSV reader
   converts the columns (numbers in C++, strings checked as UTF-8); lists
   are split and converted by ``pyarrow.compute``.

Since no string may hold a quote, the only ``"`` of a line are the keys'
and the strings' own, so the separators found in step 4 are exactly the
ones step 3 checked; a string that looks like a separator (``":x"``) gives
its line an extra column, which the CSV reader refuses, and the block is
read with another delimiter.
"""

from __future__ import annotations

import json
import re

import pyarrow as pa

_UINT = r"(?:0|[1-9][0-9]*)"
_INT = r"-?" + _UINT
_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_STRING = r'"[^"\\\x00-\x1f]*"'


def _value_pattern(typ: pa.DataType, item_sep: str):
    """The RE2 pattern of one JSON value of Arrow type ``typ`` (None: a type this reader leaves to others)."""
    if pa.types.is_int64(typ):
        v = _INT
    elif pa.types.is_float64(typ):
        v = _NUMBER
    elif pa.types.is_string(typ):
        v = _STRING
    elif pa.types.is_list(typ) and pa.types.is_int64(typ.value_type):
        v = r"\[(?:" + _UINT + "(?:" + re.escape(item_sep) + _UINT + r")*)?\]"
    else:
        return None
    return "(?:null|" + v + ")"


def _shape(data: bytes, schema: pa.Schema):
    """``(keys, item_sep, key_sep)`` of the first line, or None when it is not a flat object of ``schema``'s keys."""
    end = data.find(b"\n")
    first = data[:end if end >= 0 else len(data)].rstrip(b"\r")
    if not first.startswith(b'{"') or not first.endswith(b"}"):
        return None
    try:
        obj = json.loads(first)
    except ValueError:
        return None
    keys = list(obj) if isinstance(obj, dict) else []
    if not keys or any(k not in schema.names for k in keys):
        return None
    item_sep = ", " if b', "' in first else ","
    key_sep = ": " if b'": ' in first else ":"
    return keys, item_sep, key_sep


def _block_pattern(keys, item_sep, key_sep, schema) -> str | None:
    values = [_value_pattern(schema.field(k).type, item_sep) for k in keys]
    if any(v is None for v in values):
        return None
    line = r"\{" + re.escape(item_sep).join(f'"{k}"' + re.escape(key_sep) + v for k, v in zip(keys, values)) + r"\}"
    return r"\A(?:" + line + r"\r?\n)*(?:" + line + r")?\z"


def _kind(typ: pa.DataType):
    """The scanner's kind of a value of Arrow type ``typ`` (None: a type it leaves to others)."""
    if pa.types.is_int64(typ):
        return "int"
    if pa.types.is_float64(typ):
        return "float"
    if pa.types.is_string(typ):
        return "string"
    if pa.types.is_list(typ) and pa.types.is_int64(typ.value_type):
        return "list"
    return None


def _bitmap(valid, n: int, nulls: int):
    """The validity buffer of ``n`` rows (None when no row is null)."""
    import numpy as np

    return pa.py_buffer(np.packbits(valid[:n], bitorder="little")) if nulls else None


def _scanned(data: bytes, keys: list, item_sep: str, key_sep: str, schema: pa.Schema) -> pa.Table | None:
    """The block's table from one typed scan (:mod:`aisim._core.tracescan`), or None: read it another way.

    The scanner takes a subset of what the pattern of :func:`_block_pattern` takes (numbers it converts
    exactly, no integer beyond int64) and, unlike the CSV split, strings holding a colon.
    """
    import numpy as np

    from aisim._core import tracescan

    kinds = [_kind(schema.field(k).type) for k in keys]
    if any(k is None for k in kinds) or len(keys) > tracescan.MAX_COLUMNS or len(data) >= 2**31 - 1:
        return None
    sep, colon = item_sep.encode(), key_sep.encode()
    lits = [(b"{" if i == 0 else sep) + b'"' + k.encode() + b'"' + colon for i, k in enumerate(keys)]
    shortest = sum(len(x) for x in lits) + len(keys) + 1  # every value at least one byte, then "}"
    cap = len(data) // shortest + 1
    codes = np.array([tracescan.KINDS[k] for k in kinds], np.int8)
    one_i, one_f = np.zeros(1, np.int64), np.zeros(1, np.float64)
    # List items: room for one per 8 bytes first (a trace's ids are longer), else for as many as could be.
    for item_cap in (len(data) // 8 + 16, len(data) // 2 + 1):
        arrays = []
        for kind in kinds:
            arrays.append((np.empty(cap, np.int64) if kind in ("int", "string") else one_i,
                           np.empty(cap, np.float64) if kind == "float" else one_f,
                           np.empty(cap, np.uint8), np.empty(cap + 1, np.int32),
                           np.empty(item_cap, np.int64) if kind == "list" else one_i))
        n, nulls, wide = tracescan.scan_lines(data, lits, codes, b"}", sep, arrays, cap, item_cap)
        if n != -2:  # -2: more list items than item_cap
            break
    if n < 0:
        return None
    out = {}
    for key, kind, (ints, floats, valid, offsets, items), nul, w in zip(keys, kinds, arrays, nulls, wide):
        typ = schema.field(key).type
        bitmap = _bitmap(valid, n, nul)
        if kind == "int":
            out[key] = pa.Array.from_buffers(typ, n, [bitmap, pa.py_buffer(ints[:n])], null_count=nul)
        elif kind == "float":
            out[key] = pa.Array.from_buffers(typ, n, [bitmap, pa.py_buffer(floats[:n])], null_count=nul)
        elif kind == "string":
            text = np.empty(int(offsets[n]), np.uint8)
            tracescan.gather_strings(data, ints[:n], offsets[:n + 1], text)
            col = pa.Array.from_buffers(typ, n, [bitmap, pa.py_buffer(offsets[:n + 1]), pa.py_buffer(text)],
                                        null_count=nul)
            if w:
                try:
                    col.validate(full=True)  # UTF-8, as the JSON reader checks it
                except pa.ArrowInvalid:
                    return None
            out[key] = col
        else:
            used = int(offsets[n])
            values = pa.Array.from_buffers(typ.value_type, used, [None, pa.py_buffer(items[:used])])
            out[key] = pa.Array.from_buffers(typ, n, [bitmap, pa.py_buffer(offsets[:n + 1])], null_count=nul,
                                             children=[values])
    arrays = [out[f.name] if f.name in out else pa.nulls(n, f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _matches(data: bytes, pattern: str) -> bool:
    import pyarrow.compute as pc

    offsets = pa.array([0, len(data)], pa.int64())
    whole = pa.LargeStringArray.from_buffers(1, offsets.buffers()[1], pa.py_buffer(data))
    return pc.match_substring_regex(whole, pattern)[0].as_py()


def _columns(data: bytes, types: list):
    """The text between the line's colons: ``k`` keys make ``k + 1`` columns, or None (a string holds a colon).

    ``types``: the Arrow type of each key's value; a string's column is read as (checked) UTF-8, the
    others as bytes (the pattern let only ASCII through there).
    """
    import pyarrow.csv as pcsv

    names = [f"c{j}" for j in range(len(types) + 1)]
    text = {names[j + 1]: pa.string() if pa.types.is_string(t) else pa.binary() for j, t in enumerate(types)}
    try:
        return pcsv.read_csv(
            pa.BufferReader(data),
            read_options=pcsv.ReadOptions(use_threads=False, column_names=names,
                                          block_size=max(len(data) + 1, 1 << 20)),
            parse_options=pcsv.ParseOptions(delimiter=":", quote_char=False, double_quote=False, escape_char=False,
                                            newlines_in_values=False, ignore_empty_lines=False),
            convert_options=pcsv.ConvertOptions(column_types=text, include_columns=names[1:],
                                                strings_can_be_null=False, check_utf8=True))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _convert(col: pa.Array, typ: pa.DataType, lead: int, tail: int, item_sep: str, null_seen: bool) -> pa.Array:
    """A value column's text (checked by the pattern) as ``typ``: ``lead`` and ``tail`` characters cut off.

    ``null_seen``: whether the block holds ``null`` at all (else no value is null).
    """
    import numpy as np
    import pyarrow.compute as pc

    # A value is null iff it starts with "n" (a number starts with "-" or a digit, a string with '"', a list
    # with "["); the cuts are ASCII (the pattern's separators, quotes and brackets): cut as bytes, still UTF-8.
    raw = col.view(pa.binary())
    is_null = pc.starts_with(raw, " " * lead + "n") if null_seen else None
    nulls = is_null.true_count if null_seen else 0
    if pa.types.is_int64(typ) or pa.types.is_float64(typ):
        col = pc.binary_slice(raw, lead, -tail).view(pa.string())
        if not nulls:
            return col.cast(typ)
        return pc.if_else(is_null, pa.scalar(None, typ), pc.if_else(is_null, "0", col).cast(typ))
    inner = pc.binary_slice(raw, lead + 1, -tail - 1).view(pa.string())  # inside the quotes, or the brackets
    if pa.types.is_string(typ):
        return pc.if_else(is_null, pa.scalar(None, pa.string()), inner) if nulls else inner
    none = pc.or_(is_null, pc.equal(inner, "")) if nulls else pc.equal(inner, "")
    parts = pc.split_pattern(inner, item_sep)
    if none.true_count:
        lens = np.where(none.to_numpy(zero_copy_only=False), 0,
                        pc.list_value_length(parts).to_numpy(zero_copy_only=False)).astype(np.int32)
        offsets = np.zeros(len(lens) + 1, dtype=np.int32)
        np.cumsum(lens, out=offsets[1:])
        values = pc.list_flatten(pc.filter(parts, pc.invert(none))).cast(pa.int64())
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, mask=is_null if nulls else None)
    return pa.ListArray.from_arrays(parts.offsets, parts.values.cast(pa.int64()))


def read_uniform(data: bytes, schema: pa.Schema) -> pa.Table | None:
    """``data``'s lines as ``schema``'s columns when all lines share one shape (see the module docstring).

    Parameters
    ----------
    data : bytes
        Whole lines (``\\n`` or ``\\r\\n``), no blank ones.
    schema : pyarrow.Schema
        The fields to read (int64, float64, string, list<int64>); a field
        no line has is all null, as ``pyarrow.json`` with this explicit
        schema gives it.

    Returns
    -------
    pyarrow.Table or None
        The table, one row per line of ``data`` in order (every line was
        checked, so none is blank), or None when a line differs from the first line's shape,
        has a key outside ``schema`` or a value this reader does not
        convert exactly as ``pyarrow.json`` does (or an integer beyond int64).
    """
    shape = _shape(data, schema)
    if shape is None:
        return None
    keys, item_sep, key_sep = shape
    table = _scanned(data, keys, item_sep, key_sep, schema)
    if table is not None:
        return table
    pattern = _block_pattern(keys, item_sep, key_sep, schema)
    if pattern is None or not _matches(data, pattern):
        return None
    cols = _columns(data, [schema.field(k).type for k in keys])
    if cols is None:
        return None
    n = cols.num_rows
    null_seen = b"null" in data
    out = {}
    for i, key in enumerate(keys):
        # Column i + 1 holds keys[i]'s value after the key separator's colon, then the item separator and the
        # next key in quotes, or the closing brace.
        tail = len(item_sep) + len(keys[i + 1]) + 2 if i + 1 < len(keys) else 1
        col = cols.column(i)
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()  # one chunk: the block is one CSV block
        try:
            out[key] = _convert(col, schema.field(key).type, len(key_sep) - 1, tail, item_sep, null_seen)
        except pa.ArrowInvalid:  # an integer beyond int64: the JSON reader refuses it too, the line path reads it
            return None
    arrays = [out[f.name] if f.name in out else pa.nulls(n, f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)
