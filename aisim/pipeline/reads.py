"""The pipeline's read tasks: trace files read in blocks, on the workers, grouped by model in staging.

An input file of a block format (:mod:`aisim.traces.blockread`) larger than
one block is read by a chain of tasks, each holding at most one block::

    count_block(file, k)      line breaks in block k's bytes     (text formats; one task per block)
    parse_block(file, k)      block k parsed -> staged rows and bad lines
    resolve_file(file)        the blocks in file order: ids used twice, clock, sessions, time zero
    route_block(file, k)      block k's final rows: window, models, request id prefix, sorted by arrival,
                              staged once per deployed model ("parts")
    file_stats(file)          the file's counts for the run summary

A file of one block, or of a format read whole (agentic, a reader a test or
plug-in put in ``READERS``), is one task, :func:`read_whole`, doing the same
steps.  Every task returns small dictionaries; the rows go through the run's
staging directory (``input/NNNNN/``) and never through the driver.  A shard
reads its model's parts (:func:`aisim.pipeline.shards.run_shard`).

Errors are returned as failures (:func:`aisim.pipeline.shards.failure`)
naming the file, as the other tasks do.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aisim.errors import AisimError, PipelineError

# Columns a part carries besides the trace table's: where each row came from, for the merge.
PART_EXTRA = ("file_index", "line")


def _failure(desc, exc) -> dict:
    from aisim.pipeline.shards import failure

    return failure(f"reading {desc['display']} (source '{desc['source']}') failed: {exc}")


def _is_failure(x) -> bool:
    from aisim.pipeline.shards import is_failure

    return is_failure(x)


def _format(desc):
    from aisim.traces.blockread import block_format

    return block_format(desc["format"], desc["options"])


def _dir(desc) -> str:
    return f"input/{desc['index']:05d}"


def _stage(desc):
    return desc["staging"]


def _write(desc, rel, table) -> str:
    st = _stage(desc)
    st.write_parquet(st.run_path(desc["run_id"], rel), table)
    return rel


def _load(desc, rel, columns=None) -> pa.Table:
    import pyarrow.parquet as pq

    st = _stage(desc)
    with st.fs.open(st.run_path(desc["run_id"], rel), "rb") as fh:
        return pq.read_table(fh, columns=columns)


# ---------------------------------------------------------------------------- planning


def plan_blocks(path: str, fmt: str, options: dict, block_bytes: int | None = None):
    """The blocks the chain reads ``path`` in: byte ranges (text) or ``(row group, first row)``
    (Parquet); None when one task reads the file whole (one block, or a format read whole).

    Reads no more than the file's size and, for Parquet, its footer.
    """
    from aisim.traces.blockread import TEXT_FORMATS, block_format
    from aisim.traces.blocks import block_ranges, file_size

    try:
        reader = block_format(fmt, options)
        if reader is None:
            return None
        blocks = block_ranges(file_size(path), block_bytes) if fmt in TEXT_FORMATS else reader.blocks(path)
    except AisimError:
        return None  # the one task reads it, and names what is wrong
    return blocks if len(blocks) > 1 else None


# ---------------------------------------------------------------------------- the block chain


def count_block(desc: dict, k: int) -> int:
    """Line breaks in block ``k``'s byte range (:func:`aisim.traces.blocks.count_breaks`)."""
    from aisim.traces.blocks import count_breaks

    try:
        a, b = desc["blocks"][k]
        return count_breaks(desc["path"], a, b)
    except AisimError as exc:
        return _failure(desc, exc)


def parse_block(desc: dict, k: int, counts: list) -> dict:
    """Parse block ``k`` and stage its rows and bad lines; ``counts`` are the blocks' line breaks."""
    from aisim.traces.blocks import block_text, first_lines

    for c in counts:
        if _is_failure(c):
            return c
    try:
        fmt = _format(desc)
        if desc["format"] == "parquet":
            parsed = fmt.parse_group(desc["path"], desc["blocks"][k])
        else:
            a, b = desc["blocks"][k]
            parsed = fmt.parse(desc["path"], *block_text(desc["path"], a, b, first_lines(counts)[k]))
    except AisimError as exc:
        return _failure(desc, exc)
    if parsed.rows is None:  # a file-level fault: resolve reports it
        return {"k": k, "info": parsed.info}
    rows = _write(desc, f"{_dir(desc)}/raw-{k:05d}.parquet", parsed.rows)
    bad = _write(desc, f"{_dir(desc)}/bad-{k:05d}.parquet", parsed.bad_table()) if parsed.bad else None
    return {"k": k, "rows": rows, "bad": bad, "info": parsed.info}


