"""How close aisim's roofline step times come to published vLLM serving measurements.

Every point of ``benchmarks/data/published_vllm.csv`` (sources and what each table said:
``benchmarks/data/README.md``) is a workload of fixed input and output lengths on a named
GPU, model and tensor-parallel size.  Each is replayed through aisim:

* ``burst``: every request sent at once (``vllm bench serve`` at request rate ``inf``);
* ``concurrency``: at most ``concurrency`` requests in flight (``--max-concurrency``):
  ``replay(..., max_concurrency=C)``, the core sending a request when another finishes;
* ``rate``: Poisson sends at ``rate_rps``, seeded; with a ``concurrency`` too, at most that
  many in flight (``--request-rate R --max-concurrency C``), a send due while ``C`` are in
  flight waiting for one to finish.

Every request reaches the engine through the API server's serial queue (:mod:`aisim.perf.frontend`),
which the replay adds itself (the time model's ``frontend`` costs); latencies and throughput count
from the client's sends (a capped run's: when the cap let the request go).

The engine is what ``aisim plan --model M --gpu G --tp N`` writes (vllm serve's batch
limits for the GPU, the KV cache left by the weights at the point's
``gpu_memory_utilization``), with the roofline's efficiencies and overhead.  The script
prints predicted against published TTFT, TPOT and output throughput (the statistic each
source published: mean, median or p99), the mean end-to-end latency where the published means
imply it exactly (:func:`published_e2e`), and the median absolute error per metric, for the
sources the defaults were fitted on and for the held-out ones.

    python benchmarks/timing_accuracy.py            # with the defaults of aisim/config/keys.py
    python benchmarks/timing_accuracy.py --fit      # refit on the fitting sources, then report
    python benchmarks/timing_accuracy.py --cross-validate --iters 150 --jobs 2
                                                    # each source predicted by a fit on the others
    python benchmarks/timing_accuracy.py --identify # which fitting points set each free number

``--fit`` searches the roofline's free numbers (compute, attention and bandwidth
efficiencies, the overhead per step and per scheduled request, the executor's per scheduled
request on more than one GPU, the GPU's cost a layer; the routed experts run at their kernel's
measured rate, :mod:`aisim.perf.moe_kernel`) and the API server's two
costs (per request, per prompt token) by Nelder-Mead on the mean absolute log error of
TPOT, throughput and the TTFT of bursts and of cold long prompts over the fitting sources'
points (absolute, not squared, so that a few points the model cannot reach do not steer the
fit), and prints the values to write into ``TIME_MODEL_KEYS``.
``--cross-validate`` runs the same fit once per source on every other source's points and
reports each source's errors from the fit that left it out.  ``--identify`` raises each free number
alone and prints the fitting points' terms whose log error moves most: which rows set it.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time

import numpy as np
import pyarrow as pa

from aisim.calibrate.workload import legacy_send_times
from aisim.throughput import Span, per_second

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "published_vllm.csv")

# Which sources the defaults are fitted on; every other source is held out.
FIT_SOURCES = ("cssnoeasy", "kvcached", "vllm-pr", "inferencex")
METRICS = ("ttft", "tpot", "e2e", "throughput")


def load_points(path: str = DATA, fit_sources=FIT_SOURCES) -> list[dict]:
    """The published points, numbers parsed, each marked ``fit`` or ``held-out`` by its source."""
    ints = ("tp", "concurrency", "seed", "client_vocab_size", "num_prompts", "input_len", "output_len",
            "requested_output_len", "max_model_len")  # cached_prefix_by_run stays text (cached_runs reads it)
    floats = ("rate_rps", "gpu_memory_utilization", "ttft_ms", "tpot_ms", "throughput_tok_s")
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        for k in ints:
            r[k] = int(r[k]) if r[k] else None
        for k in floats:
            r[k] = float(r[k]) if r[k] else None
        r["split"] = "fit" if r["source"] in fit_sources else "held-out"
    return rows


# The release whose plan the published points' engines follow (16-token blocks, as theirs).
BLOCKS_AS = "0.33.0"


def engine_for(point: dict, efficiencies: dict):
    """The engine ``aisim plan`` writes for the point's model, GPU and tensor parallelism, with
    ``efficiencies`` (any time-model keys: the roofline's and the API server's) in its time model."""
    from aisim.plan import plan_from_model

    # Unrecorded, max_model_len is vllm serve's default, as the plan's.  The published runs are of
    # releases before the ones aisim models; their KV cache takes 16-token blocks and the memory share
    # the source gives (else 0.9, the default of those releases), as vLLM 0.33.0's plan does.
    cfg, _ = plan_from_model(point["model"], tp=point["tp"], max_model_len=point["max_model_len"], gpu=point["gpu"],
                             gpu_memory_utilization=point["gpu_memory_utilization"] or 0.9,
                             dtype=point["dtype"] or None, vllm_version=BLOCKS_AS)
    tm = dict(cfg.raw["time_model"], **efficiencies)
    if triton_group_quant(point):
        tm["triton_group_quant"] = True
    return cfg.replace(time_model=tm, plan_notes=[], async_scheduling=async_scheduling(point))


def release(point: dict) -> tuple[int, int]:
    """The point's vLLM release as ``(major, minor)``."""
    return tuple(int(x) for x in point["vllm_version"].split(".")[:2])


