"""Capacity searches: the highest request rate within an SLO, and the smallest deployment that serves a trace.

:func:`highest_rate` replays the trace at a rate, judges the replay against the SLO
(:class:`aisim.capacity.slo.Judge`) and bisects along the rate: from a first rate it doubles
(or halves) until the verdict changes, then halves the bracket until its width is at most
``rel_tol`` of its lower end.  The rate is a Poisson re-timing of the trace (``poisson_rate``,
seeded; the default) or a scaling of its own arrivals (``rate_scale``), :mod:`aisim.traces.load`.

:func:`smallest_deployment` replays the trace (at its own rate, or a given load) on deployments
of every point of a grid (engine knobs, and the layout: aggregated replicas or a prefill/decode
split ``[p, d]`` taken ``k`` times) and bisects along the replicas of each (doubling from one,
then halving the bracket): the smallest count that meets the SLO.  The answer is the grid point
with the fewest GPUs, then the fewest GPU-hours (the lowest price), then the first in grid order.

Bisection assumes the verdict is monotone along its axis: that a rate above a failing one fails
too, and that more replicas of a deployment that meets the SLO meet it too.  Nothing guarantees
it (a larger batch can change what the scheduler does), so every evaluated point is kept, and
:func:`monotone_notes` reports what contradicts it among them: a verdict, or an attainment, that
moves the wrong way along the axis.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field, replace

import pyarrow as pa

from aisim.capacity.slo import Judge, Slo
from aisim.columns import CAPACITY_POINTS
from aisim.errors import ConfigError
from aisim.sweep.deployments import deployment_gpus

# The columns a point fills (the search's own columns, search_id ... slo, are added when it lands).
_SEARCH_COLUMNS = ("search_id", "search", "question", "slo") + ("run_id", "shard_id", "model")
# What a pipeline run tags its searches' points with (NULL for a search of its own).
TAGS = ("run_id", "shard_id", "model")
POINT_COLUMNS = tuple(n for n in CAPACITY_POINTS.names if n not in _SEARCH_COLUMNS)
RATE_AXES = ("poisson_rate", "rate_scale")
QUESTIONS = ("rate", "deployment")


@dataclass
class Point:
    """One evaluated point: its row of ``capacity_points`` (without the search's columns).

    Attributes
    ----------
    row : dict
        :data:`POINT_COLUMNS` -> value.
    axis : float
        Its place on the searched axis: the rate (``poisson_rate`` or ``rate_scale``), or the
        multiple of the layout (replicas, or splits ``k`` of a prefill/decode split).
    """

    row: dict
    axis: float = math.nan
    summary: dict | None = field(default=None, repr=False)  # the replay's summary (None: refused)

    def __getitem__(self, name: str):
        return self.row[name]

    @property
    def meets(self) -> bool:
        """The point met the SLO."""
        return self.row["verdict"] == "meets"


@dataclass
class CapacityResult:
    """A search's answer and every point it evaluated.

    Attributes
    ----------
    search_id : str
        16 hex digits: SHA-256 of the question, its inputs and the trace (the same inputs, the
        same id and the same points).
    name : str
    question : str
        ``rate`` or ``deployment``.
    slo : Slo
    points : list of Point
        In evaluation order.
    answer : Point or None
        The highest rate within the SLO, or the smallest deployment; None when no point meets it.
    notes : list of str
        What the search could not settle: an unbounded bracket, the point budget spent, and
        every observation against monotonicity (:func:`monotone_notes`).
    tags : dict
        ``run_id``, ``shard_id`` and ``model`` of the pipeline run that ran the search (empty: none).
    band : dict or None
        A rate search's band (:func:`rate_band`): ``low_req_s`` and ``high_req_s``, the answers of
        the same search with every step time at the ``scale`` factors of ``calibration``'s
        held-out errors; None without one.
    floor : str or None
        Why no rate meets the SLO, when even one request at a time fails it (:func:`floor_note`;
        also the first of ``notes``).
    """

    search_id: str
    name: str
    question: str
    slo: Slo
    points: list = field(default_factory=list)
    answer: Point | None = None
    notes: list = field(default_factory=list)
    tags: dict = field(default_factory=dict)
    band: dict | None = None
    floor: str | None = None

    def rows(self) -> list:
        """Every point as a full ``capacity_points`` row (column order of the catalogue)."""
        extra = {"search_id": self.search_id, "search": self.name, "question": self.question,
                 "slo": json.dumps(self.slo.to_dict(), sort_keys=True), **dict.fromkeys(TAGS), **self.tags}
        return [[{**p.row, **extra}[n] for n in CAPACITY_POINTS.names] for p in self.points]


def own_rate(trace: pa.Table) -> float | None:
    """The trace's own request rate: (requests - 1) over its arrival span; None without one."""
    if (trace.schema.metadata or {}).get(b"clock") != b"time" or trace.num_rows < 2:
        return None
    arrivals = trace.column("arrival_s")
    import pyarrow.compute as pc

    span = pc.max(arrivals).as_py() - pc.min(arrivals).as_py()
    return (trace.num_rows - 1) / span if span > 0 else None


def cost_columns(gpus: int, duration_s: float, output_tokens: int, price_per_gpu_hour: float | None) -> dict:
    """``gpu_hours``, ``cost`` and ``cost_per_mtok`` of a replay (cost columns None without a price)."""
    hours = gpus * duration_s / 3600.0
    cost = hours * price_per_gpu_hour if price_per_gpu_hour is not None else None
    per = cost / output_tokens * 1e6 if cost is not None and output_tokens > 0 else None
    return {"gpu_hours": hours, "cost": cost, "cost_per_mtok": per}


class _Evaluator:
    """Replays the trace at a load on a deployment and fills a point's row."""

    def __init__(self, trace, slo: Slo, price: float | None, progress):
        self.trace = trace
        self.own = own_rate(trace)
        self.judge = Judge(slo)
        self.price = price
        self.progress = progress or (lambda name, note="": None)
        self.points = []

    def close(self) -> None:
        self.judge.close()

    def refused(self, reason: str, phase: str = "refused", **row) -> Point:
        base = dict.fromkeys(POINT_COLUMNS)
        base.update(point=len(self.points), phase=phase, knobs="{}", load="{}", verdict="refused", reason=reason,
                    answer=False)
        base.update(row)
        p = Point(base)
        self.points.append(p)
        return p

    def __call__(self, engine, deployment, load: dict, phase: str, axis: float, **row) -> Point:
        from aisim.traces.load import TRANSFORM_KEYS, retime

        transform = {k: v for k, v in load.items() if k in TRANSFORM_KEYS}
        trace = retime(self.trace, **transform) if transform else self.trace
        n = deployment.replicas if deployment is not None else 0
        what = f"{n} replica{'s' if n != 1 else ''}" if deployment is not None else "one engine"
        last = self.points[-1] if self.points else None  # the running phase ends with its verdict
        verdict = "" if last is None else last["verdict"] + (
            f", attainment {last['attainment']:.4g}" if last["attainment"] is not None else "")  # p99 SLOs: none
        self.progress(f"point {len(self.points)} ({phase}): {_describe(load)} on {what}", verdict)
        if deployment is None:
            from aisim.replay import replay

            res = replay(trace, engine, reject_too_long=True, max_concurrency=load.get("max_concurrency"))
        else:
            from aisim.deploy import deploy

            res = deploy(trace, engine, deployment, max_concurrency=load.get("max_concurrency"))
        s = res.summary
        verdict = self.judge(res.requests, s)
        gpus = deployment_gpus(deployment, engine)
        rate = load.get("poisson_rate")
        if rate is None:
            rate = self.own * load.get("rate_scale", 1.0) if self.own is not None else None
        out = dict.fromkeys(POINT_COLUMNS)
        out.update(point=len(self.points), phase=phase, knobs="{}", load=json.dumps(load, sort_keys=True),
                   deployment=json.dumps(deployment.to_dict(), sort_keys=True) if deployment is not None else None,
                   replicas=deployment.replicas if deployment is not None else 1,
                   prefill_replicas=deployment.prefill.replicas if deployment is not None and deployment.disaggregated
                   else None,
                   decode_replicas=deployment.decode.replicas if deployment is not None and deployment.disaggregated
                   else None,
                   rate_req_s=rate, verdict="meets" if verdict["meets"] else "fails", reason=verdict["reason"],
                   answer=False, requests=verdict["requests"], finished=verdict["finished"],
                   rejected=s.get("rejected", 0), slo_met=verdict["slo_met"], attainment=verdict["attainment"],
                   throughput_req_s=s["throughput_req_s"], throughput_tok_s=s["throughput_tok_s"],
                   duration_s=s["duration_s"], output_tokens=s["output_tokens"], gpus=gpus,
                   **cost_columns(gpus, s["duration_s"], s["output_tokens"], self.price))
        for lat in ("ttft", "tpot", "e2e"):
            for p in ("p50", "p99"):
                out[f"{lat}_{p}_s"] = s[f"{lat}_s"][p]
        out.update(row)
        point = Point(out, axis, s)
        self.points.append(point)
        return point


def _describe(load: dict) -> str:
    from aisim.traces.load import describe_load

    return describe_load(load)


def _check_tags(tags) -> dict:
    tags = dict(tags or {})
    unknown = sorted(set(tags) - set(TAGS))
    if unknown:
        raise ConfigError(f"unknown search tag(s) {', '.join(unknown)}; known: {', '.join(TAGS)}")
    return tags


def search_id(question: str, name: str, inputs: dict, trace: pa.Table, tags: dict | None = None) -> str:
    """16 hex digits of SHA-256 over the question, its inputs (JSON), its tags and the trace's Arrow stream.

    A search without tags hashes what it did before tags existed: its id is unchanged.
    """
    head = {"question": question, "name": name, **inputs}
    if tags:
        head["tags"] = tags
    h = hashlib.sha256(json.dumps(head, sort_keys=True, default=str).encode())
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, trace.schema) as w:
        w.write_table(trace)
    h.update(sink.getvalue().to_pybytes())
    return h.hexdigest()[:16]


