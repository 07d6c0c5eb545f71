"""Reader of the Azure LLM inference traces (Azure/AzurePublicDataset, 2023 and 2024 CSVs).

A header line, then one request a line: ``TIMESTAMP`` (wall clock, e.g.
``2023-11-16 18:17:03.9799600``; any number of fractional digits, an optional
``+00:00``/``Z`` offset), ``ContextTokens`` (prompt) and ``GeneratedTokens``
(output), both at least 1.  Other columns are ignored.  The traces carry no
prefix information, so every prompt is one private token stream.

``arrival_s`` counts from the earliest timestamp; ``request_id`` is
``<file stem>:<line>``; ``model`` is the ``model`` option.  The file is read
row by row with :mod:`csv`; a bad row raises :class:`TraceError` naming
``file:line`` and the column, or with ``skip_bad_rows=True`` is counted
(metadata ``bad_rows``).
"""

from __future__ import annotations

import csv
import os
import re
from datetime import datetime, timezone

from aisim.errors import TraceError
from aisim.textin import check_decoded
from aisim.traces.common import BadRows, file_stem, finish, new_rows, open_text
from aisim.traces.schema import stream_id, trace_table

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

_TS = re.compile(r"^\s*(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:\.(\d+))?\s*(Z|[+-]\d\d:?\d\d)?\s*$")


def parse_timestamp(text: str) -> tuple[int, int]:
    """Whole seconds since the epoch and nanoseconds of an Azure ``TIMESTAMP``.

    A timestamp without an offset is taken as UTC; only differences matter.

    Raises
    ------
    ValueError
        Not of the form ``YYYY-MM-DD HH:MM:SS[.fraction][offset]``.
    """
    m = _TS.match(text)
    if not m:
        raise ValueError(text)
    base, frac, tz = m.groups()
    if tz in (None, "Z"):
        tz = "+00:00"
    dt = datetime.fromisoformat(base.replace(" ", "T") + tz)
    if dt.tzinfo is None:  # pragma: no cover - the offset is always present above
        dt = dt.replace(tzinfo=timezone.utc)
    ns = int((frac or "0")[:9].ljust(9, "0"))
    return int(dt.timestamp()), ns


def read_azure(path: str | os.PathLike, *, model: str | None = None, skip_bad_rows: bool = False):
    """Read an Azure LLM inference CSV into the trace table (clock ``time``).

    Parameters
    ----------
    path : path-like
        The CSV file.
    model : str, optional
        Model of every request.
    skip_bad_rows : bool
        Skip and count bad rows instead of raising.

    Returns
    -------
    pyarrow.Table
        Rows in arrival order; metadata ``clock=time``, ``format=azure`` and ``bad_rows``.

    Raises
    ------
    TraceError
        A missing column or a malformed row, naming ``file:line`` and the column.
    """
    path = os.fspath(path)
    stem = file_stem(path)
    rows = new_rows()
    stamps = []
    bad = BadRows(skip_bad_rows)
    with open_text(path) as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise TraceError(f"{path}: empty file, expected a header with {', '.join(COLUMNS)}") from None
        except csv.Error as exc:
            raise TraceError(f"{path}:1: not valid CSV ({exc})") from None
        header = [check_decoded(h, f"{path}:1", TraceError).strip().lstrip("\ufeff") for h in header]
        for col in COLUMNS:
            if col not in header:
                raise TraceError(f"{path}:1: missing column '{col}' (header: {', '.join(header)})")
        idx = [header.index(c) for c in COLUMNS]
        while True:
            try:
                rec = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                bad.record(TraceError(f"{path}:{reader.line_num}: not valid CSV ({exc})"))
                continue
            lineno = reader.line_num
            if not rec or all(not c.strip() for c in rec):
                continue
            try:
                stamp, prompt, out = _row(rec, idx, f"{path}:{lineno}")
            except TraceError as exc:
                bad.record(exc)
                continue
            rid = f"{stem}:{lineno}"
            stamps.append(stamp)
            rows["model"].append(model)
            rows["request_id"].append(rid)
            rows["arrival_step"].append(None)
            rows["prompt_tokens"].append(prompt)
            rows["output_tokens"].append(out)
            rows["priority"].append(0)
            rows["segments"].append([(stream_id("prompt", rid), 0, prompt)])
    if not stamps:
        raise TraceError(f"{path}: the trace has no requests" + (f" ({bad.count} bad rows skipped)"
                                                                  if bad.count else ""))
    s0, n0 = min(stamps)
    rows["arrival_s"] = [(s - s0) + (n - n0) / 1e9 for s, n in stamps]
    n = len(stamps)
    rows["session_id"] = [None] * n
    rows["turn"] = [0] * n
    return finish(trace_table(rows, "time"), "azure", bad)


def _row(rec, idx, where):
    for name, i in zip(COLUMNS, idx):
        if i >= len(rec):
            raise TraceError(f"{where}: field '{name}' is missing (the row has {len(rec)} columns)")
    for name, i in zip(COLUMNS, idx):
        check_decoded(rec[i], f"{where}: field '{name}'", TraceError)
    ts, ctx, gen = (rec[i].strip() for i in idx)
    try:
        stamp = parse_timestamp(ts)
    except (ValueError, OverflowError):
        raise TraceError(f"{where}: field 'TIMESTAMP' must be a date and time like "
                         f"'2023-11-16 18:17:03.97996', got {ts!r}") from None
    return stamp, _count(ctx, "ContextTokens", where), _count(gen, "GeneratedTokens", where)


def _count(text, name, where):
    try:
        v = int(text)
    except ValueError:
        raise TraceError(f"{where}: field '{name}' must be an integer, got {text!r}") from None
    if v < 1:
        raise TraceError(f"{where}: field '{name}' must be at least 1, got {v}")
    if v >= 2**31:
        raise TraceError(f"{where}: field '{name}' must be below 2**31, got {v}")
    return v