# vLLM turns async scheduling on by default from release 0.14 (its release notes; pull request 31998
# extended the default to speculative decoding): the engine's CPU work then overlaps the GPU's.
ASYNC_DEFAULT_FROM = (0, 14)


def async_scheduling(point: dict) -> bool:
    """Whether the point's server scheduled asynchronously: its ``async_scheduling`` column, else its release's
    default."""
    if point["async_scheduling"]:
        return point["async_scheduling"] == "true"
    return release(point) >= ASYNC_DEFAULT_FROM


# vLLM's per-token-group FP8 quantization before block-FP8 products: the Triton kernel in 0.8.4, the CUDA kernel
# first from 0.11.0 (fp8_utils.per_token_group_quant_fp8 of each release; aisim/perf/block_fp8.py).
CUDA_GROUP_QUANT_FROM = (0, 11)


def triton_group_quant(point: dict) -> bool:
    """Whether the point's release quantized block-FP8 activations with the Triton kernel (unstated: no)."""
    if not point["vllm_version"]:
        return False
    return release(point) < CUDA_GROUP_QUANT_FROM


# Measured requests arrive this long after the warm-up ones, which fill the prefix cache first.
WARM_UP_S = 1000.0


def cached_runs(point: dict) -> list[tuple[int, int | None]]:
    """The prefix-cache state of each run a point averages: ``(tokens, prompts)`` pairs.

    ``cached_prefix_by_run`` holds one entry a run, ``;`` between them: ``T`` (``T``
    tokens of every prompt cached when the run started), ``T@K`` (``T`` tokens of the
    first ``K`` prompts only: a run resending the first ``K`` prompts of an earlier run
    with the same seed) or empty (a cold cache).  ``prompts`` is None for every prompt.

    Examples
    --------
    >>> cached_runs({"cached_prefix_by_run": "512;1021@100"})
    [(512, None), (1021, 100)]
    >>> cached_runs({"cached_prefix_by_run": ""})
    [(0, None)]
    """
    text = point["cached_prefix_by_run"]
    if not text:
        return [(0, None)]
    runs = []
    for entry in text.split(";"):
        tokens, _, prompts = entry.partition("@")
        runs.append((int(tokens), int(prompts) if prompts else None))
    return runs


