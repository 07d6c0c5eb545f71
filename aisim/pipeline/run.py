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
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from aisim.pipeline.spec import PipelineError, PipelineSpec, canonical_json, load_spec, resolve_inputs, run_key

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
            "engine_config": eng.config, "engine_source": eng.source, "engine_path": eng.path,
            "replay": dict(spec.replay),
            "reads": relevant,
        })
    return {"reads": reads, "shards": shards}


class Quiet:
    """A progress reporter that reports nothing (the interface of all of them)."""

    def start(self, run_id: str, name: str, plan: dict, scheduler: str) -> None:
        """The shards are about to be computed."""

    def event(self, event: str, kind: str, index: int, payload) -> None:
        """A task started running (``"running"``) or finished (``"done"``)."""

    def landing(self) -> None:
        """Computation finished; the landing transaction starts."""

    def stop(self) -> None:
        """The run ended (landed, skipped or failed)."""


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
    if scheduler not in ("sync", "local") and workers:
        raise PipelineError("--workers sizes a local cluster; an existing scheduler has its own workers")
    if scheduler == "sync" and workers not in (None, 1):
        raise PipelineError("the synchronous scheduler runs one task at a time; drop --workers or use 'local'")
    if workers is not None and workers < 1:
        raise PipelineError(f"--workers must be at least 1, got {workers}")
    db = os.path.abspath(database or spec.database)
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
    import aisim

    return {
        "run_id": run_id,
        "name": spec.name,
        "description": spec.description,
        "spec_path": spec.path,
        "spec": canonical_json(spec.canonical()),
        "inputs": canonical_json([f.fingerprint() for f in inputs]),
        "aisim_version": aisim.__version__,
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


# ---------------------------------------------------------------------------- progress and summary


class RichProgress(Quiet):
    """Live progress on a terminal: one bar per shard and one for the run.

    A shard's bar fills when its replay is done (a replay is one call into
    the compiled core, so there is nothing finer to show); its status says
    whether it waits, runs or finished, with its requests and task time.
    """

    def __init__(self, console):
        self.console = console
        self.progress = None

    def start(self, run_id, name, plan, scheduler):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.plan = plan
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=24),
                                 TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                                 console=self.console, transient=False)
        self.progress.start()
        self.overall = self.progress.add_task(f"[bold]run {name} ({run_id[:8]})", total=len(plan["shards"]),
                                              status=f"0/{len(plan['shards'])} shards on {scheduler}")
        self.bars = []
        for s in plan["shards"]:
            self.bars.append(self.progress.add_task(f"  {s['shard_id']}: {s['model']} / {s['engine']}", total=1,
                                                    status="waiting", start=False))
        self.done = 0

    def event(self, event, kind, index, payload):
        if kind != "shard":
            return
        bar = self.bars[index]
        if event == "running":
            self.progress.start_task(bar)
            self.progress.update(bar, status="replaying")
        elif event == "done":
            row = payload["shards"].to_pylist()[0]
            self.progress.start_task(bar)
            self.progress.update(bar, completed=1, status=f"{row['requests']:,} requests in {row['task_s']:.2f} s")
            self.progress.stop_task(bar)
            self.done += 1
            self.progress.update(self.overall, completed=self.done,
                                 status=f"{self.done}/{len(self.bars)} shards")

    def landing(self):
        self.progress.update(self.overall, status="landing in DuckDB")

    def stop(self):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class LineProgress(Quiet):
    """Progress as plain lines (logs, cron mail): one line per finished shard."""

    def __init__(self, console):
        self.console = console

    def start(self, run_id, name, plan, scheduler):
        self.n = len(plan["shards"])
        self.done = 0
        self.console.print(f"run {name} ({run_id}): {self.n} shards, {len(plan['reads'])} input files, "
                           f"scheduler {scheduler}")

    def event(self, event, kind, index, payload):
        if kind == "shard" and event == "done":
            self.done += 1
            row = payload["shards"].to_pylist()[0]
            self.console.print(f"[{self.done}/{self.n}] shard {index} {row['model']} / {row['engine']}: "
                               f"{row['requests']:,} requests in {row['task_s']:.2f} s")

    def landing(self):
        self.console.print("landing in DuckDB")


def _ms(v):
    if v is None:
        return "-"
    return f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s"


def print_summary(report: RunReport, console) -> None:
    """One screen: the run, its shards' headline numbers, where the rows went."""
    from rich.table import Table

    if not report.landed:
        console.print(f"run {report.name} ({report.run_id}) is already in {report.database}; nothing to do "
                      "(--force replaces it)")
        return

    verb = "replaced" if report.replaced else "landed"
    t = Table(title=f"run {report.name} ({report.run_id}), #{report.run_seq} in {report.database}",
              title_justify="left", box=None, pad_edge=False, header_style="bold underline")
    t.add_column("#", justify="right", no_wrap=True)
    width = max((len(f"{s['model']} / {s['engine']}") for s in report.shards), default=14)
    t.add_column("model / engine", min_width=min(width, 48), overflow="fold")
    for col in ("requests", "TTFT p50", "TTFT p99", "TPOT p50", "tok/s", "hit rate", "preempt", "KV peak"):
        t.add_column(col, justify="right", no_wrap=True)
    for s in report.shards:
        hit = s.get("prefix_hit_rate")
        kv = s.get("kv_usage_max")
        tok = s.get("throughput_tok_s")
        done, n = s.get("finished") or 0, s["requests"]
        t.add_row(str(s["shard_id"]), f"{s['model']} / {s['engine']}",
                  f"{n:,}" if done == n else f"{done:,}/{n:,}",
                  _ms(s.get("ttft_p50_s")), _ms(s.get("ttft_p99_s")), _ms(s.get("tpot_p50_s")),
                  "-" if tok is None else f"{tok:,.0f}", "-" if hit is None else f"{100 * hit:.1f}%",
                  f"{s.get('preemptions') or 0:,}", "-" if kv is None else f"{100 * kv:.1f}%")
    console.print(t)
    rows = report.rows_landed
    rate = rows / report.land_s if report.land_s > 0 else 0.0
    console.print(f"{verb} {rows:,} rows ({report.rows.get('requests', 0):,} requests, "
                  f"{report.rows.get('steps', 0):,} steps) in {report.land_s:.2f} s ({rate:,.0f} rows/s)")
    console.print(f"read {report.rows_read:,} trace rows, {report.rows_in_window:,} in the window"
                  + (f"; the readers skipped {report.rows_bad:,} malformed rows" if report.rows_bad else "")
                  + (f"; skipped {report.rows_skipped:,} of models without a deployment: "
                     + ", ".join(f"{m or '(none)'} {n:,}" for m, n in report.skipped_models.items())
                     if report.rows_skipped else ""))
    start = f"cluster start {report.startup_s:.1f} s; " if report.startup_s >= 0.05 else ""
    console.print(f"wall {report.wall_s:.1f} s ({start}shards {report.compute_s:.1f} s on {report.scheduler}, "
                  f"{report.workers} worker{'s' if report.workers != 1 else ''}; landing {report.land_s:.2f} s)")
    console.print(f"next: aisim query shards --db {report.database}")