def resolve_file(desc: dict, parsed: list) -> dict:
    """The file's blocks in order: settle what lines owe to earlier ones; stage each block's final rows.

    Returns the format's :class:`~aisim.traces.blockread.Resolved` as a
    dictionary, with ``blocks``: block -> its staged rows (None when empty).
    """
    from aisim.traces.blockread import Blocks, Parsed

    for p in parsed:
        if _is_failure(p):
            return p
    try:
        fmt = _format(desc)

        def load(k):
            p = parsed[k]
            if "rows" not in p:
                return Parsed(None, [], p["info"])
            rows = _load(desc, p["rows"])
            return Parsed.from_tables(rows, _load(desc, p["bad"]), p["info"]) if p["bad"] else \
                Parsed(rows, [], p["info"])

        def ids(k):
            p = parsed[k]
            if "rows" not in p:
                return None, []
            rows = _load(desc, p["rows"], ["request_id"]).column("request_id")
            extra = [x for x in _load(desc, p["bad"], ["request_id"]).column("request_id").to_pylist()
                     if x is not None] if p["bad"] else []
            return rows, extra

        blocks = Blocks(len(parsed), load, ids)
        out = {}

        def emit(k, table):
            out[k] = _write(desc, f"{_dir(desc)}/final-{k:05d}.parquet", table) if table.num_rows else None

        def reparse(k, carry):
            from aisim.traces.blocks import block_text, count_breaks, first_lines

            counts = [count_breaks(desc["path"], a, b) for a, b in desc["blocks"][:k + 1]]
            a, b = desc["blocks"][k]
            return fmt.parse(desc["path"], *block_text(desc["path"], a, b, first_lines(counts)[k]), carry=carry)

        res = fmt.resolve(desc["path"], blocks, reparse, emit)
        info = dict(res.info)
        _check_window(info["clock"], desc["window"])
    except AisimError as exc:
        return _failure(desc, exc)
    return {"info": info, "rows": res.rows, "bad_rows": res.bad_rows, "first_bad": res.first_bad,
            "blocks": [out.get(k) for k in range(len(parsed))]}


def route_block(desc: dict, k: int, resolved: dict) -> dict:
    """Block ``k``'s final rows: window, models, request id prefix, by arrival; staged per deployed model."""
    if _is_failure(resolved):
        return resolved
    try:
        rel = resolved["blocks"][k]
        if rel is None:
            return _route(desc, k, None, resolved["info"])
        fmt = _format(desc)
        table = fmt.finish(_load(desc, rel), resolved["info"])
        return _route(desc, k, table, resolved["info"])
    except AisimError as exc:
        return _failure(desc, exc)


def file_stats(desc: dict, resolved: dict, routes: list) -> dict:
    """The file's counts for the run summary (what :func:`aisim.pipeline.shards.source_stats` gave)."""
    for r in [resolved] + list(routes):
        if _is_failure(r):
            return r
    return _stats(desc, resolved["rows"] + 0, resolved["bad_rows"], resolved["info"]["clock"], routes)


# ---------------------------------------------------------------------------- one task


def read_whole(desc: dict) -> dict:
    """A file of one block, or of a format read whole, in one task; returns its stats with its ``routes``."""
    try:
        fmt = _format(desc)
        if fmt is None:
            return _read_with_reader(desc)
        from aisim.traces.blockread import read_blocks

        table = read_blocks(desc["path"], fmt, keep_lines=True) if desc["format"] != "parquet" else \
            _read_parquet_with_lines(desc["path"], fmt)
    except AisimError as exc:
        return _failure(desc, exc)
    return _whole_table(desc, table)


def _read_parquet_with_lines(path, fmt):
    from aisim.traces.blockread import Blocks, sort_by_arrival

    groups = fmt.blocks(path)
    parsed = [fmt.parse_group(path, g) for g in groups]
    out = [None] * len(groups)

    def emit(k, table):
        out[k] = table

    res = fmt.resolve(path, Blocks.of(parsed), None, emit)
    table = pa.concat_tables([fmt.finish(t, res.info) for t in out]).combine_chunks()
    return sort_by_arrival(table, res.info["clock"]).replace_schema_metadata(fmt.metadata(res))


def _read_with_reader(desc):
    from aisim.traces import read_trace

    table = read_trace(desc["path"], desc["format"], **desc["options"])
    return _whole_table(desc, table.append_column("line", pa.array(np.arange(1, table.num_rows + 1), pa.int64())))


def _whole_table(desc, table):
    try:
        meta = dict(table.schema.metadata or {})
        clock = meta.get(b"clock", b"step").decode()
        bad = int((meta.get(b"bad_rows") or b"0").decode() or 0)
        _check_window(clock, desc["window"])
        route = _route(desc, 0, table, {"clock": clock})
    except AisimError as exc:
        return _failure(desc, exc)
    return dict(_stats(desc, table.num_rows, bad, clock, [route]), routes=[route])


# ---------------------------------------------------------------------------- routing


def _check_window(clock: str, window: dict) -> None:
    lo_key, hi_key = ("start_s", "end_s") if clock == "time" else ("start_step", "end_step")
    other = ("start_step", "end_step") if clock == "time" else ("start_s", "end_s")
    if window.get(lo_key) is None and window.get(hi_key) is None and any(window.get(k) is not None for k in other):
        raise PipelineError(
            f"a {'timed' if clock == 'time' else 'stepped'} trace, but the window only bounds "
            f"{'engine steps' if clock == 'time' else 'seconds'}; add 'window.{lo_key}'/'window.{hi_key}'")


