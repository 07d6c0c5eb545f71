"""Running a pipeline: spec -> run key -> Dask graph -> staged Parquet -> one DuckDB transaction.

:func:`run_pipeline` is the whole batch job:

1. load the spec, expand its globs and fingerprint every input file; check,
   before any replay, that the database can take the run and the staging
   location (:mod:`aisim.pipeline.staging`) can be written;
2. compute the run key; if the database already holds that run (and
   ``force`` is off) stop: re-running lands nothing twice;
3. plan the read tasks of every input file and one shard per (model, engine
   configuration), in a fixed order (models sorted, then engine names), and
   run them on the chosen scheduler (:mod:`aisim.pipeline.graph`): the shard
   tasks write their rows to the run's staging directory and return only
   their summaries; the driver writes the run's manifest there;
4. land every shard's rows in one transaction (:mod:`aisim.pipeline.landing`),
   shard by shard in shard order, each shard's rows in key order, so that the
   database contents do not depend on the scheduler or the number of workers;
   then remove the staging directory.  When landing fails (the lock stays
   taken past the timeout, a full disk, Ctrl-C) the staged run stays, and
   :func:`land_run` (``aisim pipeline land RUN``) lands it later without
   replaying anything.

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

from aisim.columns import TABLES
from aisim.errors import PipelineError
from aisim.pipeline.progress import Quiet
from aisim.pipeline.runkey import canonical_json, resolve_inputs, run_key
from aisim.pipeline.spec import PipelineSpec, load_spec
from aisim.pipeline.staging import MANIFEST, MANIFEST_FORMAT

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


def build_plan(spec: PipelineSpec, inputs: list, run_id: str, staging=None) -> dict:
    """The run's tasks as plain dictionaries (see :func:`aisim.pipeline.graph.build_graph`).

    ``staging`` (a :class:`~aisim.pipeline.staging.Staging`) is where the
    tasks write; None plans without one (``aisim pipeline check``).
    """
    from aisim.pipeline.reads import plan_blocks
    from aisim.traces.blocks import BLOCK_BYTES

    models = list(spec.models)
    reads = []
    for j, f in enumerate(inputs):
        src = spec.sources[f.source]
        reads.append({
            "index": j, "run_id": run_id, "staging": staging,
            "path": f.path, "display": f.display, "source": src.name, "format": f.format,
            "options": dict(src.options), "model": src.model, "model_column": src.model_column,
            "model_map": dict(src.model_map), "request_id_prefix": src.request_id_prefix,
            "window": spec.window.to_dict(), "models": models,
            "blocks": plan_blocks(f.path, f.format, dict(src.options), BLOCK_BYTES),
        })
    shards = []
    for i, (model, eng) in enumerate(spec.shards()):
        relevant = [j for j, r in enumerate(reads) if r["model"] is None or r["model"] == model]
        shards.append({
            "run_id": run_id, "shard_id": i, "model": model, "engine": eng.name,
            "engine_config": eng.engine, "engine_source": eng.source, "engine_path": eng.path,
            "deployment": eng.deployment,
            "replay": dict(spec.replay), "staging": staging,
            "reads": relevant,
        })
    searches = []  # a plugged-in section's question, asked of every shard (aisim.pipeline.sections)
    for key in sorted(spec.sections):
        from aisim.pipeline.sections import section

        plugged = section(key)
        for sh in shards:
            searches.append({k: sh[k] for k in ("run_id", "shard_id", "model", "engine", "engine_config",
                                                "engine_source", "engine_path", "deployment", "staging", "reads")}
                            | {"key": key, "table": plugged.table, "section": spec.sections[key],
                               "task": plugged.task})
    return {"reads": reads, "shards": shards, "searches": searches}


def staging_for(spec: PipelineSpec | None, database: str, location: str | None = None):
    """The staging location of a run: ``location``, else the spec's ``landing.staging``, else beside the database."""
    from aisim.pipeline.staging import Staging, default_staging

    if location is None and spec is not None:
        location = spec.landing.staging
    return Staging(location or default_staging(database))


def parquet_store(spec: PipelineSpec | None, database: str, location: str | None = None):
    """The Parquet store of a ``keep_parquet`` run (``landing.parquet_dir``, else ``<database>.parquet``)."""
    from aisim.pipeline.staging import Staging

    if location is None and spec is not None:
        location = spec.landing.parquet_dir
    return Staging(location or os.path.abspath(database) + ".parquet")


