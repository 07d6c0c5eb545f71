"""Configuration sweeps ranked by SLO goodput.

A sweep spec (TOML, strict) names a base engine configuration, one model's
trace, a grid of knobs and SLO thresholds::

    name = "llama-sweep"
    database = "sweep.duckdb"          # relative to the spec
    model = "llama-3.1-8b"
    base = "../examples/engine.json"   # base engine configuration
    best = "best-engine.toml"          # where the best configuration is written

    [trace]                            # a capacity spec's keys too
    paths = ["../examples/trace.jsonl"]  # or path = "../examples/trace.jsonl"
    format = "oracle"                  # optional; options = {...} for the reader

    [grid]                             # every combination is a candidate
    max_num_batched_tokens = [2048, 4096]
    max_num_seqs = [64, 128]
    num_gpu_blocks = [1024, 2048]      # or kv_cache_bytes
    max_model_len = [4096, 8192]       # a knob: over-long prompts are rejected, not an error
    long_prefill_token_threshold = [0, "unset"]  # "unset": the base's key removed (its default)
    time_model = [{kind = "roofline", gpu = "H100", model = "llama-3.1-8b", tp = 1}]

    [load]                             # optional: load levels, each a pipeline run of every candidate
    rate_scale = [1.0, 2.0]            # arrivals divided by the factor; or poisson_rate = [...] (seed = N),
                                       # or max_concurrency = [...] (requests in flight)

    [slo]                              # at least one threshold, seconds (aisim.sweep.slo: the
                                       # shape of every SLO; attainment and limits go in [capacity.slo])
    ttft_s = 2.0
    tpot_s = 0.05
    e2e_s = 30.0

    [capacity]                         # optional: each candidate's highest rate within an SLO
    [capacity.slo]                     # the keys of a capacity spec's question (aisim.capacity.spec)
    ttft_s = 2.0
    attainment = 0.95
    [capacity.rate]
    by = "poisson_rate"

A knob is any top-level engine key (:data:`aisim.config.keys.ENGINE_KEYS`,
``plan_notes`` aside); its value replaces the base's, a table value whole.
A spec may also name a base deployment (``deployment = "fleet.toml"``, or the
inline mapping) and vary it: ``replicas``, ``router``, or a disaggregated
deployment's ``prefill_replicas``, ``decode_replicas``, ``prefill_router``,
``decode_router`` (:mod:`aisim.sweep.deployments`); each candidate then
replays its deployment of its engine, and its GPUs are the deployment's.
A load level (:mod:`aisim.traces.load`) is a knob of the trace: the
candidates are every grid point at every level, ``c000`` ... by level, then
in grid order.

A candidate is refused, with its reason, when the configuration rules
refuse it (the grouped-prefix rule among them) or when it cannot hold a
request of the trace (:func:`aisim.replay.check_trace`, as the replay would
refuse it: a pool too small for the longest request, or a prompt of
``max_model_len`` tokens or more while ``max_model_len`` is no knob).  Where
``max_model_len`` is a knob, such a prompt is rejected as vLLM's server
rejects it: the request counts, fails the SLO, and the replay goes on.  The
others run through the pipeline (one shard per candidate, the same Dask and
DuckDB path) and are ranked by goodput: requests that finished within every
threshold per second of the shard's duration.  Ties go to fewer GPUs
(``time_model.tp`` of every replica), then to the lower p99 TTFT, then to grid order: a
larger KV pool on the same GPUs costs nothing.  Every candidate, refused or
ranked, lands in the ``sweep_candidates`` table next to the run's results.

With a ``[capacity]`` section each accepted candidate is searched too, in its
load level's pipeline run (the pipeline's ``[capacity]`` section, which
:mod:`aisim.capacity` plugs in): the highest rate it serves within that
section's SLO, on the trace as traced (a load level is the replay's, not the
search's).  The points land in ``capacity_points`` with the run's id, and the
candidates are ranked by that rate (``capacity_rate_req_s``; a candidate that
meets the SLO at no rate tried comes last) before goodput's tie-breaks: fewer
GPUs, the lower p99 TTFT, grid order.  ``[capacity.fleet]`` is refused: the
smallest deployment is ``aisim capacity``'s question, not a candidate's.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field

from aisim.errors import ConfigError, ShardFailed, SweepError, TraceError

from aisim.sweep.knobs import LOAD_AXES, SPEC_KNOBS, UNSET  # noqa: F401  (UNSET: the grid's spelling)
from aisim.sweep.slo import SLO_KEYS

# The knobs of a sweep's grid (aisim.sweep.knobs): every top-level engine key but the notes a sweep
# writes itself, then the deployment's knobs; its [load] table varies LOAD_AXES.
GRID_KNOBS = SPEC_KNOBS["sweep"]
_TOP = ("name", "description", "database", "model", "base", "best", "best_deployment", "deployment", "trace",
        "grid", "load", "slo", "capacity")
# A spec's [trace] table: one file (path) or several (paths), the format and the reader's options; the
# same keys in a sweep spec and a capacity spec (trace_table).
TRACE_KEYS = ("path", "paths", "format", "options")


@dataclass
class SweepSpec:
    """A validated sweep spec (see the module docstring)."""

    name: str
    database: str
    model: str
    base: dict
    base_path: str
    best: str
    trace: dict
    grid: dict
    slo: dict
    description: str = ""
    path: str | None = None
    # The load levels, each a transform of aisim.traces.load (one empty transform: the trace as it is).
    loads: list = field(default_factory=lambda: [{}])
    # The base DeploymentConfig the candidates replay (None: each its engine alone), and where the
    # best candidate's deployment is written.
    deployment: object = None
    best_deployment: str | None = None
    # The [capacity] table, validated by the section aisim.capacity plugs into the pipeline and
    # handed to each load level's pipeline spec as it is (None: no capacity search).
    capacity: dict | None = None


@dataclass
class Candidate:
    """One point of the grid and what became of it.

    ``engine`` is the candidate's :class:`~aisim.config.engine.EngineConfig`,
    validated once by :func:`candidates`; ``config`` is its raw dictionary (the
    base configuration with the knobs applied).  Both are None when refused.
    """

    name: str
    knobs: dict
    config: dict | None = None
    engine: object = None           # the EngineConfig of an accepted candidate
    reason: str | None = None       # why the rules refused it
    goodput_req_s: float | None = None
    slo_attainment: float | None = None
    finished: int | None = None
    rank: int | None = None
    cost_tokens: int | None = None
    gpus: int | None = None         # GPUs of the deployment (time_model.tp of every replica)
    deployment: object = None       # the DeploymentConfig of an accepted candidate of a deployment sweep
    rejected: int | None = None     # requests rejected for a prompt of max_model_len tokens or more
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    load: dict = field(default_factory=dict)  # its load level (aisim.traces.load; empty: as traced)
    run_id: str | None = None       # the pipeline run that replayed it
    capacity_rate_req_s: float | None = None  # the highest rate within [capacity]'s SLO (None: none met)
    capacity_band: tuple = (None, None)       # its band: the rates at the calibration's two step-time ends
    calibration: str | None = None            # the calibration of its time model (aisim.config.calibration)

    @property
    def refused(self) -> bool:
        return self.reason is not None


@dataclass
class SweepResult:
    """Every candidate of a sweep, and its pipeline runs (one per load level)."""

    spec: SweepSpec
    run_ids: list
    candidates: list = field(default_factory=list)

    @property
    def run_id(self) -> str:
        """The run of the first load level (the only one without a ``[load]`` table)."""
        return self.run_ids[0]

    @property
    def ranked(self) -> list:
        return sorted((c for c in self.candidates if not c.refused), key=lambda c: c.rank)

    @property
    def best(self) -> Candidate | None:
        ranked = self.ranked
        return ranked[0] if ranked else None


def load_sweep(path) -> SweepSpec:
    """Read a sweep spec strictly; errors name the key and the file."""
    from aisim.pipeline.spec import read_toml

    path = os.fspath(path)
    raw = read_toml(path, "sweep spec", SweepError)
    return sweep_from_dict(raw, source=path, base_dir=os.path.dirname(os.path.abspath(path)))


def sweep_from_dict(raw: dict, source: str | None = None, base_dir: str | None = None) -> SweepSpec:
    """Validate a parsed sweep spec."""
    from aisim.pipeline.spec import read_config_file

    where = f" in {source}" if source else ""
    base_dir = base_dir or os.getcwd()
    for k in raw:
        if k not in _TOP:
            raise SweepError(f"unknown key '{k}'{where}; known keys: {', '.join(_TOP)}")
    for k in ("name", "database", "model", "base", "trace", "grid", "slo"):
        if k not in raw:
            raise SweepError(f"missing required key '{k}'{where}")
    for k in ("name", "database", "model", "base") + tuple(k for k in ("best", "best_deployment") if k in raw):
        if not isinstance(raw[k], str) or not raw[k]:
            raise SweepError(f"'{k}'{where} must be a non-empty string")
    try:
        trace = trace_table(raw["trace"], where, base_dir)
    except ConfigError as exc:
        raise SweepError(str(exc)) from None
    grid = raw["grid"]
    if not isinstance(grid, dict) or not grid:
        raise SweepError(f"'grid'{where} must be a non-empty table of knob = [values]")
    try:
        check_grid(grid, where, "grid.")
    except ConfigError as exc:
        raise SweepError(str(exc)) from None
    loads = _loads(raw.get("load"), where)
    capacity = _capacity(raw.get("capacity"), where)
    from aisim.sweep.slo import goodput_slo

    try:
        slo = goodput_slo(raw["slo"], where)
    except ConfigError as exc:
        raise SweepError(str(exc)) from None
    base_path = os.path.abspath(os.path.join(base_dir, raw["base"]))
    base = read_config_file(base_path, f"'base'{where}")
    best = os.path.abspath(os.path.join(base_dir, raw.get("best", f"{raw['name']}-best.toml")))
    from aisim.sweep.deployments import base_deployment

    deployment = base_deployment(raw.get("deployment"), grid, base_dir, where)
    best_deployment = None
    if deployment is not None:
        stem = os.path.splitext(best)[0]
        best_deployment = os.path.abspath(os.path.join(base_dir, raw.get("best_deployment",
                                                                          f"{stem}-deployment.toml")))
    elif "best_deployment" in raw:
        raise SweepError(f"'best_deployment'{where} needs a deployment: give 'deployment' or deployment knobs")
    from aisim.files import check_outputs

    dep = raw.get("deployment")
    check_outputs({f"'best'{where}": best, f"'best_deployment'{where}": best_deployment},
                  {"the spec": source, "'base'": base_path, "'database'": os.path.join(base_dir, raw["database"]),
                   "'trace.paths'": trace["paths"],
                   "'deployment'": os.path.join(base_dir, dep) if isinstance(dep, str) and dep else None})
    return SweepSpec(name=raw["name"], database=os.path.abspath(os.path.join(base_dir, raw["database"])),
                     model=raw["model"], base=base, base_path=base_path, best=best,
                     trace=trace, grid={k: list(v) for k, v in grid.items()}, slo=dict(slo.thresholds),
                     description=str(raw.get("description", "")), path=os.path.abspath(source) if source else None,
                     loads=loads, deployment=deployment, best_deployment=best_deployment, capacity=capacity)


def _capacity(raw, where: str) -> dict | None:
    """``[capacity]``: validated by the pipeline's ``capacity`` section (aisim.capacity plugs it in); a rate question."""
    from aisim.pipeline import sections as plugged

    if raw is None:
        return None
    section = plugged.section("capacity")
    if section is None:
        raise SweepError(str(plugged.unplugged("capacity", where)))
    if isinstance(raw, dict) and "fleet" in raw:
        raise SweepError(f"'capacity.fleet'{where} is not a question for a sweep's candidates: give "
                         "'[capacity.rate]' (each candidate's highest rate within the SLO); the smallest "
                         "deployment is aisim capacity's question")
    try:
        # A sweep's replay options are its load levels: no closed loop, no deployment splits to check.
        section.parse(raw, where, {"replay": {}, "deployments": []})
    except ConfigError as exc:
        raise SweepError(str(exc)) from None
    return dict(raw)