def trace_for(point: dict, cached: int = 0, cached_prompts: int | None = None) -> tuple[pa.Table, dict, np.ndarray]:
    """The point's requests as a trace table, the replay's keyword arguments, the client's send times.

    ``cached``: tokens of each prompt already in the prefix cache when the run starts
    (``vllm bench serve``'s random prompts repeat when a seed is reused), of the first
    ``cached_prompts`` prompts only when that is given: one warm-up request per such
    prompt computes them first, and the measured requests (ids ``r...``) are sent
    ``WARM_UP_S`` later.  Each request arrives at its send (the replay puts the API
    server's queue between the send and the engine).  A run with a ``concurrency`` (a
    ``concurrency`` run, or a Poisson run under a cap) has its requests held by the
    client's cap (``replay(..., max_concurrency=C)``, as ``vllm bench serve
    --max-concurrency``); the core decides when each is sent.
    """
    from aisim.traces import from_frame

    n = point["num_prompts"]
    warm = 0 if not cached else n if cached_prompts is None else min(cached_prompts, n)
    t0 = WARM_UP_S if warm else 0.0
    cols = {"request_id": [f"r{i}" for i in range(n)], "prompt_len": [point["input_len"]] * n,
            "max_tokens": [point["output_len"]] * n, "prefix_group": list(range(n)),
            "prefix_len": [min(cached, point["input_len"])] * warm + [0] * (n - warm)}
    if point["workload"] in ("burst", "concurrency"):
        send = np.full(n, t0)
    elif point["workload"] == "rate" and point.get("client_vocab_size"):
        # The client's own sends, redrawn from its seed (benchmark_serving.py before vLLM 0.10).
        send = t0 + legacy_send_times(n, point["rate_rps"], 1.0, point["seed"] or 0, point["client_vocab_size"],
                                      (point["input_len"],) * 2, (point["requested_output_len"],) * 2)
    elif point["workload"] == "rate":
        rng = np.random.default_rng(point["seed"] or 0)
        gaps = rng.exponential(1.0 / point["rate_rps"], n)
        gaps[0] = 0.0
        send = t0 + np.cumsum(gaps)
    else:
        raise ValueError(f"{point['point']}: unknown workload {point['workload']!r}")
    kw = {"max_concurrency": point["concurrency"]} if capped(point) else {}
    cols["arrival_time"] = send.tolist()
    if warm:
        cols["request_id"] += [f"w{i}" for i in range(warm)]
        cols["prompt_len"] += [cached] * warm
        cols["max_tokens"] += [1] * warm
        cols["prefix_group"] += list(range(warm))
        cols["prefix_len"] += [cached] * warm
        cols["arrival_time"] += [0.0] * warm
    return from_frame(pa.table(cols)), kw, send


def capped(point: dict) -> bool:
    """Whether the client holds the point's requests in flight to a ``concurrency``."""
    return point["workload"] == "concurrency" or (point["workload"] == "rate" and bool(point["concurrency"]))


STAT = {"mean": "mean", "median": "p50", "p50": "p50", "p90": "p90", "p99": "p99"}


def _stat(values: np.ndarray, stat: str) -> float:
    values = values[~np.isnan(values)]
    if stat == "mean":
        return float(values.mean())
    return float(np.percentile(values, {"median": 50, "p50": 50, "p90": 90, "p99": 99}[stat]))


def predict(point: dict, efficiencies: dict) -> dict:
    """Predicted TTFT and TPOT (ms, the published statistic) and output throughput (tok/s).

    ``efficiencies``: the time model's :data:`FREE_ROOFLINE` numbers and the API server's
    :data:`FREE_FRONTEND` costs, which the replay applies (:mod:`aisim.perf.frontend`).  The
    replay's latencies count from each request's send (a capped run's: the cap's release), the
    throughput from the first send to the last finish.  A point published as the mean of several
    runs with different prefix-cache states (``cached_prefix_by_run``) is predicted as the mean of
    their replays.
    """
    from aisim.replay import replay

    runs = cached_runs(point)
    out = {m: 0.0 for m in METRICS}
    engine = engine_for(point, {k: efficiencies[k] for k in FREE})
    for cached, prompts in runs:
        trace, kw, _ = trace_for(point, cached, prompts)
        rq = replay(trace, engine, **kw).requests
        ids = np.array(rq.column("request_id").to_pylist(), dtype=object)
        mine = np.array([i.startswith("r") for i in ids])
        col = {c: rq.column(c).to_numpy(zero_copy_only=False)[mine]
               for c in ("ttft_s", "tpot_s", "e2e_s", "arrival_s", "finish_s", "output_tokens")}
        out["ttft"] += _stat(col["ttft_s"], point["ttft_stat"]) * 1e3 / len(runs)
        out["tpot"] += _stat(col["tpot_s"], point["tpot_stat"]) * 1e3 / len(runs)
        out["e2e"] += _stat(col["e2e_s"], "mean") * 1e3 / len(runs)
        span = Span()
        span.add(col["arrival_s"], col["finish_s"])
        done = ~np.isnan(col["finish_s"])
        tokens = float(col["output_tokens"][done].sum())
        out["throughput"] += per_second(tokens, span.duration(int(done.sum()))) / len(runs)
    return out