def _deployment_dict(deployment):
    return deployment.to_dict() if deployment is not None else None


def highest_rate(trace: pa.Table, engine, slo: Slo, *, deployment=None, by: str = "poisson_rate", seed: int = 0,
                 start: float | None = None, rel_tol: float = 0.02, max_points: int = 40,
                 max_concurrency: int | None = None, price_per_gpu_hour: float | None = None,
                 name: str = "capacity", progress=None, tags: dict | None = None,
                 band: bool = True) -> CapacityResult:
    """The highest request rate ``engine`` (or ``deployment`` of it) serves within ``slo``.

    Parameters
    ----------
    trace : pyarrow.Table
        The trace (:func:`aisim.traces.read_trace`).
    engine : EngineConfig
    slo : Slo
    deployment : DeploymentConfig, optional
        Replay through this deployment (:func:`aisim.deploy.deploy`); default the engine alone,
        whose over-long prompts are rejected as vLLM's server rejects them (each fails the SLO).
    by : str
        ``poisson_rate`` (the trace re-timed as a Poisson process of ``r`` requests/s, gaps from
        ``seed``) or ``rate_scale`` (its own arrivals divided by ``f``).
    seed : int
        Seed of the Poisson gaps (the same gaps, scaled, at every rate).
    start : float, optional
        The first rate tried; default the trace's own rate (``poisson_rate``; 1 request/s when it
        has none) or 1 (``rate_scale``).
    rel_tol : float
        Stop when the bracket is at most ``rel_tol`` of its lower end wide: the answer is then
        within ``rel_tol`` of the highest rate that meets the SLO (if the verdict is monotone).
    max_points : int
        Replays at most; the search stops there with a note.
    max_concurrency : int, optional
        The client's cap on requests in flight.
    price_per_gpu_hour : float, optional
        Fills the cost columns.
    name : str
    progress : callable, optional
        Told each point, as :class:`aisim.cli_util.Phases` is.
    tags : dict, optional
        ``run_id``, ``shard_id``, ``model``: the pipeline run and shard the search belongs to
        (written to every point and hashed into the search's id).
    band : bool
        Search again at each end of the calibration's step-time band (:func:`rate_band`): the
        answer's ``band``.

    Returns
    -------
    CapacityResult
        ``answer``: the highest rate that met the SLO, or None when none did down to the
        smallest rate tried.

    Raises
    ------
    ConfigError
        A bad parameter, a trace the engine cannot hold, or a deployment of a step-clocked trace.
    """
    from aisim.replay import check_trace

    tags = _check_tags(tags)
    if by not in RATE_AXES:
        raise ConfigError(f"'rate.by' must be one of {', '.join(RATE_AXES)}, got {by!r}")
    fault = check_trace(trace, engine, reject_too_long=deployment is None)
    if fault is not None:
        raise ConfigError(f"the trace cannot be replayed on this engine: {fault}")
    own = own_rate(trace)
    # The rates a load level may take (aisim.traces.load.RANGES): the bracket stays within them.
    from aisim.traces.load import RANGES

    bottom, top = RANGES[by]
    x = float(start) if start is not None else (own or 1.0) if by == "poisson_rate" else 1.0
    if not bottom <= x <= top:
        raise ConfigError(f"'rate.start' must be from {bottom:g} to {top:g} ({by}), got {x!r}")
    cap = {"max_concurrency": max_concurrency} if max_concurrency is not None else {}

    def load(x):
        return {"poisson_rate": x, "seed": seed, **cap} if by == "poisson_rate" else {"rate_scale": x, **cap}

    sid = search_id("rate", name, {"engine": engine.raw, "deployment": _deployment_dict(deployment),
                                   "slo": slo.to_dict(), "by": by, "seed": seed, "start": x, "rel_tol": rel_tol,
                                   "max_points": max_points, "cap": cap, "price": price_per_gpu_hour}, trace, tags)
    result = CapacityResult(sid, name, "rate", slo, tags=tags)
    ev = _Evaluator(trace, slo, price_per_gpu_hour, progress)
    try:
        lo, hi = _rate_bisection(ev, engine, deployment, load, x, rel_tol, max_points, bottom, top)
    finally:
        ev.close()
    result.points = ev.points
    unit = "requests/s" if by == "poisson_rate" else "x the trace's rate"
    if lo is None and hi is None:  # the floor fails: no rate meets the SLO
        result.floor = floor_note(ev.points[-1], slo)
        result.notes.append(result.floor)
    elif lo is None:
        why = f"budget of {max_points} points" if hi.axis / 2 >= bottom else f"the smallest {by} is {bottom:g}"
        result.notes.append(f"no rate down to {hi.axis:.6g} {unit} meets the SLO ({why})")
    elif hi is None:
        why = f"budget of {max_points} points" if lo.axis * 2 <= top else f"the largest {by} is {top:g}"
        result.notes.append(f"every rate up to {lo.axis:.6g} {unit} meets the SLO: the answer is a lower bound "
                            f"({why})")
    elif hi.axis - lo.axis > rel_tol * lo.axis:
        result.notes.append(f"stopped after {max_points} points with the bracket [{lo.axis:.6g}, {hi.axis:.6g}] "
                            f"wider than rel_tol {rel_tol:g}")
    if lo is not None:
        lo.row["answer"] = True
        result.answer = lo
        short = steady_state_note(lo, trace.num_rows)
        if short is not None:
            result.notes.append(short)
    result.notes.extend(monotone_notes([p for p in result.points if p["phase"] != "floor"], rising=False))
    if band and lo is not None:
        result.band = rate_band(trace, engine, slo, deployment, load, lo.axis, rel_tol, max_points, bottom, top)
        if result.band is not None:
            lo.row.update(band_low_req_s=result.band["low_req_s"], band_high_req_s=result.band["high_req_s"],
                          calibration=result.band["calibration"])
            result.notes.extend(result.band["notes"])
    return result


