"""The pipeline's shard tasks, and what the read tasks share with them.

Every function here is a plain top-level function: it takes plain
configuration (dictionaries of strings and numbers) or the small results of
other tasks, builds whatever Cython objects it needs *inside* the task, and
returns small dictionaries; rows travel through the run's staging directory.
Nothing here talks to Dask or to the database, so each function can be
called directly, on the synchronous scheduler or on any distributed worker,
with the same result.

The graph (:mod:`aisim.pipeline.graph`) wires them up as::

    read tasks (aisim.pipeline.reads)   every input file, in blocks: its rows per deployed model
      └ run_shard(shard, [routes])      one task per (model, engine configuration): merge the
                                        model's rows in arrival order, replay, stage the results
    source_stats(read)                  small per-file counts for the run summary

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

from aisim.columns import REPLICAS, REQUESTS, SHARDS, STEPS, SUMMARIES
from aisim.pipeline.runkey import canonical_json
from aisim.pipeline.staging import STAGED_COMPRESSION
from aisim.traces.load import LOAD_KEYS, Retimer

# Columns every requests/steps row carries in front of the replay's own.
KEY_COLUMNS = ("run_id", "shard_id")

# The landed tables' Arrow schemas, from the column catalogue.
SUMMARY_SCHEMA = SUMMARIES.arrow_schema()
SHARD_SCHEMA = SHARDS.arrow_schema()
REQUEST_SCHEMA = REQUESTS.arrow_schema()
STEP_SCHEMA = STEPS.arrow_schema()
REPLICA_SCHEMA = REPLICAS.arrow_schema()

# The most requests a deployment shard replays: the core numbers a deployment's requests (and
# their id ranks) with 32-bit integers.  Deployments hold the whole trace in memory (they do not
# stream yet), so memory, not this, is what bounds them in practice.
MAX_DEPLOYMENT_REQUESTS = 2 ** 31 - 1


def failure(message: str) -> dict:
    """A task's result that says it failed, and why (a plain dict, so it travels anywhere)."""
    return {"aisim_failure": message}


def is_failure(result) -> bool:
    """Whether a task result is a :func:`failure`."""
    return isinstance(result, dict) and "aisim_failure" in result


# ---------------------------------------------------------------------------- reading


def source_stats(read: dict) -> dict:
    """The per-file counts of a file read whole (:func:`aisim.pipeline.reads.read_whole`), without its rows."""
    if is_failure(read):
        return read
    return {k: v for k, v in read.items() if k != "routes"}


# ---------------------------------------------------------------------------- replay


def model_parts(desc: dict, inputs: list) -> list:
    """The staged parts holding the shard's model, in (file, block) order: ``(file display, part)``."""
    out = []
    for (_, display), routes in zip(desc["files"], inputs):
        routes = routes["routes"] if isinstance(routes, dict) else routes
        for r in routes:
            part = r["parts"].get(desc["model"])
            if part is not None:
                out.append((display, dict(part, clock=r["clock"])))
    return out