def published(point: dict) -> dict:
    """The point's published metrics; ``e2e`` derived where that is exact, else ``None``."""
    return {"ttft": point["ttft_ms"], "tpot": point["tpot_ms"], "e2e": published_e2e(point),
            "throughput": point["throughput_tok_s"]}


def published_e2e(point: dict) -> float | None:
    """The mean end-to-end latency (ms) the point's mean TTFT and mean TPOT imply, where they imply it exactly.

    ``vllm bench serve`` takes a request's TPOT as ``(latency - ttft) / (output_tokens - 1)``, so a
    request's latency is ``ttft + tpot * (output_tokens - 1)``; averaged over requests that all generate
    the same ``output_len`` tokens (the run asked for them and got them: ``--ignore-eos``), the mean
    latency is ``mean TTFT + (output_len - 1) * mean TPOT``.  No source publishes E2E itself; a point
    published as medians, or whose requests stopped early, has none.
    """
    fixed = point["output_len"] and point["output_len"] == point["requested_output_len"]
    if not fixed or point["ttft_stat"] != "mean" or point["tpot_stat"] != "mean":
        return None
    return point["ttft_ms"] + (point["output_len"] - 1) * point["tpot_ms"]


def errors(points, preds) -> list[dict]:
    """Each point's absolute relative error (%) per metric it has a published value of."""
    out = []
    for p, q in zip(points, preds):
        pub = published(p)
        out.append({m: 100.0 * abs(q[m] - pub[m]) / pub[m] for m in METRICS if pub[m]})
    return out


FREE_ROOFLINE = ("compute_efficiency", "attention_efficiency", "bandwidth_efficiency", "overhead_s",
                 "overhead_per_req_s", "executor_per_req_s", "layer_overhead_s")
FREE_FRONTEND = ("frontend_per_request_s", "frontend_per_token_s")
# Shares in (0, 1] first, then the costs searched in logs.
FREE = FREE_ROOFLINE + FREE_FRONTEND
SHARES = 3
# Bounds of the numbers searched in logs (seconds).
LOG_BOUNDS = {"overhead_s": (1e-5, 0.1), "overhead_per_req_s": (1e-7, 0.01), "executor_per_req_s": (1e-7, 0.01),
              "layer_overhead_s": (1e-7, 1e-3),
              "frontend_per_request_s": (1e-6, 0.1), "frontend_per_token_s": (1e-9, 1e-4)}


def _unpack(x) -> dict:
    eff = {k: float(np.clip(v, 0.05, 1.0)) for k, v in zip(FREE[:SHARES], x[:SHARES])}
    for k, v in zip(FREE[SHARES:], x[SHARES:]):
        lo, hi = LOG_BOUNDS[k]
        eff[k] = float(math.exp(np.clip(v, math.log(lo), math.log(hi))))
    return eff


# The metrics the fit follows: TPOT and throughput everywhere; TTFT where the engine's work is most
# of it: a burst's (the API server's queue and the prefills) and a run's whose prompts of at least
# COLD_PREFILL_TOKENS reach the engine uncached (the prefills and the wait behind the others').  A
# lightly loaded run's TTFT over short or cached prompts (a Poisson run below capacity, the cached
# cssnoeasy rounds) is mostly the client's and the server's streaming of the first token, which no
# queue or step time holds (benchmarks/data/README.md).
FIT_METRICS = ("ttft", "tpot", "throughput")
COLD_PREFILL_TOKENS = 2048