def _loads(raw, where: str) -> list:
    """``[load]``: one axis of load levels, ``rate_scale``, ``poisson_rate`` (with ``seed``) or ``max_concurrency``."""
    from aisim.traces.load import check_load

    if raw is None:
        return [{}]
    if not isinstance(raw, dict):
        raise SweepError(f"'load'{where} must be a table")
    for k in raw:
        if k not in LOAD_AXES + ("seed",):
            raise SweepError(f"unknown key 'load.{k}'{where}; known keys: {', '.join(LOAD_AXES + ('seed',))}")
    axes = [k for k in LOAD_AXES if k in raw]
    if len(axes) != 1:
        raise SweepError(f"'load'{where} must give one of {', '.join(LOAD_AXES)}, a list of levels")
    key, vals = axes[0], raw[axes[0]]
    if not isinstance(vals, list) or not vals:
        raise SweepError(f"'load.{key}'{where} must be a non-empty list of levels")
    if len(set(map(json.dumps, vals))) != len(vals):
        raise SweepError(f"'load.{key}'{where} repeats a value")
    seed = {"seed": raw["seed"]} if "seed" in raw else {}
    try:
        return [check_load({key: v, **seed}, where, "load.") for v in vals]
    except ConfigError as exc:
        raise SweepError(str(exc)) from None