def run_shard(desc: dict, inputs: list) -> dict:
    """Replay one shard, or return a :func:`failure` naming it (or its failed input); see :func:`_run_shard`."""
    from aisim.errors import AisimError

    for x in inputs:
        for r in ([x] if isinstance(x, dict) else x):
            if is_failure(r):
                return r
    try:
        return _run_shard(desc, model_parts(desc, inputs))
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
    parts : list
        The staged parts holding the model's rows (:func:`model_parts`).

    Returns
    -------
    dict
        What :func:`write_results` returns: the shard's ``shards`` and
        ``summaries`` rows as dictionaries and the staged files.
    """
    from aisim.pipeline.merge import ShardTrace
    from aisim.replay import replay_stream, stream_private

    t0 = time.perf_counter()
    engine = desc["engine_config"]
    opts = desc.get("replay") or {}
    closed_loop = opts.get("closed_loop", False)
    trace = ShardTrace(desc, parts)
    try:
        trace.check_ids()
        clock = trace.clock
        timed = clock == "time"
        if closed_loop and trace.rows and not timed:
            from aisim.errors import TraceError

            raise TraceError("a closed-loop replay needs a trace clocked in seconds (arrival_s)")
        fleet = desc.get("deployment")
        # A deployment ranks the request ids itself (aisim.replay.run_deployment).
        # A deployment links a closed loop's turns itself too (aisim.deploy.deploy(closed_loop=...)).
        # The KV offload manager hears of finished requests in id order (aisim.replay).
        order = dict(rank=(engine.policy == "priority" or engine.kv_offload is not None) and fleet is None,
                     closed_loop=closed_loop and fleet is None,
                     think_time_s=opts.get("think_time_s"))
        batches = trace.batches(**order)
        load = {k: opts[k] for k in LOAD_KEYS if k in opts}
        if load:  # the model's merged trace re-timed, piece by piece, before the core
            retimer = Retimer(load, timed)
            batches, timed = map(retimer, batches), retimer.timed
            clock = "time" if timed else clock
        requests = _Pieces(desc, "requests", REQUEST_SCHEMA)
        steps = _Pieces(desc, "steps", STEP_SCHEMA)
        kv = _KvUsage(engine)
        replicas = []
        if fleet is not None and trace.rows:
            summary, replicas = _run_deployment(desc, trace.rows, batches, clock, parts, requests, steps, kv,
                                                load.get("max_concurrency"), closed_loop, opts.get("think_time_s"))
        else:
            index = 0
            summary = None
            # A first pass finds the requests sharing no block with any other (keyed lazily by the core).
            private = stream_private(trace.batches(**order), engine, timed=trace.clock == "time")
            for item in replay_stream(batches, engine, timed=timed, expected=trace.rows,
                                      reject_too_long=opts.get("reject_too_long", False),
                                      max_concurrency=load.get("max_concurrency"), private=private):
                if item[0] == "requests":
                    requests.add(_requests_table(desc, item[2], item[1], index))
                    index += item[1].num_rows
                elif item[0] == "steps":
                    kv.add(item[1])
                    steps.add(_steps_table(desc, item[1]))
                else:
                    summary = item[1]
    finally:
        trace.close()
    config = _engine_dict(engine)
    shard = {
        "run_id": desc["run_id"],
        "shard_id": desc["shard_id"],
        "model": desc["model"],
        "engine": desc["engine"],
        "engine_path": desc["engine_path"],
        "engine_sha256": _sha256(canonical_json(config)),
        "engine_config": canonical_json(config),
        "replicas": fleet.replicas if fleet is not None else None,
        "router": fleet.router if fleet is not None else None,
        "deployment_config": canonical_json(fleet.to_dict()) if fleet is not None else None,
        "vllm_version": config.get("vllm_version"),
        "clock": clock,
        "sources": canonical_json(_sources(parts)),
        "requests": requests.total,
        "steps": steps.total,
        "task_s": time.perf_counter() - t0,
    }
    return write_results(desc, shard, summary_row(desc, summary, kv), requests, steps, replicas)


def run_search(desc: dict, inputs: list) -> dict:
    """Answer a plugged-in section's question for one shard (:mod:`aisim.pipeline.sections`) and stage its rows.

    The shard's whole merged trace (its model's rows, in arrival order, as the sources give them:
    the window applied, ``[replay]``'s load transform not) goes to the section's task; its rows are
    staged as ``shard-N/<table>.parquet``.  A shard without requests has nothing to ask (no rows).

    Returns
    -------
    dict
        ``files`` and ``rows`` of the section's table, or a :func:`failure` naming the shard.
    """
    from aisim.columns import RUN_EXTRA_TABLES
    from aisim.errors import AisimError
    from aisim.pipeline.merge import ShardTrace

    for x in inputs:
        for r in ([x] if isinstance(x, dict) else x):
            if is_failure(r):
                return r
    table_name = desc["table"]
    schema = RUN_EXTRA_TABLES[table_name].arrow_schema()
    try:
        trace = ShardTrace(desc, model_parts(desc, inputs))
        try:
            trace.check_ids()
            rows = schema.empty_table()
            if trace.rows:
                # One chunk: what the section sees (and may hash) is the same whatever the blocks were.
                whole = pa.concat_tables(list(trace.batches())).combine_chunks()
                whole = whole.replace_schema_metadata({"clock": trace.clock})
                rows = desc["task"](desc, desc["section"], whole).select(schema.names).cast(schema)
        finally:
            trace.close()
    except AisimError as exc:
        return failure(f"[{desc['key']}] of shard {desc['shard_id']} (model '{desc['model']}', engine "
                       f"'{desc['engine']}') failed: {exc}")
    staging, run_id = desc["staging"], desc["run_id"]
    rel = f"{shard_dir(desc['shard_id'])}/{table_name}.parquet"
    staging.write_parquet(staging.run_path(run_id, rel), rows)
    return {"files": {table_name: [rel]}, "rows": {table_name: rows.num_rows}}


def _run_deployment(desc: dict, rows: int, batches, clock: str, parts: list, requests, steps, kv,
                    max_concurrency: int | None = None, closed_loop: bool = False, think_time_s=None) -> tuple:
    """Replay the shard's whole trace (``batches``, ``rows`` requests clocked by ``clock``) through its
    deployment (:func:`aisim.deploy.deploy`), its client capped at ``max_concurrency`` requests in flight,
    sessions driven in a closed loop when asked.

    Deployments do not stream: the trace is read whole, and the results are staged once the
    replay ends.  Returns the deployment's summary and its ``replicas`` rows.
    """
    from aisim.deploy import deploy
    from aisim.errors import ShardError
    from aisim.config.deployment import deployment_engines

    if rows > MAX_DEPLOYMENT_REQUESTS:
        raise ShardError(f"a deployment replays at most {MAX_DEPLOYMENT_REQUESTS:,} requests (it holds the "
                         f"whole trace; deployments do not stream yet); this shard has {rows:,}: "
                         "narrow it with [window] or split the sources")
    engine = desc["engine_config"]
    table = pa.concat_tables(list(batches)).replace_schema_metadata({"clock": clock})
    name = ", ".join(dict.fromkeys(display for display, _ in parts))
    result = deploy(table, engine, desc["deployment"], name=name, max_concurrency=max_concurrency,
                    closed_loop=closed_loop, think_time_s=think_time_s)
    requests.add(_requests_table(desc, table, result.requests))
    steps.add(_steps_table(desc, result.steps))
    kv.add(result.steps)
    fleet = desc["deployment"]
    # A replica's KV usage is over its own pool's engine (a disaggregated pool may have its own).
    pools = deployment_engines(fleet, engine) if fleet.disaggregated else (engine, engine)
    n_p = fleet.prefill.replicas if fleet.disaggregated else len(result.replicas)
    rows = []
    for w, (per, rep) in enumerate(zip(result.summary["replicas"], result.replicas)):
        usage = _KvUsage(pools[0] if w < n_p else pools[1])
        usage.add(rep.steps)
        rows.append(flatten(REPLICAS, desc, per, usage))
    return result.summary, rows


class _KvUsage:
    """The steps' KV-cache usage, for the summary: every step's active blocks, and the peaks.

    ``kv_usage_mean`` is the mean of the whole column (as Arrow computes it
    over one array), so the active blocks of every step are kept (4 bytes a step).
    """

    def __init__(self, engine):
        self.usable = float(engine.usable_blocks)
        self.active = []
        self.kv_max = None
        self.phys_max = None

    def add(self, steps: pa.Table) -> None:
        if steps.num_rows == 0:
            return
        self.active.append(steps.column("active_blocks").to_numpy(zero_copy_only=False).astype(np.int32))
        for attr, col in (("kv_max", "kv_usage"), ("phys_max", "physical_usage")):
            v = pc.max(steps.column(col)).as_py()
            cur = getattr(self, attr)
            setattr(self, attr, v if cur is None or v > cur else cur)

    def columns(self) -> dict | None:
        """``kv_usage_mean``, ``kv_usage_max``, ``kv_physical_usage_max``; None without steps."""
        if not self.active:
            return None
        active = np.concatenate(self.active).astype(np.int64)
        mean = pc.mean(pa.array(active / self.usable)).as_py()
        return {"kv_usage_mean": float(mean), "kv_usage_max": float(self.kv_max),
                "kv_physical_usage_max": float(self.phys_max)}


# DuckDB's row group size: staged files made of whole row groups land without re-splitting.
ROW_GROUP = 122_880
# Rows per staged requests/steps file.
FILE_ROWS = 8 * ROW_GROUP


def shard_dir(shard_id: int) -> str:
    """The shard's directory inside the run's staging directory."""
    return f"shards/{shard_id:05d}"


def write_results(desc: dict, shard: dict, summary: dict, requests, steps, replicas=()) -> dict:
    """Write a shard's one-row tables to the run's staging directory; return the small part the driver needs.

    Parameters
    ----------
    desc : dict
        The shard task's description: ``run_id``, ``shard_id`` and ``staging``
        (:class:`~aisim.pipeline.staging.Staging`).
    shard, summary : dict
        The shard's one ``shards`` and ``summaries`` row.
    requests, steps : _Pieces
        The rows, staged as they came (closed here).
    replicas : list of dict
        A deployment shard's ``replicas`` rows (none for a single engine).

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
    rel = f"{base}/replicas.parquet"  # no rows for a single engine
    staging.write_parquet(staging.run_path(run_id, rel), pa.Table.from_pylist(list(replicas), schema=REPLICA_SCHEMA))
    files["replicas"], rows["replicas"] = [rel], len(replicas)
    for pieces in (requests, steps):
        files[pieces.name], rows[pieces.name] = pieces.close()
    return {"shard": shard, "summary": summary, "files": files, "rows": rows}


