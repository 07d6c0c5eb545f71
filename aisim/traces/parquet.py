"""aisim's own trace files: a trace table stored with :mod:`pyarrow.parquet`.

:func:`write_trace` stores a table with its metadata (``clock``,
``unit_tokens``, ...); :func:`read_parquet` reads one back row group by row group and
validates it: every column of :data:`~aisim.traces.schema.TRACE_SCHEMA` with
its type (an integer or string column of another width is cast when lossless),
a ``clock`` (from the metadata, else from which arrival column is filled), and
per row a non-empty unique ``request_id``, the arrival of the clock (non-null,
non-negative), ``prompt_tokens`` and ``output_tokens`` of at least 1, a
non-negative ``turn`` and segments of positive length covering exactly the
prompt.  Errors name ``file:row`` (1-based row of the file) and the column.
Rows out of arrival order are sorted (stably).
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from aisim.errors import TraceError
from aisim.files import open_output
from aisim.traces.blockread import Parsed
from aisim.traces.schema import OPTIONAL_COLUMNS, TRACE_SCHEMA

BATCH_ROWS = 65536


_TEXT_SUFFIXES = (".jsonl", ".json", ".csv", ".txt")


def write_trace(table: pa.Table, path: str | os.PathLike, inputs: dict | None = None) -> None:
    """Store a trace table as Parquet (schema metadata included).

    Parameters
    ----------
    table : pyarrow.Table
        A trace table.
    path : path-like
        The ``.parquet`` file to write (its directory is created when missing), or a stream.
    inputs : dict, optional
        ``{label: path}`` of inputs ``path`` must not be (:func:`aisim.files.check_outputs`).
    """
    import pyarrow.parquet as pq

    path = os.fspath(path)
    # A text format's name on a Parquet file would mislead whoever opens it (the readers look at its
    # bytes, aisim.traces.guess_format, but people and other tools go by the name).
    if path.lower().endswith(_TEXT_SUFFIXES):
        raise TraceError(f"--out {path}: aisim writes traces as Parquet; name the file .parquet")
    try:
        # All or nothing: an interrupted write leaves no partial Parquet file.
        with open_output(path, "--out", inputs) as fh:
            pq.write_table(table, fh)
    except OSError as exc:
        raise TraceError(f"cannot write trace {path}: {exc}") from None


def read_parquet(path: str | os.PathLike, *, skip_bad_rows: bool = False):
    """Read and validate an aisim Parquet trace.

    Parameters
    ----------
    path : path-like
        The Parquet file.
    skip_bad_rows : bool
        Skip and count bad rows instead of raising.

    Returns
    -------
    pyarrow.Table
        The trace table in arrival order, with the file's metadata plus
        ``format=parquet`` and ``bad_rows``.

    Raises
    ------
    TraceError
        Not Parquet, a missing or mistyped column, or a bad row (``file:row: field ...``).
    """
    from aisim.traces.blockread import Blocks, sort_by_arrival

    path = os.fspath(path)
    fmt = ParquetFormat(skip_bad_rows=skip_bad_rows)
    groups = fmt.blocks(path)
    parsed = [fmt.parse_group(path, g) for g in groups]
    out = [None] * len(groups)

    def emit(k, table):
        out[k] = table

    res = fmt.resolve(path, Blocks.of(parsed), None, emit)
    table = pa.concat_tables([fmt.finish(t, res.info) for t in out]).combine_chunks()
    table = sort_by_arrival(table, res.info["clock"]).drop_columns(["line"])
    return table.replace_schema_metadata(fmt.metadata(res))


class ParquetFormat:
    """aisim's Parquet traces as a block format: one block per row group (see :mod:`aisim.traces.blockread`).

    A row group is validated on its own (:func:`_validate`); request ids
    used twice, across row groups too, are found by :meth:`resolve`.  The
    ``line`` of a row is its 1-based row in the file.
    """

    name = "parquet"

    def __init__(self, *, skip_bad_rows: bool = False):
        self.skip = bool(skip_bad_rows)
        self._file = None

    def _open(self, path):
        """``(ParquetFile, metadata, clock)`` of ``path``; a file-level fault raises, naming it."""
        import pyarrow.parquet as pq

        if self._file is None or self._file[0] != path:
            try:
                pf = pq.ParquetFile(path)
                schema = pf.schema_arrow
            except FileNotFoundError:
                raise TraceError(f"cannot read trace {path}: no such file") from None
            except (OSError, pa.ArrowException) as exc:
                raise TraceError(f"{path}: not a Parquet trace ({exc})") from None
            meta = dict(schema.metadata or {})
            meta.pop(b"ARROW:schema", None)
            _check_columns(path, schema)
            clock = meta.get(b"clock", b"").decode() or None
            if clock not in (None, "time", "step"):
                raise TraceError(f"{path}: metadata 'clock' must be 'time' or 'step', got {clock!r}")
            if clock is None and pf.metadata.num_rows:
                # As the whole-file reader: the first batch's arrivals tell the clock.
                first = next(pf.iter_batches(batch_size=BATCH_ROWS, columns=["arrival_s"]))
                clock = "time" if first.column(0).null_count < first.num_rows else "step"
            self._file = (path, pf, meta, clock)
        return self._file[1:]

    def blocks(self, path: str) -> list:
        """``[(row group, first row), ...]``: the blocks of the file (none for a file without rows)."""
        pf, _, _ = self._open(path)
        out, row = [], 0
        for g in range(pf.metadata.num_row_groups):
            out.append((g, row))
            row += pf.metadata.row_group(g).num_rows
        return out

    def parse_group(self, path: str, group) -> Parsed:
        """One row group's good rows (with their ``line``) and bad rows; ids used twice wait for resolve."""
        from aisim.traces.blockread import BadLine

        g, row0 = group
        try:
            pf, _, clock = self._open(path)
        except TraceError as exc:
            return Parsed(None, [], {"file_error": str(exc)})
        present = [f.name for f in TRACE_SCHEMA if pf.schema_arrow.get_field_index(f.name) >= 0]
        table = _cast(path, pf.read_row_group(g, columns=present))
        errors = []
        keep = _validate(path, table, clock or "step", row0, errors)
        ids = table.column("request_id").to_pylist()
        bad = [BadLine(row0 + i + 1, "", msg, ids[i] or None) for i, msg in errors]
        if not self.skip and bad:
            cut = bad[0].line - row0 - 1
            table, keep, bad = table.slice(0, cut), keep[:cut], bad[:1]
        table = table.filter(pa.array(keep)) if not keep.all() else table
        lines = np.flatnonzero(keep).astype(np.int64) + row0 + 1
        return Parsed(table.append_column("line", pa.array(lines, pa.int64())), bad, {})

    def resolve(self, path: str, blocks, reparse, emit):
        """Ids used twice (the first good row keeps it), in row order, and the counts."""
        from aisim.traces.blockread import Bad, Resolved, ids_named_twice

        bad = Bad(self.skip)
        if len(blocks) and blocks[0].info.get("file_error"):  # the same for every row group
            raise TraceError(blocks[0].info["file_error"])
        _, _, clock = self._open(path)
        twice = ids_named_twice(blocks)
        seen, total = {}, 0
        for k in range(len(blocks)):
            p = blocks[k]
            table = p.rows
            msgs = [(b.line, b.message) for b in p.bad]
            drop = None
            if twice:
                ids = table.column("request_id").to_pylist()
                line = table.column("line").to_numpy()
                for i in np.flatnonzero([r in twice for r in ids]):
                    r = ids[i]
                    if r in seen:
                        msgs.append((int(line[i]), f"{path}:{line[i]}: field 'request_id': '{r}' already used on "
                                                   f"row {seen[r]}"))
                        drop = np.zeros(table.num_rows, dtype=bool) if drop is None else drop
                        drop[i] = True
                    else:
                        seen[r] = int(line[i])
            for _, msg in sorted(msgs):
                bad.add(msg)
            if drop is not None:
                table = table.filter(pa.array(~drop))
            total += table.num_rows
            emit(k, table)
        if total == 0:
            raise TraceError(f"{path}: the trace has no requests"
                             + (f" ({bad.count} bad rows skipped)" if bad.count else ""))
        return Resolved({"clock": clock}, rows=total, bad_rows=bad.count, first_bad=bad.first)

    def finish(self, table: pa.Table, info: dict) -> pa.Table:
        from aisim.traces.blockread import sort_by_arrival

        return sort_by_arrival(table, info["clock"])

    def metadata(self, res) -> dict:
        """The trace table's schema metadata: the file's, with its clock and the reader's counts."""
        _, meta, _ = self._open(self._file[0])
        meta = dict(meta)
        meta[b"clock"] = res.info["clock"].encode()
        if meta.get(b"format", b"parquet") != b"parquet":
            meta[b"source_format"] = meta[b"format"]
        meta[b"format"] = b"parquet"
        meta[b"bad_rows"] = str(res.bad_rows).encode()
        if res.first_bad is not None:
            meta[b"first_bad_row"] = res.first_bad.encode()
        return meta