def _rate_bisection(ev, engine, deployment, load, x: float, rel_tol: float, max_points: int, bottom: float,
                    top: float) -> tuple:
    """Bracket from ``x`` (doubling or halving within ``[bottom, top]`` until the verdict changes), then
    bisect: ``(lo, hi)`` points; both None when even one request at a time fails (the floor)."""
    lo = hi = None
    p = ev(engine, deployment, load(x), "bracket", x)
    if p.meets:
        lo = p
        while len(ev.points) < max_points and lo.axis * 2 <= top:
            p = ev(engine, deployment, load(lo.axis * 2), "bracket", lo.axis * 2)
            if not p.meets:
                hi = p
                break
            lo = p
    else:
        hi = p
        # The floor: every rate above zero is judged against what an idle engine gives.  No rate
        # can beat one request at a time (the limit of a rate going to zero), so if that fails,
        # halving would only spend the budget.
        floor = ev(engine, deployment, {"max_concurrency": 1}, "floor", 0.0, rate_req_s=None)
        if not floor.meets:
            hi = None
        while hi is not None and len(ev.points) < max_points and hi.axis / 2 >= bottom:
            p = ev(engine, deployment, load(hi.axis / 2), "bracket", hi.axis / 2)
            if p.meets:
                lo = p
                break
            hi = p
    while lo is not None and hi is not None and hi.axis - lo.axis > rel_tol * lo.axis \
            and len(ev.points) < max_points:
        mid = (lo.axis + hi.axis) / 2
        p = ev(engine, deployment, load(mid), "bisect", mid)
        if p.meets:
            lo = p
        else:
            hi = p
    return lo, hi