class _Pieces:
    """Rows that arrive in pieces of any size, staged as ``STEM-00000.parquet``, ``STEM-00001.parquet``, ...
    of :data:`FILE_ROWS` rows each (one empty file when there are none), in order.

    Each file is written a row group (:data:`ROW_GROUP` rows) at a time, so at
    most a row group waits in memory; a file appears under its name when it
    is complete.
    """

    def __init__(self, desc: dict, name: str, schema):
        self.staging, self.run_id = desc["staging"], desc["run_id"]
        self.name, self.schema = name, schema
        self.stem = f"{shard_dir(desc['shard_id'])}/{name}"
        self.names, self.total, self.pending, self.held = [], 0, [], 0
        self.file = self.writer = None
        self.in_file = 0

    def add(self, table: pa.Table) -> None:
        for batch in table.to_batches():
            self.pending.append(batch)
            self.held += batch.num_rows
            self.total += batch.num_rows
            while self.held >= min(ROW_GROUP, FILE_ROWS - self.in_file):
                n = min(ROW_GROUP, FILE_ROWS - self.in_file)
                whole = pa.Table.from_batches(self.pending, schema=self.schema)
                self._write(whole.slice(0, n))
                rest = whole.slice(n)
                self.pending, self.held = rest.to_batches(), rest.num_rows

    def _write(self, table: pa.Table) -> None:
        import pyarrow.parquet as pq

        if self.writer is None:
            rel = f"{self.stem}-{len(self.names):05d}.parquet"
            self.file = self.staging.open_atomic(self.staging.run_path(self.run_id, rel))
            self.writer = pq.ParquetWriter(self.file, self.schema, compression=STAGED_COMPRESSION)
            self.names.append(rel)
        self.writer.write_table(table, row_group_size=ROW_GROUP)
        self.in_file += table.num_rows
        if self.in_file >= FILE_ROWS:
            self._end_file()

    def _end_file(self) -> None:
        self.writer.close()
        self.file.__exit__(None, None, None)
        self.file = self.writer = None
        self.in_file = 0

    def close(self):
        """``(files, rows)``: the staged files and the rows in them."""
        if self.held or not self.names:
            self._write(pa.Table.from_batches(self.pending, schema=self.schema))
            self.pending, self.held = [], 0
        if self.writer is not None:
            self._end_file()
        return self.names, self.total


