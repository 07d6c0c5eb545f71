"""Running a pipeline: spec -> run key -> Dask graph -> one DuckDB transaction.

:func:`run_pipeline` is the whole batch job:

1. load the spec, expand its globs and fingerprint every input file;
2. compute the run key; if the database already holds that run (and
   ``force`` is off) stop: re-running lands nothing twice;
3. plan one read task per input file and one shard per (model, engine
   configuration), in a fixed order (models sorted, then engine names), and
   run them on the chosen scheduler (:mod:`aisim.pipeline.graph`);
4. land every shard's rows in one transaction (:mod:`aisim.pipeline.landing`),
   shard by shard in shard order, each shard's rows in key order, so that the
   database contents do not depend on the scheduler or the number of workers.

Only the ``runs`` columns ``started_at``, ``landed_at``, ``wall_s``,
``scheduler`` and ``workers`` and the ``shards`` column ``task_s`` record how
and when the run happened; every other column is a function of the spec and
its input files.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from aisim.errors import PipelineError
from aisim.pipeline.progress import Quiet
from aisim.pipeline.spec import PipelineSpec, canonical_json, load_spec, resolve_inputs, run_key

# Columns that record how and when a run happened rather than what it computed.
BOOKKEEPING = {"runs": ("started_at", "landed_at", "wall_s", "scheduler", "workers"), "shards": ("task_s",)}


@dataclass
class RunReport:
    """What :func:`run_pipeline` did.

    Attributes
    ----------
    run_id, name, database : str
    landed : bool
        False when the run was already in the database (nothing was done).
    replaced : bool
        The run was there and ``force`` replaced it.
    run_seq : int or None
    shards : list of dict
        One per shard: the ``shards`` row merged with its ``summaries`` row.
    rows : dict
        Rows landed per table.
    rows_read, rows_in_window, rows_skipped, rows_bad : int
    skipped_models : dict
        Model -> rows skipped for want of a deployment.
    scheduler : str
    workers : int
    wall_s, startup_s, compute_s, land_s : float
        Whole run; starting the cluster (or connecting to it); running the
        tasks; the landing transaction.
    """

    run_id: str
    name: str
    database: str
    landed: bool = False
    replaced: bool = False
    run_seq: int | None = None
    shards: list = field(default_factory=list)
    rows: dict = field(default_factory=dict)
    rows_read: int = 0
    rows_in_window: int = 0
    rows_skipped: int = 0
    rows_bad: int = 0
    skipped_models: dict = field(default_factory=dict)
    scheduler: str = ""
    workers: int = 0
    wall_s: float = 0.0
    startup_s: float = 0.0
    compute_s: float = 0.0
    land_s: float = 0.0

    @property
    def rows_landed(self) -> int:
        return sum(self.rows.values())


def build_plan(spec: PipelineSpec, inputs: list, run_id: str) -> dict:
    """The run's tasks as plain dictionaries (see :func:`aisim.pipeline.graph.build_graph`)."""
    models = list(spec.models)
    reads = []
    for f in inputs:
        src = spec.sources[f.source]
        reads.append({
            "path": f.path, "display": f.display, "source": src.name, "format": f.format,
            "options": dict(src.options), "model": src.model, "model_column": src.model_column,
            "model_map": dict(src.model_map), "request_id_prefix": src.request_id_prefix,
            "window": spec.window.to_dict(), "models": models,
        })
    shards = []
    for i, (model, eng) in enumerate(spec.shards()):
        relevant = [j for j, r in enumerate(reads) if r["model"] is None or r["model"] == model]
        shards.append({
            "run_id": run_id, "shard_id": i, "model": model, "engine": eng.name,
            "engine_config": eng.engine, "engine_source": eng.source, "engine_path": eng.path,
            "replay": dict(spec.replay),
            "reads": relevant,
        })
    return {"reads": reads, "shards": shards}


