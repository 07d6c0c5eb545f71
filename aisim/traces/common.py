"""Helpers shared by the trace readers: field checks, bad-row bookkeeping, table metadata.

Every reader either raises :class:`~aisim.errors.TraceError` on the first bad
row (the message names ``file:line``, and the field) or, with
``skip_bad_rows=True``, skips bad rows and counts them.  The count lands in
the table's schema metadata (``bad_rows``, plus ``first_bad_row``: the message
of the first one) and is read back with :func:`bad_rows`; nothing is printed
and no warning is issued.
"""

from __future__ import annotations

import json
import math
import os

import pyarrow as pa

from aisim.errors import TraceError
from aisim.textin import check_decoded, loads_json

# The per-request columns a reader fills (model, session_id and turn too).
ROW_COLUMNS = ("model", "request_id", "session_id", "turn", "arrival_step", "arrival_s",
               "prompt_tokens", "output_tokens", "priority", "segments")


def new_rows() -> dict:
    """Empty column lists for :func:`aisim.traces.schema.trace_table`."""
    return {k: [] for k in ROW_COLUMNS}


def json_object(line: str, where: str) -> dict:
    """One JSON-lines row as a dict; errors name ``where`` (``file:line``).

    ``line`` comes from :func:`open_text`: a byte that is not UTF-8 and a key
    given twice make the row bad, like any other fault.
    """
    line = check_decoded(line, where, TraceError)
    try:
        obj = loads_json(line, where, TraceError)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object")
    return obj


# The trace table stores token counts, turns and priorities as int32 (aisim.traces.schema).
INT32_LIMIT = 2**31


def int_field(obj: dict, key: str, where: str, low: int = 0, default=None, high: int = INT32_LIMIT) -> int:
    """``obj[key]`` as an integer from ``low`` up to below ``high``, or ``default`` when absent.

    Raises
    ------
    TraceError
        Missing (without a default), not an integer, below ``low`` or not below ``high``.
    """
    if key not in obj or obj[key] is None:
        if default is not None:
            return default
        raise TraceError(f"{where}: missing field '{key}'")
    v = obj[key]
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceError(f"{where}: field '{key}' must be an integer, got {v!r}")
    if v < low:
        raise TraceError(f"{where}: field '{key}' must be at least {low}, got {v}")
    if v >= high:
        raise TraceError(f"{where}: field '{key}' must be below {high}, got {v}")
    return v


def number_field(obj: dict, key: str, where: str, low: float | None = None, default=None) -> float:
    """``obj[key]`` as a finite float (at least ``low`` when given), or ``default`` when absent."""
    if key not in obj or obj[key] is None:
        if default is not None:
            return default
        raise TraceError(f"{where}: missing field '{key}'")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TraceError(f"{where}: field '{key}' must be a finite number, got {v!r}")
    if low is not None and v < low:
        raise TraceError(f"{where}: field '{key}' must be at least {low}, got {v}")
    return float(v)


def id_field(obj: dict, key: str, where: str):
    """``obj[key]`` as a non-empty string id (integers are accepted), or None when absent."""
    if key not in obj or obj[key] is None:
        return None
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (str, int)) or v == "":
        raise TraceError(f"{where}: field '{key}' must be a non-empty string or an integer, got {v!r}")
    return str(v)


def hash_id_list(obj: dict, key: str, where: str) -> list:
    """``obj[key]`` as a list of non-negative integers (empty when absent)."""
    v = obj.get(key)
    if v is None:
        return []
    if not isinstance(v, list):
        raise TraceError(f"{where}: field '{key}' must be a list of integers")
    for i, u in enumerate(v):
        if isinstance(u, bool) or not isinstance(u, int) or u < 0:
            raise TraceError(f"{where}: field '{key}' item {i} must be a non-negative integer, got {u!r}")
    return v


