"""Reader of the Azure LLM inference traces (Azure/AzurePublicDataset, 2023 and 2024 CSVs).

A header line, then one request a line: ``TIMESTAMP`` (wall clock, e.g.
``2023-11-16 18:17:03.9799600``; any number of fractional digits, an optional
``+00:00``/``Z`` offset), ``ContextTokens`` (prompt) and ``GeneratedTokens``
(output), both at least 1.  Other columns are ignored.  The traces carry no
prefix information, so every prompt is one private token stream.

``arrival_s`` counts from the earliest timestamp; ``request_id`` is
``<file stem>:<line>``; ``model`` is the ``model`` option.  The file is read
in blocks (:mod:`aisim.traces.blockread`): ``pyarrow.csv`` parses a block and
its columns are checked at once; a block it refuses, or with a value a check
finds wrong, is read row by row with :mod:`csv`.  A bad row raises
:class:`TraceError` naming ``file:line`` and the column, or with
``skip_bad_rows=True`` is counted (metadata ``bad_rows``).
"""

from __future__ import annotations

import csv
import io
import os
import re
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa

from aisim.errors import TraceError
from aisim.textin import check_decoded
from aisim.traces.blockread import BadLine, Bad, Parsed, Resolved, arrow_pays, no_requests, read_blocks, segments_array, \
    trace_rows
from aisim.traces.blocks import line_numbers, plain_lines
from aisim.traces.common import file_stem, open_text
from aisim.traces.schema import stream_id

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

_TS = re.compile(r"^\s*(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:\.(\d+))?\s*(Z|[+-]\d\d:?\d\d)?\s*$")
# What the Arrow path reads itself (anything else goes row by row): a plain UTC time.
_FAST_TS = (r"^(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d) (?P<h>[01]\d|2[0-3]):(?P<mi>[0-5]\d):(?P<s>[0-5]\d)"
            r"(?:\.(?P<f>\d+))?$")
_FAST_COUNT = r"^[0-9]{1,10}$"


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
    return read_blocks(os.fspath(path), AzureFormat(model=model, skip_bad_rows=skip_bad_rows))


