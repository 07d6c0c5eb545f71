"""The pipeline's Dask task functions.

Every function here is a plain top-level function: it takes plain
configuration (dictionaries of strings and numbers) or the Arrow output of
another task, builds whatever Cython objects it needs *inside* the task, and
returns Arrow tables (or small dictionaries of them).  Nothing here talks to
Dask or to the database, so each function can be called directly, on the
synchronous scheduler or on any distributed worker, with the same result.

The graph (:mod:`aisim.pipeline.graph`) wires them up as::

    read_source(file)      one task per input file: read, resolve models, window
      └ select_part(read, model)     that file's rows of one model
          └ run_shard(shard, [parts])  one task per (model, engine configuration)
    source_stats(read)     small per-file counts for the run summary

A task whose input is wrong (a bad trace line, an engine that cannot hold a
request, duplicate ids: any :class:`~aisim.errors.AisimError`) does not
raise: it returns a *failure* (:func:`failure`), which the tasks downstream
pass on and the graph reports, naming the file or the shard.  Such errors
are deterministic, so retrying them (as Dask does with exceptions) would only
repeat them; exceptions are left for what a retry can cure, such as a worker
that died.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aisim.columns import REQUESTS, SHARDS, STEPS, SUMMARIES
from aisim.errors import PipelineError, ShardError
from aisim.pipeline.spec import canonical_json

# Columns every requests/steps row carries in front of the replay's own.
KEY_COLUMNS = ("run_id", "shard_id")

# The landed tables' Arrow schemas, from the column catalogue.
SUMMARY_SCHEMA = SUMMARIES.arrow_schema()
SHARD_SCHEMA = SHARDS.arrow_schema()
REQUEST_SCHEMA = REQUESTS.arrow_schema()
STEP_SCHEMA = STEPS.arrow_schema()


def failure(message: str) -> dict:
    """A task's result that says it failed, and why (a plain dict, so it travels anywhere)."""
    return {"aisim_failure": message}


def is_failure(result) -> bool:
    """Whether a task result is a :func:`failure`."""
    return isinstance(result, dict) and "aisim_failure" in result


# ---------------------------------------------------------------------------- reading


def read_source(desc: dict) -> dict:
    """Read one input file, or return a :func:`failure` naming it; see :func:`_read_source`."""
    from aisim.errors import AisimError

    try:
        return _read_source(desc)
    except AisimError as exc:
        return failure(f"reading {desc['display']} (source '{desc['source']}') failed: {exc}")


def _read_source(desc: dict) -> dict:
    """Read one input file, give every row its model and apply the time window.

    Errors do not repeat the file's name: the graph reports a failed read as
    ``reading FILE (source NAME) failed: ...``.

    Parameters
    ----------
    desc : dict
        ``path``, ``display`` (the name used in messages), ``source`` (source
        name), ``format``, ``options`` (reader options), ``model`` (fixed
        model or None), ``model_column``, ``model_map``,
        ``request_id_prefix``, ``window`` (``start_s``, ``end_s``,
        ``start_step``, ``end_step``) and ``models`` (the deployed models).

    Returns
    -------
    dict
        ``tables``: deployed model -> trace table of its rows (file order);
        ``rows``: rows read; ``in_window``: rows inside the window;
        ``skipped``: model -> rows inside the window with no deployment
        (``""`` for rows without a model); ``clock``: ``"step"`` or ``"time"``;
        ``bad_rows``: malformed rows the reader skipped (``skip_bad_rows``).
    """
    from aisim.traces import read_trace

    table = read_trace(desc["path"], desc["format"], **desc["options"])
    rows = table.num_rows
    meta = dict(table.schema.metadata or {})
    clock = meta.get(b"clock", b"step").decode()
    table = _apply_window(table, clock, desc["window"])
    models = _row_models(table, desc)
    table = table.set_column(table.schema.get_field_index("model"), "model", models)
    if desc["request_id_prefix"]:
        ids = pc.binary_join_element_wise(pa.scalar(desc["request_id_prefix"]), table.column("request_id"), "")
        table = table.set_column(table.schema.get_field_index("request_id"), "request_id", ids)
    table = table.replace_schema_metadata(meta)
    deployed = set(desc["models"])
    tables, skipped = {}, {}
    if table.num_rows:
        enc = pc.dictionary_encode(models.combine_chunks() if isinstance(models, pa.ChunkedArray) else models)
        names = enc.dictionary.to_pylist()
        idx = enc.indices.to_numpy(zero_copy_only=False)
        nulls = np.asarray(enc.indices.is_null().to_numpy(zero_copy_only=False))
        if nulls.any():
            skipped[""] = int(nulls.sum())
        for code, name in enumerate(names):
            mask = (idx == code) & ~nulls
            if name in deployed:
                tables[name] = table.filter(pa.array(mask))
            else:
                skipped[name] = int(mask.sum())
    bad = int((meta.get(b"bad_rows") or b"0").decode() or 0)
    return {"tables": tables, "rows": rows, "in_window": table.num_rows, "skipped": skipped, "clock": clock,
            "display": desc["display"], "bad_rows": bad}


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


