"""Block readers: a trace read as independent blocks, then put in order by one sequential pass.

Reading a file has three steps, each a plain function of plain data so that
the pipeline can run them as separate tasks (:mod:`aisim.pipeline.reads`)
and :func:`read_blocks` can run them in one process:

1. **parse** every block on its own (:mod:`aisim.traces.blocks` cuts the
   file; the format's ``parse`` reads the block with Arrow's C++ reader and
   checks every column at once, or line by line when that fails): the
   block's good rows, each with its ``line``, and its bad lines
   (:class:`BadLine`, with their text);
2. **resolve** the blocks in file order (the format's ``resolve``): what a
   line means may depend on earlier lines (a request id used before, the
   trace's clock, a session's previous turn, the earliest timestamp), so one
   pass over the blocks, holding only what later lines can refer to, makes
   every block's rows final and counts the bad ones;
3. **route** each resolved block (the format's ``finish``): arrivals
   relative to the trace's start, the helper columns dropped, the rows sorted
   stably by arrival.

A file's rows are then the blocks' rows merged by (arrival, line): the
whole-file readers' stable sort by arrival.  The result does not depend on
the block size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from aisim.arrowwrap import arrow_array
from aisim.errors import TraceError
from aisim.traces.blocks import block_ranges, block_text, block_texts, file_size
from aisim.traces import TRACE_FORMATS
from aisim.traces.schema import SEGMENT_TYPE, TRACE_SCHEMA

# Bad lines as a table (what a parse task stages beside its rows).
# A text block shorter than this is read line by line: for a few lines, starting Arrow's readers and
# pyarrow.compute costs more than they save (a short replay's start-up is most of its time).
FAST_MIN_BYTES = 64 * 1024


def arrow_pays(data: bytes) -> bool:
    """Whether a text block is long enough for the Arrow path (:data:`FAST_MIN_BYTES`)."""
    return len(data) >= FAST_MIN_BYTES

BAD_SCHEMA = pa.schema([("line", pa.int64()), ("text", pa.binary()), ("message", pa.string()),
                        ("request_id", pa.string()), ("session_id", pa.string()), ("kind", pa.string())])


@dataclass
class BadLine:
    """A line a block's parse refused: its number, text, message, and what it named (if it could be read)."""

    line: int
    text: str
    message: str
    request_id: str | None = None
    session_id: str | None = None
    kind: str | None = None  # the clock it gives: "step" or "time"

    def __post_init__(self):
        # Ids are only for matching lines up; one holding a byte that is not UTF-8 matches nothing.
        self.request_id = _text_or_none(self.request_id)
        self.session_id = _text_or_none(self.session_id)


def _text_or_none(v):
    if v is None or v.isascii():
        return v
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return v


@dataclass
class Parsed:
    """One parsed block: good rows (format columns plus ``line``), bad lines, and what resolve needs."""

    rows: pa.Table
    bad: list = field(default_factory=list)
    info: dict = field(default_factory=dict)

    def bad_table(self) -> pa.Table:
        """The bad lines as a table; a line's text keeps its bytes (it may hold some that are not UTF-8)."""
        rows = [dict(b.__dict__, text=b.text.encode("utf-8", errors="surrogateescape")) for b in self.bad]
        return pa.Table.from_pylist(rows, schema=BAD_SCHEMA)

    @staticmethod
    def from_tables(rows: pa.Table, bad: pa.Table, info: dict) -> Parsed:
        lines = [BadLine(**dict(r, text=r["text"].decode("utf-8", errors="surrogateescape")))
                 for r in bad.to_pylist()]
        return Parsed(rows, lines, info)


@dataclass
class Resolved:
    """A file after its sequential pass: what routing its blocks needs, and its counts."""

    info: dict  # the format's: clock, start of time ...
    rows: int = 0
    bad_rows: int = 0
    first_bad: str | None = None
    meta: dict = field(default_factory=dict)  # schema metadata of the file's trace table