def _check_columns(path, schema):
    for field in TRACE_SCHEMA:
        idx = schema.get_field_index(field.name)
        if idx < 0:
            if field.name in OPTIONAL_COLUMNS:
                continue
            raise TraceError(f"{path}: missing column '{field.name}' ({field.type})")
        got = schema.field(idx).type
        if got == field.type:
            continue
        ok = (pa.types.is_integer(got) and pa.types.is_integer(field.type)) or \
             (pa.types.is_floating(got) and pa.types.is_floating(field.type)) or \
             (pa.types.is_string(field.type) and (pa.types.is_large_string(got) or pa.types.is_null(got))) or \
             (field.name == "segments" and _segments_like(got)) or \
             (field.name == "accept" and (pa.types.is_list(got) or pa.types.is_large_list(got))
              and pa.types.is_integer(got.value_type)) or \
             (pa.types.is_null(got) and field.name in ("model", "session_id", "arrival_step", "arrival_s"))
        if not ok:
            raise TraceError(f"{path}: column '{field.name}' must be {field.type}, got {got}")


def _segments_like(t) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_struct(t.value_type):
        return False
    names = {t.value_type.field(i).name: t.value_type.field(i).type for i in range(t.value_type.num_fields)}
    return all(k in names and pa.types.is_integer(names[k]) for k in ("stream", "first", "length"))