def check_option(name: str, value, low=1) -> None:
    """Reject a reader option that is not an integer of at least ``low``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TraceError(f"option '{name}' must be an integer of at least {low}, got {value!r}")


class BadRows:
    """Raise on a bad row, or count it when ``skip`` is on.

    Use as ``except TraceError as exc: bad.record(exc)``.
    """

    def __init__(self, skip: bool):
        self.skip = bool(skip)
        self.count = 0
        self.first = None

    def record(self, exc: TraceError) -> None:
        """Re-raise ``exc`` unless skipping; otherwise count it."""
        if not self.skip:
            raise exc
        self.count += 1
        if self.first is None:
            self.first = str(exc)


def open_text(path: str):
    """Open a text file for streaming, turning OS errors into :class:`TraceError`.

    Bytes that are not UTF-8 are kept as surrogates (``surrogateescape``) so
    that only their line is bad: every reader passes its lines or fields
    through :func:`aisim.textin.check_decoded` (:func:`json_object` does).
    """
    try:
        return open(path, encoding="utf-8", errors="surrogateescape", newline="")
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None


def file_stem(path: str) -> str:
    """The file name without directory and extension (a stable request-id prefix)."""
    name = os.path.basename(path.rstrip("/"))
    return name.split(".", 1)[0] or name


def finish(table: pa.Table, fmt: str, bad: BadRows, unit_tokens: int | None = None) -> pa.Table:
    """Add the reader's metadata: ``format``, ``unit_tokens``, ``bad_rows``, ``first_bad_row``."""
    meta = dict(table.schema.metadata or {})
    meta[b"format"] = fmt.encode()
    meta[b"bad_rows"] = str(bad.count).encode()
    if bad.first is not None:
        meta[b"first_bad_row"] = bad.first.encode()
    if unit_tokens is not None:
        meta[b"unit_tokens"] = str(unit_tokens).encode()
    return table.replace_schema_metadata(meta)


def bad_rows(table: pa.Table) -> int:
    """How many bad rows a reader skipped to build ``table`` (0 when none or unknown).

    Parameters
    ----------
    table : pyarrow.Table
        A trace table returned by a reader with ``skip_bad_rows=True``.

    Returns
    -------
    int
        The ``bad_rows`` schema metadata; the first skipped row's message is in
        ``first_bad_row``.
    """
    raw = (table.schema.metadata or {}).get(b"bad_rows")
    return int(raw) if raw else 0


def table_meta(table: pa.Table, key: str):
    """One schema-metadata value of ``table`` as a string (None when absent)."""
    raw = (table.schema.metadata or {}).get(key.encode())
    return raw.decode() if raw is not None else None


def unit_segments(hash_ids: list, total: int, unit: int, place, private_stream: int, where: str,
                  key: str = "hash_ids", partial_ok: bool = True) -> list:
    """Segments of ``total`` tokens described by ``hash_ids`` at ``unit`` tokens per id.

    ``place(u)`` gives ``(stream, first)``: id ``u`` at position ``i`` covers
    ``min(unit, total - i * unit)`` tokens of that stream from ``first``.
    Tokens beyond the ids (a trace that gives ids for full blocks only) are
    the private stream from their offset on.

    Raises
    ------
    TraceError
        More ids than blocks, or (``partial_ok`` false) too few ids for the
        blocks of the prompt.
    """
    blocks = -(-total // unit)
    if len(hash_ids) > blocks:
        raise TraceError(
            f"{where}: field '{key}' has {len(hash_ids)} ids but {total} tokens make only {blocks} "
            f"blocks of {unit} tokens (wrong unit size?)"
        )
    if not partial_ok and hash_ids and len(hash_ids) < blocks:
        raise TraceError(
            f"{where}: field '{key}' has {len(hash_ids)} ids but {total} tokens make {blocks} "
            f"blocks of {unit} tokens (wrong unit size?)"
        )
    segs = []
    for i, u in enumerate(hash_ids):
        stream, first = place(u)
        segs.append((stream, first, min(unit, total - i * unit)))
    covered = min(len(hash_ids) * unit, total)
    if covered < total:
        segs.append((private_stream, covered, total - covered))
    return segs


def drop_prefix(segments: list, n: int) -> list:
    """``segments`` without their first ``n`` tokens."""
    out = []
    for stream, first, length in segments:
        if n >= length:
            n -= length
            continue
        out.append((stream, first + n, length - n))
        n = 0
    return out