def candidates(spec: SweepSpec) -> list:
    """Every grid point at every load level, validated by the configuration rules.

    Returns
    -------
    list of Candidate
        By load level, then in grid order; an accepted one keeps its
        ``engine``, a refused one its ``reason``.  A load level is a knob too
        (``rate_scale``, ``poisson_rate`` or ``max_concurrency``).
    """
    from aisim.sweep.deployments import deployment_gpus
    from aisim.sweep.knobs import resolve

    keys = list(spec.grid)
    points = list(itertools.product(*(spec.grid[k] for k in keys)))
    out = []
    for i, (load, values) in enumerate(itertools.product(spec.loads, points)):
        knobs = dict(zip(keys, values))
        knobs.update({k: v for k, v in load.items() if k != "seed"})
        name = f"c{i:03d}"
        cand = Candidate(name=name, knobs=knobs, load=load)
        source = f"candidate {name} {json.dumps(knobs, sort_keys=True)}"
        try:
            point = resolve(spec.base, spec.deployment, knobs, source)
            gpus = deployment_gpus(point.deployment, point.engine)
        except ConfigError as exc:
            cand.reason = str(exc)
        else:
            cand.config = point.config
            cand.engine = point.engine
            cand.deployment = point.deployment
            cand.cost_tokens = point.engine.num_gpu_blocks * point.engine.block_size
            cand.gpus = gpus
        out.append(cand)
    return out


