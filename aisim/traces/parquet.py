"""aisim's own trace files: a trace table stored with :mod:`pyarrow.parquet`.

:func:`write_trace` stores a table with its metadata (``clock``,
``unit_tokens``, ...); :func:`read_parquet` reads one back batch by batch and
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
from aisim.files import atomic_path
from aisim.traces.common import BadRows, finish
from aisim.traces.schema import OPTIONAL_COLUMNS, TRACE_SCHEMA

BATCH_ROWS = 65536


def write_trace(table: pa.Table, path: str | os.PathLike) -> None:
    """Store a trace table as Parquet (schema metadata included).

    Parameters
    ----------
    table : pyarrow.Table
        A trace table.
    path : path-like
        The ``.parquet`` file to write (its directory is created when missing).
    """
    import pyarrow.parquet as pq

    path = os.fspath(path)
    try:
        # All or nothing: an interrupted write leaves no partial Parquet file.
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp)
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
    import pyarrow.parquet as pq

    path = os.fspath(path)
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
    bad = BadRows(skip_bad_rows)
    seen = {}
    batches = []
    row0 = 0
    present = [f.name for f in TRACE_SCHEMA if schema.get_field_index(f.name) >= 0]
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=present):
        batch = _cast(path, pa.Table.from_batches([batch]))
        if clock is None:
            clock = "time" if batch.column("arrival_s").null_count < batch.num_rows else "step"
        keep = _validate(path, batch, clock, row0, bad, seen)
        batches.append(batch.filter(pa.array(keep)) if not keep.all() else batch)
        row0 += batch.num_rows
    if not batches or sum(b.num_rows for b in batches) == 0:
        raise TraceError(f"{path}: the trace has no requests"
                         + (f" ({bad.count} bad rows skipped)" if bad.count else ""))
    table = pa.concat_tables(batches).combine_chunks()
    key = table.column("arrival_s" if clock == "time" else "arrival_step").to_numpy(zero_copy_only=False)
    key = key.astype(np.float64)
    if np.any(np.diff(key) < 0):
        table = table.take(pa.array(np.argsort(key, kind="stable")))
    meta[b"clock"] = clock.encode()
    if meta.get(b"format", b"parquet") != b"parquet":
        meta[b"source_format"] = meta[b"format"]
    return finish(table.replace_schema_metadata(meta), "parquet", bad)


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


def _validate(path, batch: pa.Table, clock: str, row0: int, bad: BadRows, seen: dict) -> np.ndarray:
    """Check every row of ``batch``; returns the mask of rows to keep (raises unless skipping)."""
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
    checks = [
        ("arrival_s" if clock == "time" else "arrival_step", arr_null | ~(arr >= 0) | ~np.isfinite(arr),
         "must be a finite non-negative number (the trace's clock is '%s')" % clock),
        ("prompt_tokens", prompt < 1, "must be at least 1"),
        ("output_tokens", out < 1, "must be at least 1"),
        ("turn", turn < 0, "must be non-negative"),
        ("segments", seg_null | nonpos, "must be a list of segments of positive length"),
        ("segments", covered != prompt, "must cover exactly prompt_tokens tokens"),
        ("accept", acc_bad, "must be null or a non-empty list of non-negative integers"),
    ]
    first_bad = np.full(n, -1, dtype=np.int64)
    for k, (_, mask, _) in enumerate(checks):
        first_bad = np.where((first_bad < 0) & mask, k, first_bad)
    keep = first_bad < 0
    ids = batch.column("request_id").to_pylist()
    msgs = {}
    for i in np.flatnonzero(~keep):
        name, _, text = checks[first_bad[i]]
        msgs[i] = f"{path}:{row0 + i + 1}: field '{name}' {text}"
    for i, rid in enumerate(ids):
        if i in msgs:
            continue
        if not rid:
            msgs[i] = f"{path}:{row0 + i + 1}: field 'request_id' must be a non-empty string"
        elif rid in seen:
            msgs[i] = f"{path}:{row0 + i + 1}: field 'request_id': '{rid}' already used on row {seen[rid]}"
        else:
            seen[rid] = row0 + i + 1
    for i in sorted(msgs):
        keep[i] = False
        bad.record(TraceError(msgs[i]))
    return keep