def rate_band(trace: pa.Table, engine, slo: Slo, deployment, load, start: float, rel_tol: float,
              max_points: int, bottom: float, top: float) -> dict | None:
    """The band of a rate search's answer: the same search with every step time scaled by each end of
    the calibration's step-time band.

    The calibration is the engine's time model's own record, else the defaults'
    (:func:`aisim.config.calibration.calibration_of`); its factors ``(low, high)``
    (:func:`aisim.config.calibration.scale_band`) multiply every step time
    (``time_model.time_scale``).  Steps at the high factor give the low end of the band, at the low
    factor the high end.  Each search starts at the answer ``start`` and keeps its points to itself
    (they are not the question's points).

    Returns
    -------
    dict or None
        ``low_req_s``, ``high_req_s`` (None where no rate met the SLO), ``scale`` (the two
        factors), ``calibration`` (its name) and ``notes``; None when the calibration gives no
        band, or a prefill/decode split runs engines of its own files.
    """
    from aisim.config.calibration import calibration_of, scale_band

    cal = calibration_of(engine.time_model)
    factors = scale_band(cal)
    if factors is None or (deployment is not None and deployment.disaggregated
                           and any(isinstance(p.engine, str) for p in (deployment.prefill, deployment.decode))):
        return None
    out = {"calibration": cal["name"], "scale": list(factors), "notes": []}
    base = engine.time_model.time_scale
    for end, factor in (("low_req_s", factors[1]), ("high_req_s", factors[0])):
        scaled = engine.replace(time_model=dict(engine.raw.get("time_model", {}), time_scale=base * factor))
        ev = _Evaluator(trace, slo, None, None)
        try:
            lo, hi = _rate_bisection(ev, scaled, deployment, load, start, rel_tol, max_points, bottom, top)
        finally:
            ev.close()
        out[end] = lo["rate_req_s"] if lo is not None else None
        if lo is None and hi is None:
            out["notes"].append(f"band: with step times x{factor:.3g} even one request at a time fails the SLO")
        elif lo is None:
            out["notes"].append(f"band: with step times x{factor:.3g} no rate down to {hi['rate_req_s']:.6g} "
                                "requests/s meets the SLO")
        elif hi is None:
            out["notes"].append(f"band: with step times x{factor:.3g} every rate up to {lo['rate_req_s']:.6g} "
                                "requests/s meets the SLO (a lower bound)")
    return out