class AzureFormat:
    """The Azure CSV as a block format (see :mod:`aisim.traces.blockread`).

    Every block reads the file's header (its first line); block 0 checks it.
    Rows keep their timestamp as whole seconds and nanoseconds (``ts_s``,
    ``ts_ns``) until :meth:`finish` counts them from the earliest one.
    """

    name = "azure"

    def __init__(self, *, model: str | None = None, skip_bad_rows: bool = False):
        self.model = model
        self.skip = bool(skip_bad_rows)
        self._header = None

    def header(self, path: str):
        """``(names, idx, error)``: the header's cleaned names, the positions of :data:`COLUMNS`, or the error."""
        if self._header is None:
            with open_text(path) as fh:
                reader = csv.reader(fh)
                try:
                    head = next(reader)
                except StopIteration:
                    self._header = (None, None, f"{path}: empty file, expected a header with {', '.join(COLUMNS)}")
                    return self._header
                except csv.Error as exc:
                    self._header = (None, None, f"{path}:1: not valid CSV ({exc})")
                    return self._header
            try:
                head = [check_decoded(h, f"{path}:1", TraceError).strip().lstrip("\ufeff") for h in head]
            except TraceError as exc:
                self._header = (None, None, str(exc))
                return self._header
            for col in COLUMNS:
                if col not in head:
                    self._header = (None, None, f"{path}:1: missing column '{col}' (header: {', '.join(head)})")
                    return self._header
            self._header = (head, [head.index(c) for c in COLUMNS], None)
        return self._header

    # ------------------------------------------------------------------ parse

    def parse(self, path: str, data: bytes, first_line: int, carry=None) -> Parsed:
        """One block's good rows and bad lines (the header line, in block 0, is skipped)."""
        names, idx, error = self.header(path)
        if error is not None:
            return Parsed(_empty(), [], {"header_error": error})
        if first_line == 1:  # the block that holds the header: drop that line
            cut = _after_first_record(data)
            data, first_line = data[cut:], 2
        fast = self._fast(path, data, first_line, names, idx) if arrow_pays(data) else None
        return fast if fast is not None else self._slow(path, data, first_line, idx)

    def _fast(self, path, data, first_line, names, idx):
        import pyarrow.compute as pc
        import pyarrow.csv as pcsv

        if not data.strip():
            return Parsed(_empty(), [], {})
        if len(set(names)) != len(names) or not plain_lines(data) or b'"' in data:
            return None
        try:
            table = pcsv.read_csv(
                io.BytesIO(data),
                read_options=pcsv.ReadOptions(column_names=[f"c{i}" for i in range(len(names))], use_threads=False,
                                              block_size=max(1 << 20, len(data) + 1)),
                parse_options=pcsv.ParseOptions(newlines_in_values=False),
                convert_options=pcsv.ConvertOptions(include_columns=[f"c{i}" for i in idx],
                                                    column_types={f"c{i}": pa.string() for i in idx},
                                                    strings_can_be_null=False))
        except (pa.ArrowException, UnicodeDecodeError, ValueError):
            return None
        n = table.num_rows
        line = line_numbers(data, first_line, n)
        if line is None:
            return None
        ts, ctx, gen = (table.column(f"c{i}").combine_chunks() for i in idx)
        for col in (ctx, gen):
            if not pc.all(pc.match_substring_regex(col, _FAST_COUNT)).as_py():
                return None
        prompt = ctx.cast(pa.int64()).to_numpy()
        out = gen.cast(pa.int64()).to_numpy()
        if (prompt < 1).any() or (out < 1).any() or (prompt >= 2**31).any() or (out >= 2**31).any():
            return None
        if not pc.all(pc.match_substring_regex(ts, _FAST_TS)).as_py():
            return None
        parts = pc.extract_regex(ts, _FAST_TS)
        try:
            days = np.array(pc.binary_join_element_wise(parts.field("y"), parts.field("mo"), parts.field("d"),
                                                        "-").to_numpy(zero_copy_only=False), dtype="datetime64[D]")
        except ValueError:
            return None  # a day the calendar has not: row by row
        hms = [parts.field(k).cast(pa.int64()).to_numpy() for k in ("h", "mi", "s")]
        seconds = days.astype(np.int64) * 86400 + hms[0] * 3600 + hms[1] * 60 + hms[2]
        frac = parts.field("f")
        frac = pc.utf8_rpad(pc.utf8_slice_codeunits(frac, 0, 9), 9, "0")
        ns = pc.if_else(pc.equal(frac, ""), pa.scalar("000000000"), frac).cast(pa.int64()).to_numpy()
        rid = pc.binary_join_element_wise(pa.scalar(f"{file_stem(path)}:"), pa.array(line).cast(pa.string()), "")
        own = np.fromiter((stream_id("prompt", r) for r in rid.to_pylist()), dtype=np.uint64, count=n)
        offsets = np.arange(n + 1, dtype=np.int32)
        cols = {"model": pa.array([self.model] * n, pa.string()), "request_id": rid,
                "prompt_tokens": pa.array(prompt, pa.int32()), "output_tokens": pa.array(out, pa.int32()),
                "priority": pa.array(np.zeros(n, np.int32)),
                "segments": segments_array(offsets, own, np.zeros(n, np.int64), prompt.astype(np.int64)),
                "line": pa.array(line, pa.int64())}
        rows = trace_rows(cols, n)
        rows = rows.append_column("ts_s", pa.array(seconds, pa.int64()))
        return Parsed(rows.append_column("ts_ns", pa.array(ns, pa.int64())), [], {})

    def _slow(self, path, data, first_line, idx):
        """The block row by row with :mod:`csv` (its line numbers counted from ``first_line``)."""
        stem = file_stem(path)
        good, bad = [], []
        reader = csv.reader(io.StringIO(data.decode("utf-8", errors="surrogateescape"), newline=""))
        while True:
            try:
                rec = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                bad.append(BadLine(first_line - 1 + reader.line_num, "",
                                   f"{path}:{first_line - 1 + reader.line_num}: not valid CSV ({exc})"))
                if not self.skip:
                    break
                continue
            lineno = first_line - 1 + reader.line_num
            if not rec or all(not c.strip() for c in rec):
                continue
            try:
                stamp, prompt, out = _row(rec, idx, f"{path}:{lineno}")
            except TraceError as exc:
                bad.append(BadLine(lineno, "", str(exc)))
                if not self.skip:
                    break
                continue
            good.append((lineno, stamp, prompt, out))
        n = len(good)
        rids = [f"{stem}:{g[0]}" for g in good]
        prompt = np.array([g[2] for g in good], dtype=np.int64)
        cols = {"model": pa.array([self.model] * n, pa.string()), "request_id": pa.array(rids, pa.string()),
                "prompt_tokens": pa.array(prompt, pa.int32()),
                "output_tokens": pa.array([g[3] for g in good], pa.int32()),
                "priority": pa.array(np.zeros(n, np.int32)),
                "segments": segments_array(np.arange(n + 1, dtype=np.int32),
                                           np.fromiter((stream_id("prompt", r) for r in rids), np.uint64, n),
                                           np.zeros(n, np.int64), prompt),
                "line": pa.array([g[0] for g in good], pa.int64())}
        rows = trace_rows(cols, n)
        rows = rows.append_column("ts_s", pa.array([g[1][0] for g in good], pa.int64()))
        return Parsed(rows.append_column("ts_ns", pa.array([g[1][1] for g in good], pa.int64())), bad, {})

    # ------------------------------------------------------------------ resolve

    def resolve(self, path: str, blocks, reparse, emit) -> Resolved:
        """Counts, the first bad row and the earliest timestamp (rows depend on no other row)."""
        bad = Bad(self.skip)
        total = 0
        t0 = None
        for k in range(len(blocks)):
            p = blocks[k]
            if p.info.get("header_error"):
                raise TraceError(p.info["header_error"])
            for b in p.bad:
                bad.add(b.message)
            rows = p.rows
            if rows.num_rows:
                s = rows.column("ts_s").to_numpy()
                ns = rows.column("ts_ns").to_numpy()
                i = np.lexsort((ns, s))[0]
                first = (int(s[i]), int(ns[i]))
                t0 = first if t0 is None or first < t0 else t0
            total += rows.num_rows
            emit(k, rows)
        if total == 0:
            raise no_requests(path, bad, "rows")
        return Resolved({"clock": "time", "t0": t0}, rows=total, bad_rows=bad.count, first_bad=bad.first)

    def finish(self, table: pa.Table, info: dict) -> pa.Table:
        from aisim.traces.blockread import sort_by_arrival

        s0, n0 = info["t0"]
        s = table.column("ts_s").to_numpy()
        ns = table.column("ts_ns").to_numpy()
        arrival = (s - s0).astype(np.float64) + (ns - n0) / 1e9
        table = table.set_column(table.schema.get_field_index("arrival_s"), "arrival_s", pa.array(arrival))
        return sort_by_arrival(table.drop_columns(["ts_s", "ts_ns"]), "time")


def _after_first_record(data: bytes) -> int:
    """Bytes of ``data``'s first CSV record (the header), its line break included."""
    reader = csv.reader(io.StringIO(data.decode("utf-8", errors="surrogateescape"), newline=""))
    try:
        next(reader)
    except (StopIteration, csv.Error):
        return len(data)
    text = data.decode("utf-8", errors="surrogateescape")
    lines = io.StringIO(text, newline="").readlines()[:reader.line_num]
    return len("".join(lines).encode("utf-8", errors="surrogateescape"))


def _empty() -> pa.Table:
    rows = trace_rows({"line": []}, 0)
    rows = rows.append_column("ts_s", pa.array([], pa.int64()))
    return rows.append_column("ts_ns", pa.array([], pa.int64()))


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