def check_trace_table(trace, keys: tuple, where: str = "") -> None:
    """A ConfigError naming what is wrong with a spec's ``[trace]`` table: not a table, a key not in
    ``keys``, ``options`` that are no table or that the ``format``'s reader refuses (its paths are
    the caller's to check)."""
    from aisim.pipeline.spec import check_reader_options

    if not isinstance(trace, dict):
        raise ConfigError(f"'trace'{where} must be a table")
    for k in trace:
        if k not in keys:
            raise ConfigError(f"unknown key 'trace.{k}'{where}; known keys: {', '.join(keys)}")
    options = trace.get("options", {})
    if not isinstance(options, dict):
        raise ConfigError(f"'trace.options'{where} must be a table of reader options")
    check_reader_options(trace.get("format"), options, "trace.", where)  # a SpecError is a ConfigError


def trace_table(raw, where: str = "", base_dir: str | None = None, one: bool = False) -> dict:
    """A spec's ``[trace]`` table (:data:`TRACE_KEYS`) validated: ``{"paths", "format", "options"}``, the
    paths absolute (relative to ``base_dir``).

    ``path`` names one trace file, ``paths`` a list of them; ``one``: the spec replays one file
    (a capacity search), and a list of several is refused with the reason.

    Raises
    ------
    ConfigError
        Naming the key (``trace.paths`` ...) and ``where``.
    """
    check_trace_table(raw, TRACE_KEYS, where)
    given = [k for k in ("path", "paths") if k in raw]
    if len(given) != 1:
        raise ConfigError(f"'trace'{where} must give 'path' (a trace file) or 'paths' (a list of them)"
                          + (", not both" if given else ""))
    if given == ["path"]:
        if not isinstance(raw["path"], str) or not raw["path"]:
            raise ConfigError(f"'trace.path'{where} must name a trace file")
        paths = [raw["path"]]
    else:
        paths = raw["paths"]
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p for p in paths):
            raise ConfigError(f"'trace.paths'{where} must be a non-empty list of paths")
    if one and len(paths) > 1:
        raise ConfigError(f"'trace.paths'{where} names {len(paths)} files; a capacity search replays one trace: give "
                          "one (or search every shard of a pipeline spec with a [capacity] section)")
    base_dir = base_dir or os.getcwd()
    return {"paths": [os.path.abspath(os.path.join(base_dir, p)) for p in paths], "format": raw.get("format"),
            "options": dict(raw.get("options", {}))}