def _route(desc: dict, k: int, table, info: dict) -> dict:
    """Split one block's rows (sorted by arrival, with ``line``) by deployed model and stage them."""
    clock = info["clock"]
    out = {"k": k, "rows": 0, "in_window": 0, "skipped": {}, "parts": {}, "clock": clock}
    if table is None or table.num_rows == 0:
        return out
    extra = [c for c in table.column_names if c not in PART_EXTRA and c not in _TRACE_NAMES]
    lines = table.column("line")
    table = table.drop_columns(["line"] + extra)
    out["rows"] = table.num_rows
    with_line = table.append_column("line", lines)
    with_line = _apply_window(with_line, clock, desc["window"])
    out["in_window"] = with_line.num_rows
    if with_line.num_rows == 0:
        return out
    models = _row_models(with_line.drop_columns(["line"]), desc)
    with_line = with_line.set_column(with_line.schema.get_field_index("model"), "model", models)
    if desc["request_id_prefix"]:
        ids = pc.binary_join_element_wise(pa.scalar(desc["request_id_prefix"]), with_line.column("request_id"), "")
        with_line = with_line.set_column(with_line.schema.get_field_index("request_id"), "request_id", ids)
    with_line = with_line.append_column("file_index", pa.array(np.full(with_line.num_rows, desc["index"],
                                                                        np.int32)))
    deployed = {m: i for i, m in enumerate(desc["models"])}
    enc = pc.dictionary_encode(models)
    names = enc.dictionary.to_pylist()
    idx = enc.indices.to_numpy(zero_copy_only=False)
    nulls = np.asarray(enc.indices.is_null().to_numpy(zero_copy_only=False))
    if nulls.any():
        out["skipped"][""] = int(nulls.sum())
    arrival = "arrival_s" if clock == "time" else "arrival_step"
    for code, name in enumerate(names):
        mask = (idx == code) & ~nulls
        if name not in deployed:
            out["skipped"][name] = int(mask.sum())
            continue
        part = with_line.filter(pa.array(mask)).replace_schema_metadata({"clock": clock})
        key = part.column(arrival).to_numpy(zero_copy_only=False).astype(np.float64)
        rel = _write(desc, f"{_dir(desc)}/part-{k:05d}-{deployed[name]:04d}.parquet", part)
        out["parts"][name] = {"path": rel, "rows": part.num_rows, "min": float(key.min()), "max": float(key.max())}
    return out


def _apply_window(table: pa.Table, clock: str, window: dict) -> pa.Table:
    col, lo_key, hi_key = ("arrival_s", "start_s", "end_s") if clock == "time" else \
        ("arrival_step", "start_step", "end_step")
    lo, hi = window.get(lo_key), window.get(hi_key)
    other = ("start_step", "end_step") if clock == "time" else ("start_s", "end_s")
    if lo is None and hi is None:
        if any(window.get(k) is not None for k in other):
            raise PipelineError(
                f"a {'timed' if clock == 'time' else 'stepped'} trace, but the window only bounds "
                f"{'engine steps' if clock == 'time' else 'seconds'}; add 'window.{lo_key}'/'window.{hi_key}'")
        return table
    arrival = table.column(col)
    mask = None
    if lo is not None:
        mask = pc.greater_equal(arrival, lo)
    if hi is not None:
        m = pc.less(arrival, hi)
        mask = m if mask is None else pc.and_(mask, m)
    table = table.filter(mask)
    if lo:
        shifted = pc.subtract(table.column(col), pa.scalar(lo, table.schema.field(col).type))
        table = table.set_column(table.schema.get_field_index(col), col, shifted)
    return table


def _row_models(table: pa.Table, desc: dict):
    if desc["model"] is not None:
        return pa.repeat(pa.scalar(desc["model"], pa.string()), table.num_rows)
    col = desc["model_column"]
    if col not in table.column_names:
        raise PipelineError(f"the trace has no column '{col}' to take models from; "
                            f"columns: {', '.join(table.column_names)}")
    values = table.column(col).cast(pa.string())
    mapping = desc["model_map"]
    if mapping:
        keys = pa.array(list(mapping), pa.string())
        vals = pa.array(list(mapping.values()), pa.string())
        pos = pc.index_in(values, value_set=keys)
        mapped = pc.take(vals, pos)
        values = pc.if_else(pc.is_null(pos), values, mapped)
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _stats(desc, rows, bad, clock, routes) -> dict:
    skipped, models = {}, {}
    in_window = 0
    for r in routes:
        in_window += r["in_window"]
        for m, n in r["skipped"].items():
            skipped[m] = skipped.get(m, 0) + n
        for m, p in r["parts"].items():
            models[m] = models.get(m, 0) + p["rows"]
    return {"display": desc["display"], "rows": rows, "in_window": in_window, "bad_rows": bad, "clock": clock,
            "skipped": skipped, "models": dict(sorted(models.items()))}


def _trace_names():
    from aisim.traces.schema import TRACE_SCHEMA

    return tuple(TRACE_SCHEMA.names)


_TRACE_NAMES = _trace_names()