def floor_note(floor: Point, slo: Slo) -> str:
    """Why no rate meets ``slo``: what the floor point (one request at a time) gave, in the SLO's terms.

    ``even an idle engine gives P99 TTFT 608 ms (SLO 500 ms) on this trace: no rate meets the SLO``.
    """
    from aisim.capacity.slo import LIMITS

    parts = []
    for key, limit in slo.limits.items():
        lat, p = LIMITS[key]
        value = floor.summary[lat][p]
        if value is None or not value <= limit:
            shown = f"{value * 1e3:.3g} ms" if value is not None else "none"
            parts.append(f"{p.upper()} {lat[:-2].upper()} {shown} (SLO {limit * 1e3:.3g} ms)")
    if slo.attainment is not None and floor["attainment"] < slo.attainment:
        within = ", ".join(f"{k} <= {v:g}" for k, v in slo.thresholds.items()) or "finished"
        parts.append(f"{floor['attainment']:.4g} of requests within {within} (SLO {slo.attainment:.4g})")
    what = " and ".join(parts) if parts else floor["reason"]
    return (f"even an idle engine (one request at a time, point {floor['point']}) gives {what} on this trace: "
            "no rate meets the SLO")


# A replay reaches a steady state when its arrivals span many request lifetimes: the engine then
# holds as many requests as a long run at that rate would (Little's law: rate x latency in flight).
# Fewer than this many median end-to-end latencies and the answer comes from the start-up transient.
STEADY_LIFETIMES = 10