def check_grid(grid: dict, where: str = "", prefix: str = "grid.") -> None:
    """A ConfigError naming the first knob of a sweep's ``grid`` that is unknown, or whose values are
    not a non-empty list of distinct values (:func:`aisim.sweep.knobs.check_grid`)."""
    from aisim.sweep.knobs import check_grid as check

    check(grid, "sweep", where, prefix)


def rejects_too_long(spec: SweepSpec) -> bool:
    """Whether the sweep rejects over-long prompts (``max_model_len`` is a knob) rather than refusing them."""
    return "max_model_len" in spec.grid


def check_candidates(spec: SweepSpec, cands: list, progress=None) -> None:
    """Refuse, with its reason, every accepted candidate that cannot replay the trace.

    The trace is read once, here, and each candidate asked what the replay
    would ask of it (:func:`aisim.replay.check_trace`), so that none fails
    inside the pipeline run and stops the sweep.
    """
    from aisim.replay import check_trace
    from aisim.sweep.deployments import pool_engines
    from aisim.traces import read_trace

    reject = rejects_too_long(spec)
    by = (spec.capacity or {}).get("rate", {}).get("by")
    for path in spec.trace["paths"]:
        if progress is not None:
            progress(f"reading {os.path.basename(path)}")
        try:
            trace = read_trace(path, spec.trace["format"], **spec.trace["options"])
        except TraceError as exc:
            raise SweepError(f"sweep {spec.name}: {exc}") from None
        if by == "rate_scale" and (trace.schema.metadata or {}).get(b"clock") != b"time":
            where = f" in {spec.path}" if spec.path else ""
            raise SweepError(f"'capacity.rate.by'{where} is 'rate_scale', which scales the trace's own rate, and "
                             f"{os.path.basename(path)} arrives by engine step: give by = 'poisson_rate'")
        if progress is not None:
            progress(f"checking {sum(not c.refused for c in cands)} candidates", f"{trace.num_rows:,} requests")
        faults = {}  # by configuration: the load levels of one grid point share its answer
        for c in cands:
            if not c.refused:
                # A disaggregated pool with its own engine file must hold the trace's requests too.
                for engine in [c.engine] + pool_engines(c.deployment, c.engine):
                    key = json.dumps(engine.raw, sort_keys=True)
                    if key not in faults:
                        faults[key] = check_trace(trace, engine, reject_too_long=reject)
                    if faults[key] is not None:
                        c.reason = f"{os.path.basename(path)}: {faults[key]}"
                        break