class Blocks:
    """A file's parsed blocks for its resolve pass, loaded one at a time (so a pass holds one block).

    Parameters
    ----------
    n : int
        Blocks.
    load : callable
        ``load(k)``: block ``k``'s :class:`Parsed`.
    ids : callable, optional
        ``ids(k)``: block ``k``'s request ids -- an Arrow array of its rows'
        and a list of its bad lines' -- without loading the rest.
    """

    def __init__(self, n: int, load, ids=None, info=None):
        self.n, self._load, self._ids, self._info = n, load, ids, info

    @staticmethod
    def of(parsed: list) -> Blocks:
        """Blocks already in memory."""
        return Blocks(len(parsed), parsed.__getitem__, info=lambda k: parsed[k].info)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> Parsed:
        return self._load(k)

    def ids(self, k: int):
        if self._ids is not None:
            return self._ids(k)
        p = self._load(k)
        rows = p.rows.column("request_id") if p.rows is not None else pa.array([], pa.string())
        return rows, [b.request_id for b in p.bad if b.request_id is not None]

    def line_ids(self) -> bool:
        """Whether every block's ids are known to be made from their line numbers (then no two are equal)."""
        return self._info is not None and all(self._info(k).get("line_ids") for k in range(self.n))


def ids_named_twice(blocks: Blocks) -> set:
    """Request ids that occur on more than one line of the file, good or bad.

    Holds 8 bytes a line: every id's 64-bit hash is sorted, and only the ids
    whose hashes meet are read again and counted for real.  A file whose ids
    all come from their line numbers (``info["line_ids"]`` of every block)
    has none.
    """
    from aisim.traces.schema import output_streams

    if blocks.line_ids():
        return set()

    def ids(k):
        rows, extra = blocks.ids(k)
        parts = [rows] if rows is not None and len(rows) else []
        if extra:
            parts.append(pa.array(extra, pa.string()))
        if not parts:
            return pa.array([], pa.string())
        return pa.concat_arrays([p.combine_chunks() if isinstance(p, pa.ChunkedArray) else p for p in parts])

    parts = [output_streams(ids(k)) for k in range(len(blocks))]
    if not parts:
        return set()
    h = np.sort(np.concatenate(parts))
    met = h[1:][h[1:] == h[:-1]]
    if met.size == 0:
        return set()
    met = np.unique(met)
    counts = {}
    for k in range(len(blocks)):
        these = ids(k)
        hit = np.flatnonzero(np.isin(output_streams(these), met))
        for v in these.take(pa.array(hit, pa.int64())).to_pylist():
            counts[v] = counts.get(v, 0) + 1
    return {v for v, c in counts.items() if c > 1}


class Bad:
    """Bad-line bookkeeping of one file: raise at the first (in line order), or count them."""

    def __init__(self, skip: bool):
        self.skip = skip
        self.count = 0
        self.first = None

    def add(self, message: str) -> None:
        if not self.skip:
            raise TraceError(message)
        self.count += 1
        if self.first is None:
            self.first = message


def segments_array(offsets: np.ndarray, stream: np.ndarray, first: np.ndarray, length: np.ndarray) -> pa.Array:
    """The ``segments`` column from flat arrays: row ``i`` is entries ``offsets[i]:offsets[i + 1]``."""
    values = pa.StructArray.from_arrays(
        [arrow_array(np.asarray(stream, np.uint64), pa.uint64()), arrow_array(np.asarray(first, np.int64), pa.int64()),
         arrow_array(np.asarray(length, np.int64), pa.int64())],
        fields=list(SEGMENT_TYPE))
    return pa.ListArray.from_arrays(arrow_array(np.asarray(offsets, np.int32), pa.int32()), values,
                                    type=pa.list_(SEGMENT_TYPE))


def trace_rows(cols: dict, n: int) -> pa.Table:
    """A block's rows as the trace table's columns plus ``line`` (missing optional columns filled)."""
    out = []
    for f in TRACE_SCHEMA:
        v = cols.get(f.name)
        if v is None:
            v = arrow_array(np.zeros(n, np.int32), pa.int32()) if f.name == "turn" else pa.nulls(n, f.type)
        elif not isinstance(v, (pa.Array, pa.ChunkedArray)):
            v = pa.array(v, f.type)
        elif v.type != f.type:
            v = v.cast(f.type)
        out.append(v)
    out.append(pa.array(cols["line"], pa.int64()) if not isinstance(cols["line"], pa.Array) else cols["line"])
    return pa.Table.from_arrays(out, schema=TRACE_SCHEMA.append(pa.field("line", pa.int64())))


def rows_from_dicts(rows: list, lines: list) -> pa.Table:
    """A block's rows from row dictionaries (the line-by-line path), as :func:`trace_rows`."""
    n = len(rows)
    cols = {f.name: [r.get(f.name) for r in rows] for f in TRACE_SCHEMA if f.name != "segments"}
    cols["turn"] = [r.get("turn") or 0 for r in rows]
    segs = [r["segments"] for r in rows]
    counts = np.fromiter((len(s) for s in segs), dtype=np.int64, count=n)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    flat = [x for s in segs for x in s]
    stream = np.fromiter((x[0] for x in flat), dtype=np.uint64, count=len(flat))
    first = np.fromiter((x[1] for x in flat), dtype=np.int64, count=len(flat))
    length = np.fromiter((x[2] for x in flat), dtype=np.int64, count=len(flat))
    cols["segments"] = segments_array(offsets, stream, first, length)
    cols["line"] = lines
    return trace_rows(cols, n)