def _fitted_metrics(point: dict) -> tuple:
    cold = not point["cached_prefix_by_run"] and point["input_len"] >= COLD_PREFILL_TOKENS
    return FIT_METRICS if point["workload"] == "burst" or cold else ("tpot", "throughput")


def loss(points, eff: dict) -> float:
    """Mean absolute log error of each point's fitted metrics over ``points``."""
    total, count = 0.0, 0
    for p in points:
        q, pub = predict(p, eff), published(p)
        for m in _fitted_metrics(p):
            if pub[m] and q[m]:
                total += abs(math.log(q[m] / pub[m]))
                count += 1
    return total / count


# How far --identify raises each free number: a share by 10 % (at most to 1), a cost by 20 %.
IDENTIFY_SHARE, IDENTIFY_COST = 1.1, 1.2


def identify(points, eff: dict, top: int = 4, predict_fn=None) -> dict:
    """What sets each free number: the fitting terms whose log error moves most when it is raised.

    Each :data:`FREE` number is raised alone (a share by ``IDENTIFY_SHARE``, at most to 1; a cost by
    ``IDENTIFY_COST``) and every point's fitted metrics (:func:`_fitted_metrics`) replayed again.  A
    term's change is its absolute log error's change over the number of terms, so a number's changes
    add up to the change of :func:`loss`.

    Returns
    -------
    dict
        ``{name: (loss change, [(point, metric, change), ...])}``, the ``top`` largest changes first.
    """
    predict_fn = predict_fn or predict

    def terms(e):
        out = {}
        for p in points:
            q, pub = predict_fn(p, e), published(p)
            for m in _fitted_metrics(p):
                if pub[m] and q[m]:
                    out[(p["point"], m)] = abs(math.log(q[m] / pub[m]))
        return out

    base = terms(eff)
    out = {}
    for i, k in enumerate(FREE):
        e = dict(eff)
        e[k] = min(1.0, eff[k] * IDENTIFY_SHARE) if i < SHARES else eff[k] * IDENTIFY_COST
        moved = terms(e)
        changes = [(pt, m, (moved[(pt, m)] - v) / len(base)) for (pt, m), v in base.items()]
        changes.sort(key=lambda c: -abs(c[2]))
        out[k] = (sum(c[2] for c in changes), changes[:top])
    return out


def fit(points, start: dict, iters: int = 80, label: str = "fit") -> dict:
    """Nelder-Mead over the :data:`FREE` numbers (overheads in logs) on ``points``; progress on stderr."""
    x0 = np.array([start[k] for k in FREE[:SHARES]]
                  + [math.log(max(start[k], LOG_BOUNDS[k][0])) for k in FREE[SHARES:]])
    steps = np.array([0.15] * SHARES + [0.8] * (len(FREE) - SHARES))
    simplex = [x0] + [x0 + np.eye(len(x0))[i] * steps[i] for i in range(len(x0))]
    values = [loss(points, _unpack(x)) for x in simplex]
    for it in range(iters):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        best = _unpack(simplex[0])
        print(f"  {label} {it:3d}: loss {values[0]:.5f} at " + ", ".join(f"{k} {v:.4g}" for k, v in best.items()),
              file=sys.stderr, flush=True)
        centre = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        xr = centre + (centre - worst)
        fr = loss(points, _unpack(xr))
        if fr < values[0]:
            xe = centre + 2 * (centre - worst)
            fe = loss(points, _unpack(xe))
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
        else:
            xc = centre + 0.5 * (worst - centre)
            fc = loss(points, _unpack(xc))
            if fc < values[-1]:
                simplex[-1], values[-1] = xc, fc
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                values = [values[0]] + [loss(points, _unpack(x)) for x in simplex[1:]]
    return _unpack(simplex[int(np.argmin(values))])


def _fold(args) -> tuple[str, dict, list[dict]]:
    """One fold of :func:`cross_validate`: the source's points predicted by a fit on the others."""
    source, points, start, iters = args
    eff = fit([p for p in points if p["source"] != source], start, iters, label=f"without {source}")
    held = [p for p in points if p["source"] == source]
    return source, eff, errors(held, [predict(p, eff) for p in held])