def _pipeline_spec(spec: SweepSpec, cands: list, load: dict) -> dict:
    """The pipeline spec of one load level: its accepted candidates, one shard each."""
    trace = {"name": "trace", "paths": spec.trace["paths"], "model": spec.model, "options": spec.trace["options"]}
    if spec.trace["format"]:
        trace["format"] = spec.trace["format"]
    out = {"name": spec.name, "description": spec.description or f"sweep of {spec.model}",
           "database": spec.database, "sources": [trace],
            # The validated EngineConfig of each candidate, reused by the pipeline spec as it is.
           "deployments": [{"model": spec.model, "engines": {
               c.name: c.engine if c.deployment is None else {"engine": c.engine, "deployment": c.deployment}
               for c in cands if not c.refused}}],
           "replay": dict(load)}
    if rejects_too_long(spec):
        out["replay"]["reject_too_long"] = True
    if spec.capacity is not None:  # each shard (candidate) searched in the run, its points landed with it
        out["capacity"] = spec.capacity
    return out


def run_sweep(spec: SweepSpec, *, scheduler: str = "local", workers: int | None = None, force: bool = False,
              progress=None, phases=None) -> SweepResult:
    """Replay every accepted candidate through the pipeline and rank them.

    Parameters
    ----------
    spec : SweepSpec
    scheduler, workers, force, progress
        As :func:`aisim.pipeline.run.run_pipeline` takes them (``progress``:
        the run's reporter, per shard).
    phases : callable, optional
        Told each phase of the sweep, as :class:`aisim.cli_util.Phases` is.

    Returns
    -------
    SweepResult
        Every candidate with its rank (accepted) or reason (refused); one
        pipeline run per load level.

    Raises
    ------
    SweepError
        The trace cannot be read, or every candidate is refused.
    """
    from aisim.traces.load import describe_load

    phases = phases or (lambda name, note="": None)
    cands = candidates(spec)
    check_candidates(spec, cands, phases)
    accepted = [c for c in cands if not c.refused]
    if not accepted:
        raise SweepError(f"every candidate of sweep {spec.name} is refused; the first because: {cands[0].reason}")
    note = f"{len(cands) - len(accepted)} of {len(cands)} refused"
    run_ids, landed = [], []
    existed = os.path.exists(spec.database)
    try:
        for load in spec.loads:
            level = [c for c in cands if c.load == load]
            at = f" at {describe_load(load)}" if load else ""
            phases(f"replaying {sum(not c.refused for c in level)} candidates{at}", note)
            run_id = _replay_level(spec, cands, level, load, scheduler, workers, force, progress, landed) \
                if any(not c.refused for c in level) else None
            if run_id is not None:
                run_ids.append(run_id)
            note = f"run {run_id[:8]}" if run_id else "every candidate refused"
            for c in level:
                c.run_id = run_id
        for c in cands:  # a level whose every candidate was refused lands with the sweep's first run
            c.run_id = c.run_id or run_ids[0]
        phases("ranking", note)
        _rank(spec, run_ids, cands)
        result = SweepResult(spec=spec, run_ids=run_ids, candidates=cands)
        write_best(result)
    except BaseException:
        _undo_landing(spec.database, existed, landed)
        raise
    return result


def _undo_landing(database: str, existed: bool, landed: list) -> None:
    """All or nothing: a sweep that fails after landing some of its runs (a later load level, the ranking,
    the best file) takes them out again; a database it created goes.  Ctrl-C and SIGTERM wait meanwhile."""
    from aisim.files import signals_held
    from aisim.pipeline.landing import remove_runs

    if not landed:
        return
    with signals_held():
        if not existed:
            for path in (database, database + ".wal"):
                if os.path.exists(path):
                    os.unlink(path)
        else:
            remove_runs(database, landed, tables=("sweep_candidates",))