def _sources(parts) -> list:
    """Per input file (in file order) the rows it gave the shard."""
    rows = {}
    for display, p in parts:
        rows[display] = rows.get(display, 0) + p["rows"]
    return [{"path": d, "rows": n} for d, n in rows.items()]


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


def _requests_table(desc: dict, trace: pa.Table, requests: pa.Table, first: int = 0) -> pa.Table:
    """The shard's ``requests`` rows (trace indices from ``first``): keys and trace columns in front of
    the replay's (NaN as NULL); a deployment's ``replica``, ``routed_s`` and ``transfer_s`` when
    ``requests`` has them, else NULL."""
    n = requests.num_rows
    cols = _key_columns(desc, n)
    cols["request_index"] = pa.array(np.arange(first, first + n, dtype=np.int32))
    for name in ("session_id", "turn", "priority"):
        cols[name] = trace.column(name)
    for name in requests.column_names:
        cols[name] = _null_nan(requests.column(name))
    return pa.Table.from_arrays([cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in REQUEST_SCHEMA],
                                schema=REQUEST_SCHEMA)


def _steps_table(desc: dict, steps: pa.Table) -> pa.Table:
    """The shard's ``steps`` rows: keys in front of the replay's step columns (``replica``: a
    deployment's, else NULL)."""
    n = steps.num_rows
    cols = _key_columns(desc, n)
    for name in steps.column_names:
        cols[name] = steps.column(name)
    return pa.Table.from_arrays([cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in STEP_SCHEMA],
                                schema=STEP_SCHEMA)


def summary_row(desc: dict, summary: dict, kv) -> dict:
    """The one ``summaries`` row of a shard: the replay summary, flattened (:func:`flatten`).

    The whole summary is kept as ``summary_json`` too.
    """
    row = flatten(SUMMARIES, desc, summary, kv)
    row["summary_json"] = canonical_json(summary)
    return row


def flatten(table, desc: dict, summary: dict, kv) -> dict:
    """A replay summary as one row of ``table`` (``summaries``, or a replica's ``replicas`` row).

    Each column of ``table`` with a ``summary`` path takes that value of the
    summary (``("ttft_s", "p50")`` for ``ttft_p50_s``); integers missing from it
    count 0, floats missing or NaN are NULL.  KV-cache usage mean and peak come
    from the steps (``kv``, a :class:`_KvUsage`).
    """
    row = {"run_id": desc["run_id"], "shard_id": desc["shard_id"]}
    for col in table.columns:
        if col.summary is None:
            continue
        v = summary
        for key in col.summary:
            v = (v or {}).get(key)
        if col.sql in ("BIGINT", "INTEGER"):
            row[col.name] = int(v or 0)
        elif col.sql == "VARCHAR":
            row[col.name] = v
        else:
            row[col.name] = None if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)
    usage = kv.columns()
    for name in ("kv_usage_mean", "kv_usage_max", "kv_physical_usage_max"):
        row[name] = usage[name] if usage is not None else None
    return {c.name: row[c.name] for c in table.columns if c.name in row}  # the table's order