def cross_validate(points, start: dict, iters: int, jobs: int = 1) -> None:
    """Leave one source out: each source's points predicted by a fit on every other source's.

    Prints each fold's fitted numbers and the medians per source and over all points, each
    point's errors coming from a fit that never saw its source.  Folds run in ``jobs``
    processes; the result does not depend on how many.
    """
    sources = sorted({p["source"] for p in points})
    if len(sources) < 2:
        raise SystemExit(f"--cross-validate needs points of two sources or more; these are of {sources}")
    folds = [(s, points, start, iters) for s in sources]
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(_fold, folds))
    else:
        results = [_fold(f) for f in folds]
    every = []
    for source, eff, errs in results:
        print(f"without {source}: " + ", ".join(f"{k} {v:.4g}" for k, v in eff.items()))
    print()
    for source, eff, errs in results:
        _medians(f"{source}, fitted on the other sources", errs)
        every += errs
    _medians("every source, each fitted on the others", every)


def _fmt(v: float) -> str:
    return f"{v:,.1f}" if v >= 10 else f"{v:.2f}"


def report(points, preds, errs) -> None:
    head = (f"{'point':44s} {'split':8s} {'TTFT ms pub/aisim':>24s} {'TPOT ms pub/aisim':>20s} "
            f"{'E2E ms pub/aisim':>26s} {'tok/s pub/aisim':>20s}")
    print(head)
    for p, q, e in zip(points, preds, errs):
        pub = published(p)
        cells = [f"{_fmt(pub[m])}/{_fmt(q[m])} {e[m]:4.0f}%" if m in e else "-" for m in METRICS]
        print(f"{p['point'][:44]:44s} {p['split']:8s} {cells[0]:>24s} {cells[1]:>20s} {cells[2]:>26s} {cells[3]:>20s}")
    print()
    for split in ("fit", "held-out"):
        _medians(f"{split}", [e for p, e in zip(points, errs) if p["split"] == split])
    for split, source in sorted({(p["split"], p["source"]) for p in points}):
        _medians(f"{split} {source}", [e for p, e in zip(points, errs) if p["source"] == source])
    print()
    for g in sorted({load_group(p).split(",")[0] for p in points}):
        _medians(g, [e for p, e in zip(points, errs) if load_group(p).split(",")[0] == g])
    for g in sorted({load_group(p) for p in points}):
        _medians(g, [e for p, e in zip(points, errs) if load_group(p) == g])
    print()
    false_saturation(points, preds)
    print()
    for g in sorted({group(p) for p in points}):
        _medians(g, [e for p, e in zip(points, errs) if group(p) == g])


def false_saturation(points, preds, factor: float = 3.0) -> list[str]:
    """Check that the replay queues no more than the server did: print and return each Poisson point whose
    published TTFT stays within ``factor`` x its series' lowest-rate TTFT while the predicted one does not.

    A series is a source's Poisson points of one model, GPU, tensor parallelism, lengths and cap, at two
    rates or more; its lowest rate is the reference.
    """
    series = {}
    for p, q in zip(points, preds):
        if p["workload"] == "rate":
            key = (p["source"], p["model"], p["gpu"], p["tp"], p["input_len"], p["output_len"], p["concurrency"])
            series.setdefault(key, []).append((p["rate_rps"], p, q))
    bad, checked = [], 0
    for rows in series.values():
        if len(rows) < 2:
            continue
        rows.sort(key=lambda r: r[0])
        _, p0, q0 = rows[0]
        for rate, p, q in rows[1:]:
            if rate > p0["rate_rps"] and p["ttft_ms"] <= factor * p0["ttft_ms"]:
                checked += 1
                if q["ttft"] > factor * q0["ttft"]:
                    bad.append(f"{p['point']} ({p['split']}): published TTFT {p['ttft_ms']:.1f} ms within {factor:g}x "
                               f"of {p0['ttft_ms']:.1f} ms at {p0['rate_rps']:g} req/s, predicted {q['ttft']:.1f} ms "
                               f"against {q0['ttft']:.1f} ms")
    print(f"false saturation: {len(bad)} of {checked} points whose published TTFT stays within {factor:g}x of the "
          f"lowest rate's" + "".join(f"\n  {b}" for b in bad))
    return bad