def _replay_level(spec, cands, level, load, scheduler, workers, force, progress, landed: list) -> str:
    """Replay one load level's accepted candidates in one pipeline run; return its run id (appended to
    ``landed`` too when this run landed it).

    A candidate whose replay fails (a step outside its profile's measured
    range, say) is refused with the replay's reason, and the others run
    again without it; so is one whose ``[capacity]`` search fails (the
    search replays at rates the sweep's own replay never reaches).
    """
    from aisim.pipeline.run import run_pipeline
    from aisim.pipeline.spec import spec_from_dict

    while True:
        pspec = spec_from_dict(_pipeline_spec(spec, level, load), source=spec.path,
                               base_dir=os.path.dirname(spec.path) if spec.path else None)
        try:
            report = run_pipeline(pspec, scheduler=scheduler, workers=workers, force=force, progress=progress)
        except ShardFailed as exc:
            # A candidate is refused for its own replay's failure, never for the machine's (a full disk).
            failed = None if exc.system else _failed_candidate(str(exc), level)
            if failed is None:
                raise
            what = "capacity search" if str(exc).startswith("[capacity] ") else "replay"
            failed.reason = f"its {what} failed: {str(exc).split(' failed: ', 1)[1]}"
            if all(c.refused for c in cands):
                raise SweepError(f"every candidate of sweep {spec.name} is refused; the last because: "
                                 f"{failed.reason}") from None
            if all(c.refused for c in level):
                return None
            continue
        if report.landed and not report.replaced:  # a run it replaced (--force) cannot be put back
            landed.append(report.run_id)
        return report.run_id


def _failed_candidate(message: str, cands: list) -> Candidate | None:
    """The accepted candidate a pipeline's shard failure names (``shard N (model 'M', engine 'cNNN') failed: ...``,
    or ``[capacity] of shard N ...`` for its search)."""
    m = re.match(r"(?:\[capacity\] of )?shard \d+ \(model '.*?', engine '(c\d+)'\) failed: ", message)
    c = {c.name: c for c in cands}.get(m.group(1)) if m else None
    return c if c is not None and not c.refused else None


def rank_key(c: Candidate, capacity: bool = False) -> tuple:
    """Best first: goodput (of the whole deployment), then fewer GPUs, then the lower p99 TTFT, then grid order.

    A larger KV pool on the same GPUs costs nothing, so it only wins by its latency.  With
    ``capacity`` (a ``[capacity]`` section) the highest rate within its SLO comes first instead of
    goodput (a candidate that met it at no rate tried after every other), the same tie-breaks after.
    """
    ttft = c.ttft_p99_s if c.ttft_p99_s is not None else math.inf
    if capacity:
        rate = c.capacity_rate_req_s
        return (-rate if rate is not None else math.inf, c.gpus, ttft, c.name)
    return (-c.goodput_req_s, c.gpus, ttft, c.name)


