"""A capacity spec (TOML, strict): the engine, the trace, the SLO and one question.

::

    name = "llama-capacity"
    database = "capacity.duckdb"        # relative to the spec; table capacity_points
    engine = "../examples/engine.json"
    deployment = "fleet.toml"           # optional: a deployment file, or an inline table
    price_per_gpu_hour = 2.5            # optional: fills the cost columns

    [trace]                             # a sweep spec's keys (aisim.sweep.runner.trace_table)
    path = "../examples/trace.jsonl"    # or paths = [one file]
    format = "oracle"                   # optional; options = {...} for the reader

    [slo]                               # aisim.sweep.slo: the shape of every SLO
    ttft_s = 2.0
    tpot_s = 0.05
    attainment = 0.95                   # with thresholds; a percentile-only SLO has none
    ttft_p99_s = 1.0

    [rate]                              # question 1: the highest rate within the SLO
    by = "poisson_rate"                 # or "rate_scale"
    seed = 0                            # of the Poisson gaps
    start = 4.0                         # first rate tried (default: the trace's own)
    rel_tol = 0.02
    max_points = 40
    max_concurrency = 64                # optional: the client's cap on requests in flight

    [fleet]                             # or question 2: the smallest deployment that serves the trace
    max_replicas = 16
    aggregated = true                   # try aggregated replicas (default true)
    splits = [[1, 1], [1, 3]]           # prefill/decode splits, k times each (needs a disaggregated deployment)
    poisson_rate = 20.0                 # optional load (or rate_scale); default the trace as it is
    [fleet.grid]                        # optional engine knobs, as aisim sweep's grid
    max_num_seqs = [64, 128]

A spec asks one question: it has ``[rate]`` or ``[fleet]``.  Every error names the key and the file.
The question's keys (``slo``, ``rate`` or ``fleet``, ``price_per_gpu_hour``) are read by
:func:`question_from_dict`, which a pipeline spec's ``[capacity]`` section uses too
(:mod:`aisim.capacity.pipeline`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from aisim.errors import ConfigError

QUESTION_KEYS = ("slo", "rate", "fleet", "price_per_gpu_hour")
_TOP = ("name", "description", "database", "engine", "deployment", "trace") + QUESTION_KEYS
_RATE = ("by", "seed", "start", "rel_tol", "max_points", "max_concurrency", "band")
_FLEET = ("max_replicas", "aggregated", "splits", "grid", "poisson_rate", "rate_scale", "seed", "band")


@dataclass
class CapacitySpec:
    """A validated capacity spec (see the module docstring).

    Attributes
    ----------
    question : str
        ``rate`` or ``deployment``.
    params : dict
        The question's keyword arguments (:func:`aisim.capacity.search.highest_rate` or
        :func:`~aisim.capacity.search.smallest_deployment`).
    """

    name: str
    database: str
    engine: object
    trace: dict
    slo: object
    question: str
    params: dict = field(default_factory=dict)
    deployment: object = None
    price_per_gpu_hour: float | None = None
    description: str = ""
    path: str | None = None


@dataclass(frozen=True)
class Question:
    """A validated question: the SLO, which question, its parameters, the price.

    Attributes
    ----------
    slo : aisim.capacity.slo.Slo
    question : str
        ``rate`` or ``deployment``.
    params : dict
        The question's keyword arguments (:func:`aisim.capacity.search.highest_rate` or
        :func:`~aisim.capacity.search.smallest_deployment`).
    price_per_gpu_hour : float or None
    """

    slo: object
    question: str
    params: dict
    price_per_gpu_hour: float | None = None

    def to_dict(self) -> dict:
        """The question as plain data (what a pipeline's run key hashes)."""
        params = {k: ([list(s) for s in v] if k == "splits" else v) for k, v in self.params.items()}
        return {"slo": self.slo.to_dict(), "question": self.question, "params": params,
                "price_per_gpu_hour": self.price_per_gpu_hour}


def question_from_dict(raw: dict, where: str = "", prefix: str = "") -> Question:
    """Validate a question's keys: ``slo``, one of ``rate`` and ``fleet``, ``price_per_gpu_hour``.

    Parameters
    ----------
    raw : dict
        The keys of :data:`QUESTION_KEYS` (other keys are the caller's to refuse).
    where : str
        Appended to messages (`` in spec.toml``).
    prefix : str
        Prepended to key names in messages (``capacity.`` in a pipeline spec).

    Raises
    ------
    ConfigError
        Naming the key (``{prefix}rate.rel_tol`` ...) and ``where``.
    """
    from aisim.capacity.slo import slo_from_dict

    if "slo" not in raw:
        raise ConfigError(f"missing required key '{prefix}slo'{where}")
    asked = [k for k in ("rate", "fleet") if k in raw]
    if len(asked) != 1:
        raise ConfigError(f"a capacity {'spec' if not prefix else 'section'} asks one question{where}: give "
                          f"'[{prefix}rate]' (the highest rate within the SLO) or '[{prefix}fleet]' (the smallest "
                          "deployment that serves the trace)")
    price = raw.get("price_per_gpu_hour")
    if price is not None and not _positive(price):
        raise ConfigError(f"'{prefix}price_per_gpu_hour'{where} must be a finite positive number, got {price!r}")
    slo = slo_from_dict(raw["slo"], where, prefix=f"{prefix}slo.")
    if slo.thresholds and slo.attainment is None:
        raise ConfigError(f"missing key '{prefix}slo.attainment'{where}: the share of requests that must meet the "
                          f"thresholds ({', '.join(slo.thresholds)}), 0 < share <= 1 (a percentile-only SLO needs none)")
    if asked == ["rate"]:
        question, params = "rate", _rate(raw["rate"], where, prefix)
    else:
        question, params = "deployment", _fleet(raw["fleet"], where, prefix)
    return Question(slo=slo, question=question, params=params,
                    price_per_gpu_hour=float(price) if price is not None else None)


def load_capacity(path) -> CapacitySpec:
    """Read a capacity spec strictly; errors name the key and the file."""
    from aisim.pipeline.spec import read_toml

    path = os.fspath(path)
    raw = read_toml(path, "capacity spec", ConfigError)
    return capacity_from_dict(raw, source=path, base_dir=os.path.dirname(os.path.abspath(path)))


def _positive(v) -> bool:
    # not (v > 0) refuses NaN too; TOML writes nan and inf
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def _count(v, low: int = 1) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def capacity_from_dict(raw: dict, source: str | None = None, base_dir: str | None = None) -> CapacitySpec:
    """Validate a parsed capacity spec.

    Parameters
    ----------
    raw : dict
    source : str, optional
        The file, named in messages.
    base_dir : str, optional
        What relative paths are relative to (default the working directory).

    Raises
    ------
    ConfigError
        Naming the key (``rate.rel_tol``, ``slo.attainment`` ...) and the file.
    """
    from aisim.config.engine import load_engine_config

    where = f" in {source}" if source else ""
    base_dir = base_dir or os.getcwd()
    for k in raw:
        if k not in _TOP:
            raise ConfigError(f"unknown key '{k}'{where}; known keys: {', '.join(_TOP)}")
    for k in ("name", "database", "engine", "trace"):
        if k not in raw:
            raise ConfigError(f"missing required key '{k}'{where}")
    for k in ("name", "database", "engine"):
        if not isinstance(raw[k], str) or not raw[k]:
            raise ConfigError(f"'{k}'{where} must be a non-empty string")
    q = question_from_dict({k: raw[k] for k in QUESTION_KEYS if k in raw}, where)
    trace = _trace(raw["trace"], base_dir, where)
    engine_path = os.path.abspath(os.path.join(base_dir, raw["engine"]))
    engine = load_engine_config(engine_path)
    deployment = _deployment(raw.get("deployment"), base_dir, where)
    return CapacitySpec(name=raw["name"], database=os.path.abspath(os.path.join(base_dir, raw["database"])),
                        engine=engine, trace=trace, slo=q.slo, question=q.question, params=q.params,
                        deployment=deployment, price_per_gpu_hour=q.price_per_gpu_hour,
                        description=str(raw.get("description", "")),
                        path=os.path.abspath(source) if source else None)


def _trace(raw, base_dir: str, where: str) -> dict:
    """``[trace]``: a sweep spec's keys (:func:`aisim.sweep.runner.trace_table`), one file."""
    from aisim.sweep.runner import trace_table

    t = trace_table(raw, where, base_dir, one=True)
    return {"path": t["paths"][0], "format": t["format"], "options": t["options"]}


def _deployment(raw, base_dir: str, where: str):
    from aisim.config.deployment import load_deployment_config, parse_deployment

    if raw is None:
        return None
    if isinstance(raw, str) and raw:
        return load_deployment_config(os.path.abspath(os.path.join(base_dir, raw)))
    if isinstance(raw, dict):
        raw = dict(raw)
        for name in ("prefill", "decode"):  # a pool's engine file is relative to the spec
            pool = raw.get(name)
            if isinstance(pool, dict) and isinstance(pool.get("engine"), str) and pool["engine"]:
                raw[name] = dict(pool, engine=os.path.join(base_dir, pool["engine"]))
        return parse_deployment(raw, source=where.removeprefix(" in ") or None)
    raise ConfigError(f"'deployment'{where} must be a deployment file or an inline table")


def _rate(raw, where: str, prefix: str = "") -> dict:
    from aisim.capacity.search import RATE_AXES

    p = f"{prefix}rate."
    if not isinstance(raw, dict):
        raise ConfigError(f"'{prefix}rate'{where} must be a table of {', '.join(_RATE)}")
    for k in raw:
        if k not in _RATE:
            raise ConfigError(f"unknown key '{p}{k}'{where}; known keys: {', '.join(_RATE)}")
    out = {"by": raw.get("by", "poisson_rate")}
    if out["by"] not in RATE_AXES:
        raise ConfigError(f"'{p}by'{where} must be one of {', '.join(RATE_AXES)}, got {out['by']!r}")
    if "seed" in raw:
        if out["by"] != "poisson_rate":
            raise ConfigError(f"'{p}seed'{where} seeds a Poisson re-timing; it has no use with by = 'rate_scale'")
        if not _count(raw["seed"], 0):
            raise ConfigError(f"'{p}seed'{where} must be a non-negative integer, got {raw['seed']!r}")
        out["seed"] = raw["seed"]
    if "start" in raw:
        from aisim.traces.load import RANGES

        if not _positive(raw["start"]):
            raise ConfigError(f"'{p}start'{where} must be a finite positive rate, got {raw['start']!r}")
        bottom, top = RANGES[out["by"]]
        if not bottom <= raw["start"] <= top:
            raise ConfigError(f"'{p}start'{where} must be from {bottom:g} to {top:g} ({out['by']}), "
                              f"got {raw['start']!r}")
        out["start"] = float(raw["start"])
    if "rel_tol" in raw:
        v = raw["rel_tol"]
        if not _positive(v) or not v < 1:
            raise ConfigError(f"'{p}rel_tol'{where} must be a number in (0, 1), got {v!r}")
        out["rel_tol"] = float(v)
    if "max_points" in raw:
        v = raw["max_points"]
        if not _count(v, 2) or v > 1000:
            raise ConfigError(f"'{p}max_points'{where} must be an integer from 2 to 1000, got {v!r}")
        out["max_points"] = v
    if "max_concurrency" in raw:
        from aisim.traces.load import check_load

        out.update(check_load({"max_concurrency": raw["max_concurrency"]}, where, p))
    out.update(_band(raw, where, p))
    return out


def _band(raw: dict, where: str, p: str) -> dict:
    """``band``: search again at the ends of the calibration's band (default true; given only when set)."""
    if "band" not in raw:
        return {}
    if not isinstance(raw["band"], bool):
        raise ConfigError(f"'{p}band'{where} must be true or false, got {raw['band']!r}")
    return {"band": raw["band"]}


def _fleet(raw, where: str, prefix: str = "") -> dict:
    from aisim.config.deployment import MAX_REPLICAS
    from aisim.sweep.knobs import check_grid
    from aisim.traces.load import check_load

    p = f"{prefix}fleet."
    if not isinstance(raw, dict):
        raise ConfigError(f"'{prefix}fleet'{where} must be a table of {', '.join(_FLEET)}")
    for k in raw:
        if k not in _FLEET:
            raise ConfigError(f"unknown key '{p}{k}'{where}; known keys: {', '.join(_FLEET)}")
    n = raw.get("max_replicas")
    if not _count(n) or n > MAX_REPLICAS:
        raise ConfigError(f"'{p}max_replicas'{where} must be an integer from 1 to {MAX_REPLICAS}, got {n!r}")
    agg = raw.get("aggregated", True)
    if not isinstance(agg, bool):
        raise ConfigError(f"'{p}aggregated'{where} must be true or false, got {agg!r}")
    splits = raw.get("splits", [])
    if not isinstance(splits, list) or not all(
            isinstance(s, list) and len(s) == 2 and all(_count(x) for x in s) for s in splits):
        raise ConfigError(f"'{p}splits'{where} must be a list of [prefill, decode] replica counts, e.g. "
                          "[[1, 1], [1, 3]]")
    if len({tuple(s) for s in splits}) != len(splits):
        raise ConfigError(f"'{p}splits'{where} repeats a split")
    grid = raw.get("grid", {})
    if not isinstance(grid, dict):
        raise ConfigError(f"'{p}grid'{where} must be a table of knob = [values]")
    check_grid(grid, "capacity", where, f"{p}grid.")
    check_layout_knobs(grid, agg, splits, where, p)
    load = check_load({k: raw[k] for k in ("poisson_rate", "rate_scale", "seed") if k in raw}, where, p)
    return {"max_replicas": n, "aggregated": agg, "splits": [tuple(s) for s in splits],
            "grid": {k: list(v) for k, v in grid.items()}, "load": load, **_band(raw, where, p)}


def check_layout_knobs(grid: dict, aggregated: bool, splits, where: str = "", prefix: str = "fleet.") -> None:
    """Refuse a router knob of a layout the search does not try: ``router`` sets the aggregated
    replicas' router, ``prefill_router`` and ``decode_router`` a split's pools."""
    from aisim.sweep.knobs import POOL_KNOBS

    for k in grid:
        if k == "router" and not aggregated:
            raise ConfigError(f"'{prefix}grid.router'{where} sets the router of aggregated replicas, and "
                              f"'{prefix}aggregated' is false: vary 'prefill_router' or 'decode_router' for splits")
        if k in POOL_KNOBS and not splits:
            raise ConfigError(f"'{prefix}grid.{k}'{where} sets a pool of a prefill/decode split, and no "
                              f"'{prefix}splits' are given: give splits (and a disaggregated deployment)")


def read_spec_trace(spec: CapacitySpec):
    """The spec's trace table (read once per search)."""
    from aisim.traces import read_trace

    t = spec.trace
    return read_trace(t["path"], t["format"], **t["options"])  # no format: guessed from the file


def run_capacity(spec: CapacitySpec, progress=None):
    """Answer the spec's question and land every evaluated point in its database.

    Parameters
    ----------
    spec : CapacitySpec
    progress : callable, optional
        Told each phase and point, as :class:`aisim.cli_util.Phases` is.

    Returns
    -------
    aisim.capacity.search.CapacityResult
    """
    from aisim.capacity.search import highest_rate, smallest_deployment
    from aisim.capacity.store import land_points
    from aisim.pipeline.landing import check_database_file

    check_database_file(spec.database)  # before the search: a file the points could not land in is refused now
    phase = progress or (lambda name, note="": None)
    phase("reading trace", os.path.basename(spec.trace["path"]))
    trace = read_spec_trace(spec)
    common = {"deployment": spec.deployment, "price_per_gpu_hour": spec.price_per_gpu_hour, "name": spec.name,
              "progress": progress}
    if spec.question == "rate":
        result = highest_rate(trace, spec.engine, spec.slo, **common, **spec.params)
    else:
        result = smallest_deployment(trace, spec.engine, spec.slo, **common, **spec.params)
    last = result.points[-1] if result.points else None  # the last point's phase ends with its verdict
    phase("landing", last["verdict"] if last is not None else "")
    land_points(spec.database, result)
    return result