def load_group(point: dict) -> str:
    """The point's split, its load (``burst``; ``steady`` for a Poisson rate; ``capped`` under a concurrency
    cap), dense or MoE, and tensor parallelism."""
    from aisim.config.catalog import get_model

    kind = "MoE" if get_model(point["model"]).moe_layers else "dense"
    load = "burst" if point["workload"] == "burst" else "capped" if capped(point) else "steady"
    return f"{point['split']} {load}, {kind}, TP {point['tp']}"


def group(point: dict) -> str:
    """The point's group in the per-group medians: its split, source, dense or MoE, long or short prompts."""
    from aisim.config.catalog import get_model

    kind = "MoE" if get_model(point["model"]).moe_layers else "dense"
    prompts = "128-token burst" if point["workload"] == "burst" and point["input_len"] <= 256 else "longer prompts"
    return f"{point['split']} {point['source']}, {kind}, {prompts}"


def _medians(label: str, rows: list) -> None:
    """Print the median error per metric over the rows that have it (E2E: ``published_e2e``'s points)."""
    if not rows:
        return
    cells = []
    for m, name in zip(METRICS, ("TTFT", "TPOT", "E2E", "throughput")):
        have = [e[m] for e in rows if m in e]
        n = "" if len(have) == len(rows) else f" of {len(have)}"
        cells.append(f"{name} {float(np.median(have)):.1f}%{n}" if have else f"{name} -")
    print(f"median absolute error, {label} ({len(rows)} points): " + ", ".join(cells))


def main(argv=None) -> int:
    from aisim.config.keys import TIME_MODEL_KEYS, defaults

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="refit the efficiencies and overhead on the fitting sources")
    ap.add_argument("--iters", type=int, default=80, help="Nelder-Mead iterations of --fit")
    ap.add_argument("--only", help="points whose id contains this text")
    ap.add_argument("--fit-sources", help="comma-separated sources to fit on instead of the recorded split")
    ap.add_argument("--cross-validate", action="store_true",
                    help="leave one source out: predict each source's points by a fit on the others (--iters each)")
    ap.add_argument("--jobs", type=int, default=1, help="processes for --cross-validate's folds")
    ap.add_argument("--identify", action="store_true",
                    help="which fitting points set each free number (the loss change when it alone is raised)")
    args = ap.parse_args(argv)
    d = defaults(TIME_MODEL_KEYS)
    eff = {k: d[k] for k in FREE}
    start = dict(eff, frontend_per_request_s=max(eff["frontend_per_request_s"], 0.005),
                 frontend_per_token_s=max(eff["frontend_per_token_s"], 1e-6))
    sources = tuple(args.fit_sources.split(",")) if args.fit_sources else FIT_SOURCES
    points = [p for p in load_points(fit_sources=sources) if not args.only or args.only in p["point"]]
    if args.cross_validate:
        cross_validate(points, start, args.iters, args.jobs)
        return 0
    if args.identify:
        for k, (total, changes) in identify([p for p in points if p["split"] == "fit"], eff).items():
            print(f"{k}: loss {total:+.4f}; " + "; ".join(f"{pt} {m} {c:+.4f}" for pt, m, c in changes))
        return 0
    if args.fit:
        eff = fit([p for p in points if p["split"] == "fit"], start, args.iters)
        print("fitted: " + ", ".join(f"{k} {v:.4g}" for k, v in eff.items()))
    t0 = time.perf_counter()
    preds = [predict(p, eff) for p in points]
    errs = errors(points, preds)
    print("time model: " + ", ".join(f"{k} {v:.4g}" for k, v in eff.items())
          + f"; fitted on {', '.join(sources)}; {len(points)} points replayed in {time.perf_counter() - t0:.1f} s\n")
    report(points, preds, errs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