def select_part(read: dict, model: str):
    """One file's rows of ``model`` with the file's name, or None when it has none."""
    if is_failure(read):
        return read
    table = read["tables"].get(model)
    if table is None or table.num_rows == 0:
        return None
    return {"display": read["display"], "table": table}


def source_stats(read: dict) -> dict:
    """The small part of :func:`read_source`'s result the run summary needs."""
    if is_failure(read):
        return read
    return {"display": read["display"], "rows": read["rows"], "in_window": read["in_window"],
            "bad_rows": read["bad_rows"],
            "skipped": dict(read["skipped"]), "clock": read["clock"],
            "models": {m: t.num_rows for m, t in sorted(read["tables"].items())}}


# ---------------------------------------------------------------------------- replay


def merge_parts(parts: list) -> pa.Table | None:
    """Concatenate a model's rows from several files into one trace in arrival order.

    Rows are ordered by arrival, ties in file order (files in source order),
    so the merged trace does not depend on which worker read which file.
    Errors do not name the shard: the graph reports ``shard N (...) failed: ...``.
    """
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    clocks = {p["display"]: (p["table"].schema.metadata or {}).get(b"clock", b"step").decode() for p in parts}
    if len(set(clocks.values())) > 1:
        listing = ", ".join(f"{k} ({v})" for k, v in clocks.items())
        raise ShardError(f"the model's traces mix stepped and timed arrivals: {listing}")
    meta = parts[0]["table"].schema.metadata
    tables = [p["table"].replace_schema_metadata(None) for p in parts]
    trace = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    if len(tables) > 1:
        col = "arrival_s" if next(iter(clocks.values())) == "time" else "arrival_step"
        key = trace.column(col).to_numpy(zero_copy_only=False).astype(np.float64)
        trace = trace.take(pa.array(np.argsort(key, kind="stable")))
    ids = trace.column("request_id")
    if pc.count_distinct(ids).as_py() != trace.num_rows:
        counts = pc.value_counts(ids)
        dup = next(v["values"] for v in counts.to_pylist() if v["counts"] > 1)
        files = [p["display"] for p in parts if pc.any(pc.equal(p["table"].column("request_id"), dup)).as_py()]
        raise ShardError(f"request_id '{dup}' appears more than once (in {', '.join(files)}); "
                         "give the sources distinct 'request_id_prefix' values")
    return trace.replace_schema_metadata(meta)


def run_shard(desc: dict, parts: list) -> dict:
    """Replay one shard, or return a :func:`failure` naming it (or its failed input); see :func:`_run_shard`."""
    from aisim.errors import AisimError

    for p in parts:
        if is_failure(p):
            return p
    try:
        return _run_shard(desc, parts)
    except AisimError as exc:
        return failure(f"shard {desc['shard_id']} (model '{desc['model']}', engine '{desc['engine']}') "
                       f"failed: {exc}")