def run_pipeline(spec, *, scheduler: str = "local", workers: int | None = None, force: bool = False,
                 database: str | None = None, progress=None, wait_s: float | None = None,
                 staging: str | None = None) -> RunReport:
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
    wait_s : float, optional
        How long landing waits for another process's database lock (default:
        the spec's ``landing.lock_timeout_s``).
    staging : str, optional
        Stage the results here instead of the spec's ``landing.staging``.

    Returns
    -------
    RunReport

    Raises
    ------
    SpecError, ShardFailed, PipelineError
        Nothing is landed and nothing stays staged.
    LandingFailed, DatabaseLocked
        Landing failed (the lock stayed taken past ``wait_s``); nothing is
        landed, and the run stays staged for :func:`land_run`.
    LandingInterrupted
        Ctrl-C during landing; likewise.
    """
    from aisim.pipeline import landing

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
    wait_s = spec.landing.lock_timeout_s if wait_s is None else wait_s
    db = os.path.abspath(database or spec.database)
    keep = spec.landing.keep_parquet
    landing.check_database(db, keep)
    stage = staging_for(spec, db, staging)
    store = parquet_store(spec, db) if keep else None
    try:
        return _run_staged(spec, scheduler, workers, force, db, stage, store, wait_s, progress, t0, started)
    finally:
        # Every way out, the no-op ones included (nothing to read, a run already landed), leaves no empty
        # staging or store folder behind; a run whose landing failed stays staged (the folder is not empty).
        stage.remove_if_empty()
        if store is not None:
            store.remove_if_empty()


def _run_staged(spec, scheduler, workers, force, db, stage, store, wait_s, progress, t0, started) -> RunReport:
    from aisim.pipeline import graph, landing

    stage.check_writable()
    if store is not None:
        store.check_writable()
    inputs = resolve_inputs(spec)
    run_id = run_key(spec, inputs)
    report = RunReport(run_id=run_id, name=spec.name, database=db)
    if not force and landing.run_landed(db, run_id, locked_ok=True):
        report.wall_s = time.perf_counter() - t0
        return report
    plan = build_plan(spec, inputs, run_id, stage)
    progress = progress or Quiet()
    progress.start(run_id, spec.name, plan, scheduler)
    try:
        t1 = time.perf_counter()
        try:
            stage.remove_run(run_id)  # what an earlier, unfinished attempt left
            results, stats, info = graph.execute(plan, scheduler=scheduler, workers=workers,
                                                 on_event=progress.event)
            report.startup_s = info["startup_s"]
            report.compute_s = time.perf_counter() - t1 - report.startup_s
            report.scheduler, report.workers = info["scheduler"], info["workers"]
            _count_rows(report, stats)
            if report.rows_in_window == 0:
                raise PipelineError(f"the window {_window_text(spec)} selects none of the {report.rows_read} rows "
                                    "read; nothing is landed")
            run = _run_row(spec, inputs, run_id, report, results, started)
            run["wall_s"] = time.perf_counter() - t0
            stage.write_json(stage.run_path(run_id, MANIFEST), manifest(run, results, db, info.get("searches", ())))
        except BaseException:
            _discard(stage, run_id)
            raise
        progress.landing()
        t2 = time.perf_counter()
        out = _land(db, stage, run_id, force, wait_s, store)
        report.land_s = time.perf_counter() - t2
    finally:
        progress.stop()
    report.landed, report.replaced, report.run_seq = out["landed"], out["replaced"], out["run_seq"]
    report.rows = out["rows"]
    report.shards = _shard_rows(results)
    report.wall_s = time.perf_counter() - t0
    return report


def _discard(stage, run_id) -> None:
    try:
        stage.remove_run(run_id)
    except Exception:  # best effort: the error that got us here matters more
        pass


def _land(db, stage, run_id, force, wait_s, store) -> dict:
    """Land the staged run, then remove it from staging; on failure it stays, and the error says how to land it."""
    from aisim.errors import DatabaseLocked, LandingFailed, LandingInterrupted
    from aisim.pipeline import landing

    later = land_command(run_id, db, stage)
    try:
        out = landing.land_staged(db, stage, run_id, force=force, wait_s=wait_s, store=store)
    except KeyboardInterrupt:
        raise LandingInterrupted(f"interrupted while landing; nothing was landed, and the results stay staged in "
                                 f"{stage.run_path(run_id)}: {later}") from None
    except (PipelineError, OSError) as exc:  # OSError: a full disk, a file the system refuses
        kind = DatabaseLocked if isinstance(exc, DatabaseLocked) else LandingFailed
        what = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.filename and exc.strerror \
            else exc
        raise kind(f"{what}; the results stay staged in {stage.run_path(run_id)}: {later}") from None
    _discard(stage, run_id)
    return out


def land_command(run_id: str, db: str, stage) -> str:
    """The command that lands a staged run later."""
    from aisim.pipeline.staging import default_staging

    where = "" if stage.location == default_staging(db) else f" --staging {stage.location}"
    return f"aisim pipeline land {run_id} --db {db}{where}"


def manifest(run: dict, results: list, db: str, searches: tuple = ()) -> dict:
    """The run's ``run.json``: the ``runs`` row, every staged file in landing order, the shards' summaries.

    ``searches``: what the plugged-in sections' tasks staged (:func:`aisim.pipeline.shards.run_search`).
    """
    row = dict(run)
    if row.get("started_at") is not None:
        row["started_at"] = row["started_at"].isoformat()
    files = {t: [f for r in results for f in r["files"][t]] for t in list(TABLES)[1:]}
    rows = {t: sum(r["rows"][t] for r in results) for t in files}
    for r in searches:  # the plugged-in sections' tables, in search order
        for t, fs in r["files"].items():
            files.setdefault(t, []).extend(fs)
            rows[t] = rows.get(t, 0) + r["rows"][t]
    return {"format": MANIFEST_FORMAT, "run": row, "database": db, "files": files, "rows": rows,
            "shards": _shard_rows(results)}


def land_run(run_id: str, *, database: str | None = None, staging: str | None = None, spec=None,
             force: bool = False, wait_s: float | None = None) -> RunReport:
    """Land a run that stayed staged (its landing failed), without replaying anything.

    Parameters
    ----------
    run_id : str
        The run key (``runs.run_id``), as the failed run's message gave it.
    database : str, optional
        Land here; default: the spec's database, else the one the run was meant for.
    staging : str, optional
        Where the run is staged; default: the spec's ``landing.staging``, else
        beside the database.
    spec : PipelineSpec or path-like, optional
        The run's spec, for its database, staging location and landing options.
    force : bool
        Replace the run if the database has it already.
    wait_s : float, optional
        How long to wait for the database lock (default: the spec's, else 60 s).

    Returns
    -------
    RunReport
        ``landed`` is False when the database already had the run; the staged
        files are removed either way once the database holds the run.

    Raises
    ------
    PipelineError
        No such staged run (the message lists the staged runs), or a database
        that cannot take it.
    LandingFailed, LandingInterrupted
        As :func:`run_pipeline`; the run stays staged.
    """
    from aisim.pipeline import landing
    from aisim.pipeline.spec import LOCK_TIMEOUT_S

    t0 = time.perf_counter()
    if spec is not None and not isinstance(spec, PipelineSpec):
        spec = load_spec(spec)
    if database is None and spec is None and staging is None:
        raise PipelineError("give --db (the database the run lands in), --spec or --staging")
    if database is None and spec is not None:
        database = spec.database
    stage = staging_for(spec, os.path.abspath(database) if database else "", staging)
    found = landing.read_manifest(stage, run_id)
    db = os.path.abspath(database or found["database"])
    keep = spec.landing.keep_parquet if spec is not None else False
    landing.check_database(db, keep)
    store = parquet_store(spec, db) if keep else None
    if wait_s is None:
        wait_s = spec.landing.lock_timeout_s if spec is not None else LOCK_TIMEOUT_S
    run = found["run"]
    report = RunReport(run_id=run_id, name=run["name"], database=db, scheduler=run.get("scheduler") or "",
                       workers=run.get("workers") or 0)
    t1 = time.perf_counter()
    out = _land(db, stage, run_id, force, wait_s, store)
    report.land_s = time.perf_counter() - t1
    report.landed, report.replaced, report.run_seq = out["landed"], out["replaced"], out["run_seq"]
    report.rows = out["rows"]
    report.shards = found.get("shards", [])
    for k in ("rows_read", "rows_in_window", "rows_skipped", "rows_bad"):
        setattr(report, k, run.get(k, 0))
    report.skipped_models = json.loads(run.get("skipped_models") or "{}")
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


def _run_row(spec, inputs, run_id, report, results, started) -> dict:
    from aisim import __version__

    return {
        "run_id": run_id,
        "name": spec.name,
        "description": spec.description,
        "spec_path": spec.path,
        "spec": canonical_json(spec.canonical()),
        "inputs": canonical_json([f.fingerprint() for f in inputs]),
        "aisim_version": __version__,
        "shards": len(results),
        "requests": sum(r["rows"]["requests"] for r in results),
        "steps": sum(r["rows"]["steps"] for r in results),
        "rows_read": report.rows_read,
        "rows_in_window": report.rows_in_window,
        "rows_skipped": report.rows_skipped,
        "rows_bad": report.rows_bad,
        "skipped_models": json.dumps(report.skipped_models, sort_keys=True),
        "started_at": started,
        "scheduler": report.scheduler,
        "workers": report.workers,
    }


def _shard_rows(results: list) -> list:
    """Each shard's ``shards`` row merged with its ``summaries`` row (without the summary's JSON)."""
    out = []
    for r in results:
        summary = {k: v for k, v in r["summary"].items() if k != "summary_json"}
        out.append({**summary, **r["shard"]})
    return out