def steady_state_note(answer: Point, requests: int) -> str | None:
    """A warning when the answer's arrivals span fewer than :data:`STEADY_LIFETIMES` median E2E
    latencies (the trace window is too short to reach a steady state); None otherwise."""
    rate, e2e = answer["rate_req_s"], answer["e2e_p50_s"]
    if rate is None or not rate > 0 or e2e is None or not e2e > 0 or requests < 2:
        return None
    span = (requests - 1) / rate
    if span >= STEADY_LIFETIMES * e2e:
        return None
    return (f"the trace is too short for a steady state: at {rate:.6g} requests/s its {requests} requests arrive "
            f"over {span:.4g} s, {span / e2e:.2g} median E2E latencies ({e2e:.4g} s), fewer than "
            f"{STEADY_LIFETIMES}; the answer comes from the start-up transient and may be optimistic: give a "
            "longer trace")


def monotone_notes(points: list, rising: bool) -> list:
    """What contradicts a monotone verdict among ``points`` of one axis.

    Parameters
    ----------
    points : list of Point
        Points of one searched axis (refused points are ignored).
    rising : bool
        True when the verdict should improve along the axis (replicas), False when it should
        worsen (rate).

    Returns
    -------
    list of str
        One note per pair: a point that meets the SLO beyond one that fails it, or a higher
        attainment beyond a lower one.
    """
    pts = sorted((p for p in points if p["verdict"] != "refused"), key=lambda p: p.axis)
    if rising:
        pts = pts[::-1]  # from more replicas to fewer: the verdict should only worsen
    notes = []
    for i, a in enumerate(pts):
        for b in pts[i + 1:]:
            if b.axis == a.axis:
                continue
            if b.meets and not a.meets:
                notes.append(f"not monotone: {b.axis:.6g} meets the SLO but {a.axis:.6g} fails it")
            elif a["attainment"] is not None and b["attainment"] is not None and b["attainment"] > a["attainment"]:
                notes.append(f"attainment not monotone: {b['attainment']:.4g} at {b.axis:.6g} but "
                             f"{a['attainment']:.4g} at {a.axis:.6g}")
    return notes


def _applies(knob: str, layout) -> bool:
    """Whether a grid knob sets something of ``layout`` (None: aggregated replicas; ``(p, d)``: a split):
    ``router`` the aggregated replicas' router, ``prefill_router``/``decode_router`` a split's pools,
    an engine knob every layout."""
    from aisim.sweep.knobs import KNOBS, POOL_KNOBS

    if KNOBS.get(knob) != "deployment":
        return True
    return (knob in POOL_KNOBS) == (layout is not None)


def grid_points(engine, base, grid: dict, layouts):
    """Every grid point of a smallest-deployment search, in search order.

    Each layout is crossed with the grid's knobs that apply to it (:func:`_applies`), and each
    point resolved by :func:`aisim.sweep.knobs.resolve`, the path a sweep's candidates take.

    Yields
    ------
    tuple
        ``(name, layout, knobs, point)``: ``g000`` ..., the layout, the knobs applied, and the
        :class:`~aisim.sweep.knobs.Resolved` point (its deployment the layout's base, one multiple)
        or the :class:`ConfigError` that refuses it.
    """
    from aisim.sweep.knobs import resolve

    order = 0
    for layout in layouts:
        keys = [k for k in grid if _applies(k, layout)]
        # The deployment the layout's multiples are taken of: the base's router on aggregated replicas.
        dep = _layout_deployment(base, None, 1) if layout is None else base
        for values in itertools.product(*(grid[k] for k in keys)):
            knobs = dict(zip(keys, values))
            name = f"g{order:03d}"
            order += 1
            try:
                point = resolve(engine.raw, dep, knobs, f"candidate {name} {json.dumps(knobs, sort_keys=True)}",
                                engine=engine)
            except ConfigError as exc:
                point = exc
            yield name, layout, knobs, point