def run_pipeline(spec, *, scheduler: str = "local", workers: int | None = None, force: bool = False,
                 database: str | None = None, progress=None, wait_s: float = 10.0) -> RunReport:
    """Run a pipeline spec and land its results.

    Parameters
    ----------
    spec : PipelineSpec or path-like
        The spec, or its TOML file.
    scheduler : str
        ``"sync"`` (in process, for debugging and tests), ``"local"`` (a
        ``distributed.LocalCluster`` sized to the machine) or the address of
        a running Dask scheduler.
    workers : int, optional
        Processes of the local cluster.
    force : bool
        Replace the run's rows if the database already has the run.
    database : str, optional
        Land here instead of the spec's ``database``.
    progress : object, optional
        A reporter with the methods of :class:`Quiet` (default: quiet).
    wait_s : float
        How long landing waits for another process's database lock.

    Returns
    -------
    RunReport

    Raises
    ------
    SpecError, ShardFailed, DatabaseLocked, PipelineError
        Nothing is landed in any of these cases.
    """
    from aisim.pipeline import graph, landing

    t0 = time.perf_counter()
    started = datetime.now(timezone.utc)
    if not isinstance(spec, PipelineSpec):
        spec = load_spec(spec)
    check_scheduler(scheduler)
    if scheduler not in ("sync", "local") and workers:
        raise PipelineError("--workers sizes a local cluster; an existing scheduler has its own workers")
    if scheduler == "sync" and workers not in (None, 1):
        raise PipelineError("the synchronous scheduler runs one task at a time; drop --workers or use 'local'")
    if workers is not None and workers < 1:
        raise PipelineError(f"--workers must be at least 1, got {workers}")
    db = os.path.abspath(database or spec.database)
    landing.check_database(db)
    inputs = resolve_inputs(spec)
    run_id = run_key(spec, inputs)
    report = RunReport(run_id=run_id, name=spec.name, database=db)
    if not force and landing.run_landed(db, run_id):
        report.wall_s = time.perf_counter() - t0
        return report
    plan = build_plan(spec, inputs, run_id)
    progress = progress or Quiet()
    progress.start(run_id, spec.name, plan, scheduler)
    try:
        t1 = time.perf_counter()
        results, stats, info = graph.execute(plan, scheduler=scheduler, workers=workers, on_event=progress.event)
        report.startup_s = info["startup_s"]
        report.compute_s = time.perf_counter() - t1 - report.startup_s
        report.scheduler, report.workers = info["scheduler"], info["workers"]
        tables = _concat(results)
        _count_rows(report, stats)
        if report.rows_in_window == 0:
            raise PipelineError(f"the window {_window_text(spec)} selects none of the {report.rows_read} rows read; "
                                "nothing is landed")
        run = _run_row(spec, inputs, run_id, report, tables, started)
        progress.landing()
        t2 = time.perf_counter()
        run["wall_s"] = t2 - t0
        out = landing.land(db, run, tables, force=force, wait_s=wait_s)
        report.land_s = time.perf_counter() - t2
    finally:
        progress.stop()
    report.landed, report.replaced, report.run_seq = out["landed"], out["replaced"], out["run_seq"]
    report.rows = out["rows"]
    report.shards = _shard_rows(tables)
    report.wall_s = time.perf_counter() - t0
    return report


# A Dask scheduler address: [tcp:// or tls://]host:port, the host a name, an IPv4 address or [IPv6].
_ADDRESS = re.compile(r"^(?:(?:tcp|tls)://)?(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
                      r":(\d{1,5})$")


def check_scheduler(scheduler) -> None:
    """Refuse a scheduler that is neither ``sync``, ``local`` nor a ``[tcp://]host:port`` address.

    Raises
    ------
    PipelineError
        Naming the value.
    """
    if scheduler in ("sync", "local"):
        return
    m = _ADDRESS.match(scheduler) if isinstance(scheduler, str) else None
    if m is None or not 1 <= int(m.group(1)) <= 65535:
        raise PipelineError(f"--scheduler must be 'local', 'sync' or a Dask scheduler address "
                            f"(tcp://host:port or host:port), got {scheduler!r}")


def _window_text(spec) -> str:
    bounds = {k: v for k, v in spec.window.to_dict().items() if v is not None}
    return "(" + ", ".join(f"{k} = {v}" for k, v in bounds.items()) + ")" if bounds else "(none)"


def _concat(results: list) -> dict:
    import pyarrow as pa

    out = {}
    for name in ("shards", "summaries", "requests", "steps"):
        parts = [r[name] for r in results]
        out[name] = pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]
    return out


def _count_rows(report: RunReport, stats: list) -> None:
    skipped = {}
    for s in stats:
        report.rows_read += s["rows"]
        report.rows_in_window += s["in_window"]
        report.rows_bad += s["bad_rows"]
        for model, n in s["skipped"].items():
            skipped[model] = skipped.get(model, 0) + n
    report.skipped_models = dict(sorted(skipped.items()))
    report.rows_skipped = sum(skipped.values())


def _run_row(spec, inputs, run_id, report, tables, started) -> dict:
    from aisim import __version__

    return {
        "run_id": run_id,
        "name": spec.name,
        "description": spec.description,
        "spec_path": spec.path,
        "spec": canonical_json(spec.canonical()),
        "inputs": canonical_json([f.fingerprint() for f in inputs]),
        "aisim_version": __version__,
        "shards": tables["shards"].num_rows,
        "requests": tables["requests"].num_rows,
        "steps": tables["steps"].num_rows,
        "rows_read": report.rows_read,
        "rows_in_window": report.rows_in_window,
        "rows_skipped": report.rows_skipped,
        "rows_bad": report.rows_bad,
        "skipped_models": json.dumps(report.skipped_models, sort_keys=True),
        "started_at": started,
        "scheduler": report.scheduler,
        "workers": report.workers,
    }


def _shard_rows(tables: dict) -> list:
    shards = tables["shards"].to_pylist()
    sums = {r["shard_id"]: r for r in tables["summaries"].drop_columns(["summary_json"]).to_pylist()}
    return [{**sums.get(s["shard_id"], {}), **s} for s in shards]
