"""What the report shows, read from a run database.

:func:`load_run` opens the database read-only, picks one run and reads, per
shard (model x engine configuration), its ``shards`` and ``summaries`` rows,
the step time series and the request latencies.  Every value is read with
bound parameters; nothing from the command line is pasted into SQL.

Runs are chosen as ``aisim query`` chooses them (the SQL library's
``resolve_run``, through :func:`aisim.query.runner.pick_run`): an exact run
id, else the latest run of that name, else the one run whose id starts with
the given text; a prefix of several run ids is an error.  Without ``--run``
the latest run (highest ``run_seq``) is reported.  The database is opened
with the one :func:`aisim.pipeline.landing.connect`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from aisim.columns import LATENCIES, TABLES
from aisim.errors import AisimError, ReportError


# Step columns the report reads (in this order), and the request columns: selections of the
# column catalogue (aisim.columns; a test checks they are in it).
STEP_COLUMNS = (
    "step", "clock_s", "duration_s", "num_reqs", "prefill_tokens", "decode_tokens", "num_preempted",
    "num_resumed", "num_finished", "running", "waiting", "active_blocks", "cached_blocks", "kv_usage",
    "physical_usage", "kv_cache_active_bytes", "kv_cache_cached_bytes", "prefix_queries", "prefix_hits",
    "spec_tokens", "spec_accepted", "offload_cpu_used", "offload_load_chunks", "offload_store_chunks",
    "offload_disk_read_chunks", "offload_disk_write_chunks", "offload_disk_chunks",
)
REQUEST_COLUMNS = ("arrival_s", "ttft_s", "tpot_s", "e2e_s", "prompt_tokens", "output_tokens", "cached_tokens",
                   "preemptions", "spec_drafts", "spec_accepted", "offload_hit_tokens")


@dataclass
class ShardData:
    """One shard of the run: its rows, step series and request columns (numpy, full length).

    Attributes
    ----------
    shard : dict
        The ``shards`` row (engine configuration parsed into ``config``).
    summary : dict
        The ``summaries`` row (``summary_json`` parsed into ``summary_detail``), or {}.
    steps : dict of numpy.ndarray
        :data:`STEP_COLUMNS`, ordered by step (a deployment's: by start time, every
        replica's steps); NULL as NaN.
    requests : dict of numpy.ndarray
        :data:`REQUEST_COLUMNS` in request order; NULL as NaN.
    status : dict
        Request status -> count.
    replicas : list of dict
        A deployment shard's ``replicas`` rows, by replica; [] for a single engine.
    """

    shard: dict
    summary: dict
    steps: dict
    requests: dict
    status: dict = field(default_factory=dict)
    replicas: list = field(default_factory=list)

    @property
    def shard_id(self) -> int:
        return int(self.shard["shard_id"])

    @property
    def label(self) -> str:
        return f"{self.shard['model']} / {self.shard['engine']}"

    @property
    def deployment(self) -> bool:
        """Whether the shard replayed a deployment (replicas behind a router)."""
        return self.shard.get("replicas") is not None

    @property
    def n_steps(self) -> int:
        return len(self.steps["step"])

    @property
    def n_requests(self) -> int:
        return len(self.requests["arrival_s"])

    @property
    def config(self) -> dict:
        return self.shard.get("config") or {}

    @property
    def usable_blocks(self) -> int | None:
        n = self.config.get("num_gpu_blocks")
        return int(n) - 1 if isinstance(n, int) and n > 1 else None

    @cached_property
    def block_bytes(self) -> float | None:
        """Bytes per KV-cache block (all groups), from the step columns; None when not known."""
        for nbytes, blocks in (("kv_cache_active_bytes", "active_blocks"), ("kv_cache_cached_bytes", "cached_blocks")):
            b = self.steps[blocks]
            ok = np.isfinite(b) & (b > 0) & np.isfinite(self.steps[nbytes])
            if ok.any():
                i = np.flatnonzero(ok)[0]
                v = self.steps[nbytes][i] / b[i]
                return float(v) if v > 0 else None
        return None

    @property
    def has_bytes(self) -> bool:
        """Whether the engine's KV-cache groups give page sizes (so occupancy has bytes)."""
        return self.block_bytes is not None

    def latencies(self, name: str) -> np.ndarray:
        """The non-NULL values of request column ``name`` (ttft_s, tpot_s, e2e_s)."""
        v = self.requests[name]
        return v[np.isfinite(v)]


@dataclass
class RunData:
    """One run: its ``runs`` row, how it was chosen and its shards in shard order."""

    database: str
    run: dict
    shards: list
    runs_in_db: int
    same_name: int
    note: str = ""
    # The sweep the run belongs to (aisim.sweep): its candidates, every load level's, in candidate order;
    # empty for a plain pipeline run.  Knobs, SLO and deployment parsed from their JSON.
    sweep: list = field(default_factory=list)
    # SLO thresholds drawn on the latency charts (``ttft_s``, ``tpot_s``, ``e2e_s``): the report's
    # ``--slo``, else the sweep's.
    slo: dict = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.run["run_id"]


def _float(arr) -> np.ndarray:
    """A column fetched from DuckDB as float64, NULL as NaN."""
    if isinstance(arr, np.ma.MaskedArray):
        return np.ma.filled(arr.astype(np.float64), np.nan)
    return np.asarray(arr, dtype=np.float64)


def _rows(con, sql: str, params: list) -> list:
    cur = con.execute(sql, params)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def connect(path: str):
    """Open the run database at ``path`` read-only (:func:`aisim.pipeline.landing.connect`), errors as ReportError."""
    from aisim.pipeline.landing import connect as open_db

    if not path:
        raise ReportError("give the run database with --db FILE (or set AISIM_DB)")
    try:
        return open_db(path, read_only=True)
    except AisimError as exc:
        raise ReportError(str(exc)) from None


def _tables(con) -> set:
    rows = con.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")
    return {r[0] for r in rows.fetchall()}


def resolve_run(con, selector: str | None, path: str) -> tuple:
    """The ``runs`` row meant by ``selector`` and a note on how it was chosen.

    Raises
    ------
    ReportError
        No runs, no match, or an id prefix that matches several runs.
    """
    tables = _tables(con)
    missing = set(TABLES) - tables
    if missing:
        # A capacity search's database (aisim capacity --db) is reported with --capacity.
        hint = (f"; it holds capacity searches: aisim report --db {path} --capacity SEARCH (the search id or "
                "name aisim capacity printed)" if "capacity_points" in tables else "")
        raise ReportError(f"{path} is not an aisim run database (no table(s) {', '.join(sorted(missing))}); "
                          f"run a pipeline into it first (aisim pipeline run SPEC --db FILE){hint}")
    total = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    if total == 0:
        raise ReportError(f"{path} holds no runs yet; run a pipeline first (aisim pipeline run SPEC --db {path})")
    from aisim.errors import QueryError
    from aisim.query.runner import pick_run

    order = "ORDER BY run_seq DESC"
    try:
        row = pick_run(con, selector or None)
    except QueryError as exc:
        raise ReportError(f"--run {selector}: {exc}") from None
    if row is not None:
        if not selector:
            return row, f"the latest of {total} run{'s' if total != 1 else ''} in the database"
        if row["run_id"] == selector:
            return row, f"run id {selector}"
        if row["name"] == selector:
            note = f"run name '{selector}'"
            same = con.execute("SELECT count(*) FROM runs WHERE name = ?", [selector]).fetchone()[0]
            if same > 1:
                note += f": the latest (#{row['run_seq']}) of {same} runs of that name; give a run id for another"
            return row, note
        return row, f"run id prefix {selector}"
    known = _rows(con, f"SELECT run_id, name, run_seq FROM runs {order} LIMIT 8", [])
    listing = ", ".join(f"{r['run_id']} ('{r['name']}', #{r['run_seq']})" for r in known)
    more = f" and {total - len(known)} more" if total > len(known) else ""
    raise ReportError(f"no run '{selector}' in {path} (by run id, name or id prefix); runs: {listing}{more} "
                      "(aisim query runs --db FILE lists them)")


def _shard(con, run_id: str, row: dict) -> ShardData:
    sid = row["shard_id"]
    try:
        row["config"] = json.loads(row.get("engine_config") or "{}")
    except ValueError:
        row["config"] = {}
    sums = _rows(con, "SELECT * FROM summaries WHERE run_id = ? AND shard_id = ?", [run_id, sid])
    summary = sums[0] if sums else {}
    if summary.get("summary_json"):
        try:
            summary["summary_detail"] = json.loads(summary["summary_json"])
        except ValueError:
            summary["summary_detail"] = {}
    cols = ", ".join(STEP_COLUMNS)
    order = "step" if row.get("replicas") is None else "clock_s, replica, step"
    raw = con.execute(f"SELECT {cols} FROM steps WHERE run_id = ? AND shard_id = ? ORDER BY {order}",
                      [run_id, sid]).fetchnumpy()
    steps = {c: _float(raw[c]) for c in STEP_COLUMNS}
    cols = ", ".join(REQUEST_COLUMNS)
    raw = con.execute(f"SELECT {cols} FROM requests WHERE run_id = ? AND shard_id = ? ORDER BY request_index",
                      [run_id, sid]).fetchnumpy()
    requests = {c: _float(raw[c]) for c in REQUEST_COLUMNS}
    status = dict(con.execute("SELECT CAST(status AS VARCHAR), count(*) FROM requests WHERE run_id = ? "
                              "AND shard_id = ? GROUP BY ALL ORDER BY 1", [run_id, sid]).fetchall())
    replicas = _rows(con, "SELECT * FROM replicas WHERE run_id = ? AND shard_id = ? ORDER BY replica", [run_id, sid])
    return ShardData(shard=row, summary=summary, steps=steps, requests=requests, status=status, replicas=replicas)


def _sweep(con, run_id: str) -> list:
    """The candidates of the sweep that made run ``run_id`` (every load level's), or []."""
    tables = _tables(con)
    if "sweep_candidates" not in tables:
        return []
    cols = {r[0] for r in con.execute("SELECT column_name FROM information_schema.columns "
                                      "WHERE table_name = 'sweep_candidates'").fetchall()}
    if "sweep_run_id" in cols:  # a sweep of several load levels: its runs share the first level's run id
        rows = _rows(con, "SELECT * FROM sweep_candidates WHERE sweep_run_id = (SELECT any_value(sweep_run_id) "
                          "FROM sweep_candidates WHERE run_id = ?) ORDER BY candidate", [run_id])
        if rows:
            return [_candidate(r) for r in rows]
    return [_candidate(r) for r in _rows(con, "SELECT * FROM sweep_candidates WHERE run_id = ? ORDER BY candidate",
                                         [run_id])]


def _candidate(row: dict) -> dict:
    for k in ("knobs", "slo", "deployment"):
        if row.get(k) is not None:
            row[k] = json.loads(row[k])
    return row


def load_run(path: str, run: str | None = None, slo: dict | None = None) -> RunData:
    """Read run ``run`` (id, name or id prefix; default the latest) from the database at ``path``.

    ``slo``: thresholds to draw on the latency charts (default: the sweep's, when the run is a sweep's).
    """
    con = connect(path)
    try:
        row, note = resolve_run(con, run, path)
        run_id = row["run_id"]
        shard_rows = _rows(con, "SELECT * FROM shards WHERE run_id = ? ORDER BY shard_id", [run_id])
        shards = [_shard(con, run_id, r) for r in shard_rows]
        total = con.execute("SELECT count(*) FROM runs").fetchone()[0]
        same = con.execute("SELECT count(*) FROM runs WHERE name = ?", [row["name"]]).fetchone()[0]
        sweep = _sweep(con, run_id)
    finally:
        con.close()
    if not slo and sweep:
        slo = sweep[0]["slo"]
    return RunData(database=os.path.abspath(path), run=row, shards=shards, runs_in_db=total, same_name=same,
                   note=note, sweep=sweep, slo=dict(slo or {}))


__all__ = ["LATENCIES", "REQUEST_COLUMNS", "STEP_COLUMNS", "ReportError", "RunData", "ShardData", "connect",
           "load_run", "resolve_run"]