def _layout_deployment(base, layout, k: int):
    """The deployment of ``k`` times ``layout`` (None: aggregated replicas; ``(p, d)``: a split)."""
    if layout is None:
        return replace(base, replicas=k, prefill=None, decode=None, link=None)
    p, d = layout
    return replace(base, replicas=k * (p + d), prefill=replace(base.prefill, replicas=k * p),
                   decode=replace(base.decode, replicas=k * d))


def smallest_deployment(trace: pa.Table, engine, slo: Slo, *, max_replicas: int, grid: dict | None = None,
                        splits=(), aggregated: bool = True, deployment=None, load: dict | None = None,
                        price_per_gpu_hour: float | None = None, name: str = "capacity",
                        progress=None, tags: dict | None = None, band: bool = True) -> CapacityResult:
    """The smallest deployment of ``engine`` that serves ``trace`` within ``slo``.

    Parameters
    ----------
    trace : pyarrow.Table
        A trace clocked in seconds (deployments replay by the clock).
    engine : EngineConfig
        The base engine; ``grid`` varies it.
    slo : Slo
    max_replicas : int
        The most replicas tried (both pools of a split counted).
    grid : dict, optional
        Knob -> list of values (:data:`aisim.sweep.knobs.SPEC_KNOBS` ``["capacity"]``: the engine's
        keys, ``router`` of aggregated replicas, ``prefill_router`` and ``decode_router`` of splits);
        every combination of the knobs that apply to a layout is a grid point of it.
    splits : sequence of (int, int)
        Prefill/decode splits: ``(p, d)`` is tried as ``k * p`` prefill and ``k * d`` decode
        replicas, ``k`` bisected.  They need a disaggregated ``deployment`` (its link and pools).
    aggregated : bool
        Try aggregated replicas too (the base deployment's router).
    deployment : DeploymentConfig, optional
        The base: its router, or its pools and link (default: round-robin replicas).
    load : dict, optional
        A load transform of the trace (:mod:`aisim.traces.load`); default the trace as it is.
    price_per_gpu_hour : float, optional
    name : str
    progress : callable, optional
    tags : dict, optional
        As :func:`highest_rate`'s.
    band : bool
        Search again with every step time at each end of the calibration's step-time band (as
        :func:`rate_band`): the answer's ``band``, ``low_gpus`` and ``high_gpus`` (the fewest
        GPUs at the low and the high factor; None: none within ``max_replicas``).

    Returns
    -------
    CapacityResult
        ``answer``: the fewest GPUs, then the fewest GPU-hours, then grid order; None when no
        grid point meets the SLO within ``max_replicas``.

    Raises
    ------
    ConfigError
        Splits without a disaggregated base deployment, no layout, or a bad load.
    """
    from aisim.config.deployment import MAX_REPLICAS, DeploymentConfig
    from aisim.replay import check_trace
    from aisim.traces.load import check_load

    tags = _check_tags(tags)
    grid = dict(grid or {})
    splits = [tuple(s) for s in splits]
    load = check_load(dict(load or {}), "", "fleet.")
    if not isinstance(max_replicas, int) or isinstance(max_replicas, bool) or not 1 <= max_replicas <= MAX_REPLICAS:
        raise ConfigError(f"'fleet.max_replicas' must be an integer from 1 to {MAX_REPLICAS}, "
                          f"got {max_replicas!r}")
    base = deployment if deployment is not None else DeploymentConfig()
    if splits and not base.disaggregated:
        raise ConfigError("'fleet.splits' need a disaggregated base deployment (its pools and link): give "
                          "'deployment' with prefill, decode and link")
    layouts = ([None] if aggregated else []) + splits
    if not layouts:
        raise ConfigError("'fleet.aggregated' is false and no 'fleet.splits' are given: nothing to try")
    from aisim.capacity.spec import check_layout_knobs
    from aisim.sweep.knobs import check_grid

    check_grid(grid, "capacity", "", "fleet.grid.")
    check_layout_knobs(grid, aggregated, splits)
    sid = search_id("deployment", name, {"engine": engine.raw, "deployment": _deployment_dict(deployment),
                                         "slo": slo.to_dict(), "grid": grid, "splits": splits,
                                         "aggregated": aggregated, "max_replicas": max_replicas, "load": load,
                                         "price": price_per_gpu_hour}, trace, tags)
    result = CapacityResult(sid, name, "deployment", slo, tags=tags)
    ev = _Evaluator(trace, slo, price_per_gpu_hour, progress)
    best = []  # (gpus, gpu_hours, order, point) of each grid point's smallest deployment
    try:
        for order, (cand, layout, knobs, point) in enumerate(grid_points(engine, base, grid, layouts), 1):
            shown = {**knobs, "layout": "aggregated" if layout is None else list(layout)}
            row = {"candidate": cand, "knobs": json.dumps(shown, sort_keys=True)}
            if isinstance(point, ConfigError):
                ev.refused(str(point), **row)
                continue
            eng = point.engine
            fault = check_trace(trace, eng)
            if fault is not None:
                ev.refused(f"the trace cannot be replayed on it: {fault}", **row)
                continue
            size = 1 if layout is None else sum(layout)
            top = max_replicas // size
            if top == 0:
                ev.refused(f"the split {list(layout)} needs {size} replicas, more than max_replicas {max_replicas}",
                           **row)
                continue
            found = _bisect_replicas(ev, eng, point.deployment, layout, top, {**load}, row)
            mine = [p for p in ev.points if p["candidate"] == cand]
            result.notes.extend(f"{cand}: {n}" for n in monotone_notes(mine, rising=True))
            if found is not None:
                best.append((found["gpus"], found["gpu_hours"], order, found))
    finally:
        ev.close()
    result.points = ev.points
    if best:
        answer = min(best, key=lambda b: b[:3])[3]
        answer.row["answer"] = True
        result.answer = answer
        if band:
            result.band = _fleet_band(trace, engine, slo, base, deployment, dict(
                max_replicas=max_replicas, grid=grid, splits=splits, aggregated=aggregated, load=load))
            if result.band is not None:
                answer.row.update(band_low_gpus=result.band["low_gpus"], band_high_gpus=result.band["high_gpus"],
                                  calibration=result.band["calibration"])
    return result