def _run_shard(desc: dict, parts: list) -> dict:
    """Replay one model's trace on one engine configuration.

    Parameters
    ----------
    desc : dict
        ``run_id``, ``shard_id``, ``model``, ``engine`` (name),
        ``engine_config`` (the :class:`~aisim.config.engine.EngineConfig`,
        validated when the spec loaded), ``engine_source`` (where it came
        from, for messages) and ``engine_path`` (as the spec writes it, or
        None when inline).
    parts : list of dict or None
        :func:`select_part` results of the files that may hold the model's rows.

    Returns
    -------
    dict
        What :func:`write_results` returns: the shard's ``shards`` and
        ``summaries`` rows as dictionaries and the staged files.
    """
    from aisim.replay import replay

    t0 = time.perf_counter()
    engine = desc["engine_config"]
    trace = merge_parts(parts)
    if trace is None:  # no rows for this model (tonight): an empty shard, landed as such
        from aisim.traces.schema import TRACE_SCHEMA

        trace = TRACE_SCHEMA.empty_table().replace_schema_metadata({"clock": "step"})
        clock = None
    else:
        clock = (trace.schema.metadata or {}).get(b"clock", b"step").decode()
    opts = desc.get("replay") or {}
    result = replay(trace, engine, closed_loop=opts.get("closed_loop", False),
                    think_time_s=opts.get("think_time_s"))
    requests = _requests_table(desc, trace, result.requests)
    steps = _steps_table(desc, result.steps)
    summary = result.summary
    config = _engine_dict(engine)
    shard = {
        "run_id": desc["run_id"],
        "shard_id": desc["shard_id"],
        "model": desc["model"],
        "engine": desc["engine"],
        "engine_path": desc["engine_path"],
        "engine_sha256": _sha256(canonical_json(config)),
        "engine_config": canonical_json(config),
        "vllm_version": config.get("vllm_version"),
        "clock": clock,
        "sources": canonical_json([{"path": p["display"], "rows": p["table"].num_rows}
                                   for p in parts if p is not None]),
        "requests": requests.num_rows,
        "steps": steps.num_rows,
        "task_s": time.perf_counter() - t0,
    }
    return write_results(desc, shard, summary_row(desc, summary, steps), [requests], [steps])


# DuckDB's row group size: staged files made of whole row groups land without re-splitting.
ROW_GROUP = 122_880
# Rows per staged requests/steps file.
FILE_ROWS = 8 * ROW_GROUP


def shard_dir(shard_id: int) -> str:
    """The shard's directory inside the run's staging directory."""
    return f"shards/{shard_id:05d}"


def write_results(desc: dict, shard: dict, summary: dict, requests, steps) -> dict:
    """Write a shard's rows to the run's staging directory; return the small part the driver needs.

    Parameters
    ----------
    desc : dict
        The shard task's description: ``run_id``, ``shard_id`` and ``staging``
        (:class:`~aisim.pipeline.staging.Staging`).
    shard, summary : dict
        The shard's one ``shards`` and ``summaries`` row.
    requests, steps : iterable of pyarrow.Table
        The rows, in key order, in pieces of any size; staged as files of
        :data:`FILE_ROWS` rows (one empty file when there are none).

    Returns
    -------
    dict
        ``shard`` and ``summary`` (the rows), ``files`` (per table, the staged
        files relative to the run's directory, in order) and ``rows`` (per table).
    """
    staging, run_id = desc["staging"], desc["run_id"]
    base = shard_dir(desc["shard_id"])
    files, rows = {}, {}
    for name, schema, row in (("shards", SHARD_SCHEMA, shard), ("summaries", SUMMARY_SCHEMA, summary)):
        rel = f"{base}/{name}.parquet"
        staging.write_parquet(staging.run_path(run_id, rel), pa.Table.from_pylist([row], schema=schema))
        files[name], rows[name] = [rel], 1
    for name, schema, pieces in (("requests", REQUEST_SCHEMA, requests), ("steps", STEP_SCHEMA, steps)):
        files[name], rows[name] = _write_pieces(staging, run_id, f"{base}/{name}", schema, pieces)
    return {"shard": shard, "summary": summary, "files": files, "rows": rows}