def sort_by_arrival(table: pa.Table, clock: str) -> pa.Table:
    """Rows stably sorted by arrival (as float64, like the whole-file readers), ties in line order."""
    key = table.column("arrival_s" if clock == "time" else "arrival_step").to_numpy(zero_copy_only=False)
    key = key.astype(np.float64)
    if len(key) > 1 and np.any(np.diff(key) < 0):
        table = table.take(pa.array(np.argsort(key, kind="stable")))
    return table


def plan(path: str, block_bytes: int | None = None) -> list:
    """``[(start, end), ...]``: the blocks of ``path`` (see :func:`aisim.traces.blocks.block_ranges`)."""
    return block_ranges(file_size(path), block_bytes)


def read_blocks(path: str, fmt, block_bytes: int | None = None, keep_lines: bool = False) -> pa.Table:
    """Read ``path`` with the block format ``fmt``, every step in this process; the trace table.

    Parameters
    ----------
    path : str
    fmt : object
        A block format (``parse``, ``resolve``, ``finish``, see the module
        docstring), e.g. :class:`aisim.traces.oracle.OracleFormat`.
    block_bytes : int, optional
        Block size (default :data:`aisim.traces.blocks.BLOCK_BYTES`).
    keep_lines : bool
        Keep each row's ``line`` (1-based line of the file) as a last column.
    """
    ranges = plan(path, block_bytes)
    firsts = []
    parsed = []
    for data, first in block_texts(path, ranges):  # one pass over the file, each block parsed as it is read
        firsts.append(first)
        parsed.append(fmt.parse(path, data, first))
        del data
    resolved_blocks = [None] * len(ranges)

    def emit(k, table):
        resolved_blocks[k] = table

    def reparse(k, carry):
        a, b = ranges[k]
        return fmt.parse(path, block_text(path, a, b, 0)[0], firsts[k], carry=carry)

    res = fmt.resolve(path, Blocks.of(parsed), reparse, emit)
    tables = [fmt.finish(t, res.info) for t in resolved_blocks if t is not None and t.num_rows]
    clock = res.info["clock"]
    if tables:
        table = pa.concat_tables(tables)
        table = sort_by_arrival(table, clock)
        if not keep_lines:
            table = table.drop_columns(["line"])
    else:
        table = TRACE_SCHEMA.empty_table()
        if keep_lines:
            table = table.append_column("line", pa.array([], pa.int64()))
    meta = {b"clock": clock.encode(), b"format": fmt.name.encode(), b"bad_rows": str(res.bad_rows).encode()}
    if res.first_bad is not None:
        meta[b"first_bad_row"] = res.first_bad.encode()
    for k, v in res.meta.items():
        meta[k.encode()] = str(v).encode()
    return table.combine_chunks().replace_schema_metadata(meta)


def no_requests(path: str, bad: Bad, what: str = "lines") -> TraceError:
    return TraceError(f"{path}: the trace has no requests" + (f" ({bad.count} bad {what} skipped)"
                                                              if bad.count else ""))


# The formats read in blocks and cut into byte ranges (aisim.traces.TRACE_FORMATS; Parquet is cut
# into row groups).
TEXT_FORMATS = tuple(f.name for f in TRACE_FORMATS if f.block_reader is not None and f.text)


def block_format(name: str, options: dict):
    """The block format ``name`` with reader ``options`` (None for a format read whole, e.g. agentic).

    Raises
    ------
    TraceError
        An option value the reader refuses (its message names the option).
    """
    from importlib import import_module

    from aisim.traces import FORMAT_BY_NAME, READERS

    fmt = FORMAT_BY_NAME.get(name)
    # A reader replaced in READERS (a test's, a plug-in's) is read whole by it.
    if (fmt is None or fmt.block_reader is None
            or getattr(READERS.get(name), "__module__", None) != fmt.module):
        return None
    cls = getattr(import_module(fmt.module), fmt.block_reader)
    opts = {**options, **fmt.block_options}
    return cls(*(opts.pop(k, None) for k in fmt.positional), **opts)