def _cast(path, table: pa.Table) -> pa.Table:
    if table.schema.remove_metadata() == TRACE_SCHEMA:
        return table
    cols = []
    for field in TRACE_SCHEMA:
        if field.name not in table.column_names:  # an optional column the file leaves out
            cols.append(pa.nulls(table.num_rows, field.type))
            continue
        col = table.column(field.name)
        try:
            cols.append(col.cast(field.type, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise TraceError(f"{path}: column '{field.name}' cannot be read as {field.type} ({exc})") from None
    return pa.Table.from_arrays(cols, schema=TRACE_SCHEMA)


def _validate(path, batch: pa.Table, clock: str, row0: int, errors: list) -> np.ndarray:
    """Check every row of ``batch`` on its own; returns the mask of good rows and appends ``(row, message)``
    of the others to ``errors`` (ids used twice are :meth:`ParquetFormat.resolve`'s)."""
    import pyarrow.compute as pc

    n = batch.num_rows

    def col(name, fill):
        return batch.column(name).fill_null(fill).to_numpy(zero_copy_only=False)

    arrival = batch.column("arrival_s" if clock == "time" else "arrival_step")
    arr_null = arrival.is_null().to_numpy(zero_copy_only=False)
    arr = arrival.fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64)
    prompt = col("prompt_tokens", 0).astype(np.int64)
    out = col("output_tokens", 0).astype(np.int64)
    turn = col("turn", 0)
    seg = batch.column("segments").combine_chunks()
    seg_null = seg.is_null().to_numpy(zero_copy_only=False)
    # offsets index the whole child array (a slice keeps its parent's values)
    offsets = seg.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    starts, ends = offsets[:-1], offsets[1:]
    lengths = pc.struct_field(seg.values, "length").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(lengths)])
    covered = cum[ends] - cum[starts]
    nonpos_cum = np.concatenate([[0], np.cumsum(lengths <= 0)])
    nonpos = (nonpos_cum[ends] - nonpos_cum[starts]) > 0
    acc = batch.column("accept").combine_chunks()
    acc_vals = acc.values.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    acc_off = acc.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    neg = np.concatenate([[0], np.cumsum(acc_vals < 0)])
    acc_bad = ((neg[acc_off[1:]] - neg[acc_off[:-1]]) > 0) | (
        (acc_off[1:] == acc_off[:-1]) & ~acc.is_null().to_numpy(zero_copy_only=False))
    rid = batch.column("request_id")
    no_id = (rid.is_null().to_numpy(zero_copy_only=False)
             | pc.equal(pc.utf8_length(rid.fill_null("")), 0).to_numpy(zero_copy_only=False))
    checks = [
        ("arrival_s" if clock == "time" else "arrival_step", arr_null | ~(arr >= 0) | ~np.isfinite(arr),
         "must be a finite non-negative number (the trace's clock is '%s')" % clock),
        ("prompt_tokens", prompt < 1, "must be at least 1"),
        ("output_tokens", out < 1, "must be at least 1"),
        ("turn", turn < 0, "must be non-negative"),
        ("segments", seg_null | nonpos, "must be a list of segments of positive length"),
        ("segments", covered != prompt, "must cover exactly prompt_tokens tokens"),
        ("accept", acc_bad, "must be null or a non-empty list of non-negative integers"),
        ("request_id", no_id, "must be a non-empty string"),
    ]
    first_bad = np.full(n, -1, dtype=np.int64)
    for k, (_, mask, _) in enumerate(checks):
        first_bad = np.where((first_bad < 0) & mask, k, first_bad)
    keep = first_bad < 0
    for i in np.flatnonzero(~keep):
        name, _, text = checks[first_bad[i]]
        errors.append((int(i), f"{path}:{row0 + i + 1}: field '{name}' {text}"))
    return keep