def _fleet_band(trace, engine, slo, base, deployment, question: dict) -> dict | None:
    """A deployment answer's band: the same search with every step time at each end of the calibration's band."""
    from aisim.config.calibration import calibration_of, scale_band

    cal = calibration_of(engine.time_model)
    factors = scale_band(cal)
    if factors is None or (base.disaggregated
                           and any(isinstance(p.engine, str) for p in (base.prefill, base.decode))):
        return None
    out = {"calibration": cal["name"], "scale": list(factors), "notes": []}
    for end, factor in (("low_gpus", factors[0]), ("high_gpus", factors[1])):
        tm = dict(engine.raw.get("time_model", {}), time_scale=engine.time_model.time_scale * factor)
        res = smallest_deployment(trace, engine.replace(time_model=tm), slo, deployment=deployment, band=False,
                                  **question)
        out[end] = res.answer["gpus"] if res.answer is not None else None
    return out


def _bisect_replicas(ev, engine, base, layout, top: int, load: dict, row: dict):
    """The smallest multiple ``k`` in 1..``top`` of ``layout`` that meets the SLO (its point), or None.

    Doubling from one (capped at ``top``) brackets it; bisection closes the bracket.
    """
    lo, hi, k = 0, None, 1  # lo: the largest k known to fail (0: none); hi: the smallest known to meet
    while hi is None:
        p = ev(engine, _layout_deployment(base, layout, k), load, "bracket", k, **row)
        if p.meets:
            hi = p
        elif k == top:
            return None
        else:
            lo, k = k, min(2 * k, top)
    while hi.axis - lo > 1:
        k = (lo + int(hi.axis)) // 2
        p = ev(engine, _layout_deployment(base, layout, k), load, "bisect", k, **row)
        if p.meets:
            hi = p
        else:
            lo = k
    return hi