def _write_pieces(staging, run_id: str, stem: str, schema, pieces):
    """Stage ``pieces`` as ``stem-00000.parquet``, ``stem-00001.parquet``, ... of :data:`FILE_ROWS` rows."""
    import pyarrow.parquet as pq

    names, total, pending, held = [], 0, [], 0

    def flush(batches):
        rel = f"{stem}-{len(names):05d}.parquet"
        table = pa.Table.from_batches(batches, schema=schema)
        with staging.open_atomic(staging.run_path(run_id, rel)) as fh:
            pq.write_table(table, fh, row_group_size=ROW_GROUP, compression="zstd")
        names.append(rel)

    for piece in pieces:
        for batch in piece.to_batches():
            pending.append(batch)
            held += batch.num_rows
            total += batch.num_rows
            while held >= FILE_ROWS:
                table = pa.Table.from_batches(pending, schema=schema)
                flush(table.slice(0, FILE_ROWS).to_batches())
                rest = table.slice(FILE_ROWS)
                pending, held = rest.to_batches(), rest.num_rows
    if held or not names:
        flush(pending)
    return names, total


def _sha256(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def _engine_dict(engine) -> dict:
    return json.loads(canonical_json(engine.to_dict()))


def _key_columns(desc: dict, n: int) -> dict:
    # A one-entry dictionary array: cheap to build, cast to VARCHAR on landing.
    run = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int8)), pa.array([desc["run_id"]], pa.string()))
    return {"run_id": run, "shard_id": pa.array(np.full(n, desc["shard_id"], np.int32))}


def _null_nan(col):
    """Float NaN (the replay's "no value") as SQL NULL."""
    if pa.types.is_floating(col.type):
        return pc.if_else(pc.is_nan(col), pa.scalar(None, col.type), col)
    return col


def _requests_table(desc: dict, trace: pa.Table, requests: pa.Table) -> pa.Table:
    """The shard's ``requests`` rows: keys and trace columns in front of the replay's (NaN as NULL)."""
    n = requests.num_rows
    cols = _key_columns(desc, n)
    cols["request_index"] = pa.array(np.arange(n, dtype=np.int32))
    for name in ("session_id", "turn", "priority"):
        cols[name] = trace.column(name)
    for name in requests.column_names:
        cols[name] = _null_nan(requests.column(name))
    return pa.Table.from_arrays([cols[f.name] for f in REQUEST_SCHEMA], schema=REQUEST_SCHEMA)


def _steps_table(desc: dict, steps: pa.Table) -> pa.Table:
    """The shard's ``steps`` rows: keys in front of the replay's step columns."""
    cols = _key_columns(desc, steps.num_rows)
    for name in steps.column_names:
        cols[name] = steps.column(name)
    return pa.Table.from_arrays([cols[f.name] for f in STEP_SCHEMA], schema=STEP_SCHEMA)


def summary_row(desc: dict, summary: dict, steps: pa.Table) -> dict:
    """The one ``summaries`` row of a shard: the replay summary, flattened.

    Each column of :data:`aisim.columns.SUMMARIES` with a ``summary`` path
    takes that value of the summary (``("ttft_s", "p50")`` for
    ``ttft_p50_s``); integers missing from it count 0, floats missing or NaN
    are NULL.  KV-cache usage mean and peak come from the steps.  The whole
    summary is kept as ``summary_json`` too.
    """
    row = {"run_id": desc["run_id"], "shard_id": desc["shard_id"]}
    for col in SUMMARIES.columns:
        if col.summary is None:
            continue
        v = summary
        for key in col.summary:
            v = (v or {}).get(key)
        if col.sql == "BIGINT":
            row[col.name] = int(v or 0)
        else:
            row[col.name] = None if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)
    if steps.num_rows:
        row["kv_usage_mean"] = float(pc.mean(steps.column("kv_usage")).as_py())
        row["kv_usage_max"] = float(pc.max(steps.column("kv_usage")).as_py())
        row["kv_physical_usage_max"] = float(pc.max(steps.column("physical_usage")).as_py())
    else:
        row["kv_usage_mean"] = row["kv_usage_max"] = row["kv_physical_usage_max"] = None
    row["summary_json"] = canonical_json(summary)
    return row