def _rank(spec: SweepSpec, run_ids: list, cands: list) -> None:
    """Read each run's goodput per candidate, rank them all and land ``sweep_candidates``."""
    from aisim import sql
    from aisim.pipeline.landing import connect
    from aisim.query.runner import bind_sql

    library = sql.sweep()
    # The SLO as slo_attainment (sql/views) defines it; a threshold the spec leaves out is no limit.
    slo = {k: spec.slo.get(k) for k in SLO_KEYS}
    con = connect(spec.database)
    try:
        by_name = {c.name: c for c in cands}
        rows = [row for run_id in run_ids
                for row in con.execute(*bind_sql(library["goodput"], {"run": run_id, **slo})).fetchall()]
        for engine, _good, finished, _requests, goodput_req_s, attainment, rejected, ttft_p99, tpot_p99 in rows:
            c = by_name[engine]
            c.goodput_req_s, c.slo_attainment, c.finished = goodput_req_s, attainment, finished
            c.rejected, c.ttft_p99_s, c.tpot_p99_s = rejected, ttft_p99, tpot_p99
        capacity = spec.capacity is not None
        if capacity:  # each candidate's highest rate within [capacity]'s SLO, from its search's points
            for run_id in run_ids:
                for engine, rate, low, high, _cal in con.execute(
                        *bind_sql(library["capacity_rate"], {"run": run_id})).fetchall():
                    by_name[engine].capacity_rate_req_s = rate
                    by_name[engine].capacity_band = (low, high)
        from aisim.config.calibration import calibration_of

        for c in cands:
            if c.engine is not None:
                c.calibration = calibration_of(c.engine.time_model)["name"]
        for rank, c in enumerate(sorted((c for c in cands if not c.refused),
                                        key=lambda c: rank_key(c, capacity)), 1):
            c.rank = rank
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(library["sweep_candidates"].sql)
            for run_id in run_ids:
                con.execute("DELETE FROM sweep_candidates WHERE run_id = ?", [run_id])
            cols = ("run_id", "candidate", "knobs", "status", "reason", "rank", "goodput_req_s", "slo_attainment",
                    "cost_tokens", "slo", "gpus", "rejected", "ttft_p99_s", "tpot_p99_s", "deployment", "sweep_run_id",
                    "capacity_rate_req_s", "capacity_band_low_req_s", "capacity_band_high_req_s", "calibration")
            insert = f"INSERT INTO sweep_candidates ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
            for c in cands:
                con.execute(insert, [c.run_id, c.name, json.dumps(c.knobs, sort_keys=True),
                                     "refused" if c.refused else "ranked", c.reason, c.rank, c.goodput_req_s,
                                     c.slo_attainment, c.cost_tokens, json.dumps(spec.slo, sort_keys=True),
                                     c.gpus, c.rejected, c.ttft_p99_s, c.tpot_p99_s,
                                     json.dumps(c.deployment.to_dict(), sort_keys=True)
                                     if c.deployment is not None else None, run_ids[0], c.capacity_rate_req_s,
                                     *c.capacity_band, c.calibration])
            from aisim.files import step

            step("commit")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    finally:
        con.close()


def write_best(result: SweepResult) -> None:
    """Write the best candidate's engine configuration (TOML) to ``spec.best``.

    The file holds the candidate's declared keys and the sweep's notes as
    ``plan_notes``; it loads back to the same configuration.  A deployment
    sweep writes the best candidate's deployment to ``spec.best_deployment``
    too (a deployment file).
    """
    from aisim.config.toml_out import dumps
    from aisim.files import outputs, write_text

    best = result.best
    slo = ", ".join(f"{k} <= {v:g}" for k, v in result.spec.slo.items())
    notes = [f"best of {len(result.candidates)} candidates of sweep {result.spec.name} (run {best.run_id})",
             f"goodput {best.goodput_req_s:.3f} requests/s within {slo}; knobs {json.dumps(best.knobs, sort_keys=True)}"]
    if result.spec.capacity is not None:
        rate = f"{best.capacity_rate_req_s:.3f} requests/s" if best.capacity_rate_req_s is not None else "no rate"
        low, high = best.capacity_band
        if best.capacity_rate_req_s is not None and low is not None and high is not None:
            rate += f", {low:.3f}-{high:.3f} (calibration '{best.calibration}')"
        notes.append(f"ranked by the highest rate within the [capacity] SLO: {rate} (capacity_points, "
                     f"run {best.run_id})")
    if best.load:
        from aisim.traces.load import describe_load

        notes.append(f"at load {describe_load(best.load)} (a transform of the trace, not of the engine)")
    if best.deployment is not None:
        notes.append(f"deployed as {best.deployment.describe()} ({best.gpus} GPUs; the deployment is in "
                     f"{os.path.basename(result.spec.best_deployment)})")
    cfg = best.engine.replace(plan_notes=notes).raw  # validated: the file written loads back
    with outputs():  # the configuration and its deployment land together, or neither
        if best.deployment is not None:
            from aisim.sweep.deployments import write_best_deployment

            write_best_deployment(result.spec.best_deployment, best.deployment, notes)
        write_text(result.spec.best, dumps(cfg, header_comments=["Engine configuration chosen by aisim sweep."]
                                           + notes), "'best'")
