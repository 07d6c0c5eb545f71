"""A replay's results as ``vllm bench serve`` reports them: its key names, its units (ms), its statistics.

vLLM computes them in ``calculate_metrics`` and ``benchmark`` (``vllm/benchmarks/serve.py``); this
module computes the same keys from a replay's requests table:

- ``completed``: finished requests; ``failed``: the rest (rejected prompts, unfinished requests).
- ``duration``: from the first request's arrival to the last response's finish (vLLM: the client's
  wall time of the benchmark, which also counts the gap before its first request), as
  :mod:`aisim.throughput` defines it for every throughput aisim gives.
- ``max_concurrent_requests``: the most completed requests in flight in one second, as vLLM buckets
  them (``vllm bench serve`` also gives ``max_output_tokens_per_s``, which needs every chunk's time:
  left out).
- ``request_throughput``, ``output_throughput``, ``total_token_throughput``: completed requests,
  their output tokens, their input plus output tokens, per second of ``duration``;
  ``request_goodput`` the completed requests within every ``--goodput`` limit per second (None
  without ``--goodput``).  A limit holds when the request's value is at most the limit (vLLM's
  ``s >= r``); a one-token request's TPOT counts as 0 there.
- ``{mean,median,std}_{metric}_ms`` and ``p{q}_{metric}_ms`` for each metric of
  ``--percentile-metrics`` (``ttft``, ``tpot``, ``itl``, ``e2el``) and each percentile of
  ``--metric-percentiles``, over the completed requests: numpy's mean, median, population standard
  deviation and linear percentiles, as vLLM takes them; a metric no request has gives 0, as vLLM's
  ``np.mean(values or 0)`` does.

ITL, how it is derived.  vLLM's ITL list holds, per request, the gap between each streamed chunk and
the one before; a chunk is one engine step's output for the request (one token, or 1 + the accepted
drafts with speculative decoding).  The replay records each request's first-token and finish times
but not the time of every chunk, so each request contributes ``output_tokens - 1 - spec_accepted``
gaps (its chunks after the first) of equal length, ``(e2e - ttft) / gaps``.  ``mean_itl_ms`` is
therefore exact (the sum of a request's gaps is its time from first token to finish); the median,
standard deviation and percentiles are those of each request's mean gap weighted by its gaps: they
do not see a single long gap inside a request (a step that also ran a long prefill chunk, a
preemption), so ITL tails are lower than a per-chunk record would give.  :data:`ITL_NOTE` says so
wherever the numbers are shown.
"""

from __future__ import annotations

import math

import numpy as np

from aisim.errors import ConfigError
from aisim.throughput import Span, per_second

# --percentile-metrics names vLLM accepts for a generative model, and the ones aisim computes.
VLLM_PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue")
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
# vLLM's defaults: "ttft,tpot,itl" for generative models, percentile "99".
DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl")
DEFAULT_METRIC_PERCENTILES = (99.0,)
# --goodput metric names (vLLM's check_goodput_args VALID_NAMES).
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
ITL_NOTE = ("ITL from each request's mean gap between chunks (the replay keeps first-token and finish times): "
            "the mean is exact, the tails are understated")


def parse_percentile_metrics(text: str | None) -> tuple:
    """``"ttft,tpot,itl"`` as a tuple of metric names (None: vLLM's default).

    Raises
    ------
    ConfigError
        A name vLLM does not know, or one aisim does not compute (named, with the reason).
    """
    if text is None:
        return DEFAULT_PERCENTILE_METRICS
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    if not names:
        raise ConfigError("--percentile-metrics: give one or more of " + ", ".join(PERCENTILE_METRICS))
    for n in names:
        if n not in VLLM_PERCENTILE_METRICS:
            raise ConfigError(f"--percentile-metrics: unknown metric '{n}'; known: {', '.join(PERCENTILE_METRICS)}")
        if n not in PERCENTILE_METRICS:
            raise ConfigError(f"--percentile-metrics: '{n}' is not computed (the replay's client sends a held-back "
                              f"request when a slot frees, and latencies count from then); known: "
                              f"{', '.join(PERCENTILE_METRICS)}")
    return tuple(dict.fromkeys(names))


def parse_metric_percentiles(text: str | None) -> tuple:
    """``"25,50,75"`` as floats in [0, 100] (None: vLLM's default, 99)."""
    if text is None:
        return DEFAULT_METRIC_PERCENTILES
    out = []
    for part in text.split(","):
        try:
            q = float(part)
        except ValueError:
            q = math.nan
        if not 0 <= q <= 100:
            raise ConfigError(f"--metric-percentiles: {part.strip()!r} is not a percentile in [0, 100]")
        out.append(q)
    return tuple(out)


def parse_goodput(pairs) -> dict:
    """``["ttft:500", "tpot:50"]`` as ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds), as vLLM parses it.

    Raises
    ------
    ConfigError
        A pair not ``KEY:VALUE``, an unknown metric or a negative value.
    """
    out = {}
    for pair in pairs or ():
        name, sep, value = str(pair).partition(":")
        try:
            v = float(value) if sep else math.nan
        except ValueError:
            v = math.nan
        if math.isnan(v):
            raise ConfigError(f"--goodput {pair!r}: give KEY:MILLISECONDS, e.g. ttft:500 tpot:50")
        if name not in GOODPUT_METRICS:
            raise ConfigError(f"--goodput {pair!r}: the metric is one of {', '.join(GOODPUT_METRICS)}")
        if v < 0:
            raise ConfigError(f"--goodput {pair!r}: the limit must not be negative")
        out[name] = v
    return out


def percentile_key(metric: str, q: float) -> str:
    """vLLM's key of percentile ``q`` of ``metric``: ``p99_ttft_ms``, ``p99.9_itl_ms``."""
    word = str(int(q)) if int(q) == q else str(q)
    return f"p{word}_{metric}_ms"


def _weighted_stats(values: np.ndarray, weights: np.ndarray, qs) -> tuple:
    """Mean, median, population std and ``qs`` percentiles of ``values`` each repeated ``weights`` times,
    equal to numpy's on the repeated array (without making it)."""
    order = np.argsort(values, kind="stable")
    x, w = values[order], weights[order]
    cum = np.cumsum(w)
    n = int(cum[-1])

    def at(j: int) -> float:  # the j-th (0-based) value of the repeated, sorted array
        return float(x[np.searchsorted(cum, j, side="right")])

    total = float((values * weights).sum())
    mean = total / n
    std = math.sqrt(float((weights * (values - mean) ** 2).sum()) / n)
    mid = n // 2
    median = at(mid) if n % 2 else (at(mid - 1) + at(mid)) / 2
    out = []
    for q in qs:
        h = (n - 1) * (q / 100)
        lo = math.floor(h)
        a, b, g = at(lo), at(min(lo + 1, n - 1)), h - lo
        d = b - a
        out.append(b - d * (1 - g) if g >= 0.5 else a + d * g)  # numpy's _lerp, as aisim.stats
    return mean, median, std, out


def _stats(values: np.ndarray, qs) -> tuple:
    """numpy's mean, median, std and percentiles of ``values``, as vLLM takes them (0 for none)."""
    from aisim.stats import percentiles

    if values.size == 0:
        return 0.0, 0.0, 0.0, [0.0] * len(qs)
    x = np.sort(values)
    mid = x.size // 2
    # np.median's value (the mean of the two middle values), without its import of numpy.ma
    median = float(x[mid]) if x.size % 2 else float(np.mean(x[mid - 1:mid + 1]))
    return float(np.mean(values)), median, float(np.std(values)), percentiles(values, qs)


def _finished(status) -> np.ndarray:
    """Which rows of the requests table's ``status`` column (dictionary-encoded labels) are finished."""
    parts = []
    for chunk in status.chunks:
        labels = chunk.dictionary.to_pylist()
        code = labels.index("finished") if "finished" in labels else -1
        parts.append(chunk.indices.to_numpy(zero_copy_only=False) == code)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


def _max_concurrent(start: np.ndarray, end: np.ndarray) -> int:
    """vLLM's ``max_concurrent_requests``: the most completed requests active in one whole second after
    the first start, a request counting in every second from its start's to its end's."""
    if start.size == 0:
        return 0
    t0 = float(start.min())
    first = (start - t0).astype(np.int64)  # int() of a non-negative offset: its second
    last = (end - t0).astype(np.int64)
    diff = np.zeros(int(last.max()) + 2, dtype=np.int64)
    np.add.at(diff, first, 1)
    np.add.at(diff, last + 1, -1)
    return int(np.cumsum(diff).max())


def bench_metrics(requests, percentile_metrics=DEFAULT_PERCENTILE_METRICS,
                  metric_percentiles=DEFAULT_METRIC_PERCENTILES, goodput: dict | None = None) -> dict:
    """``vllm bench serve``'s result keys of a replay (see the module docstring).

    Parameters
    ----------
    requests : pyarrow.Table
        The replay's requests table (``ttft_s``, ``tpot_s``, ``e2e_s``, ``prompt_tokens``,
        ``output_tokens``, ``spec_accepted``, ``status``).
    percentile_metrics : sequence of str
    metric_percentiles : sequence of float
    goodput : dict, optional
        ``metric -> milliseconds`` (:func:`parse_goodput`).

    Returns
    -------
    dict
        Keys in vLLM's order.
    """
    def col(name, dtype=np.float64):
        return requests.column(name).to_numpy(zero_copy_only=False).astype(dtype)

    done = _finished(requests.column("status"))
    ttft, e2e, tpot = col("ttft_s")[done], col("e2e_s")[done], col("tpot_s")[done]
    out_tok = col("output_tokens", np.int64)[done]
    accepted = col("spec_accepted", np.int64)[done]
    prompt = col("prompt_tokens", np.int64)[done]
    completed = int(done.sum())
    total_in, total_out = int(prompt.sum()), int(out_tok.sum())
    finish, arrival = col("finish_s"), col("arrival_s")
    span = Span()
    span.add(arrival, finish)
    dur = span.duration(completed)

    def per_s(x):
        return per_second(x, dur)

    good = None
    if goodput:
        ok = np.ones(completed, dtype=bool)
        limits = {"ttft": ttft, "tpot": np.where(out_tok > 1, tpot, 0.0), "e2el": e2e}
        for name, ms in goodput.items():
            ok &= limits[name] <= ms / 1000  # vLLM: s >= r, the limit in seconds
        good = int(ok.sum())
    result = {
        "duration": dur,
        "completed": completed,
        "failed": requests.num_rows - completed,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": per_s(completed),
        "request_goodput": per_s(good) if good is not None else None,
        "output_throughput": per_s(total_out),
        "total_token_throughput": per_s(total_in + total_out),
        "max_concurrent_requests": _max_concurrent(arrival[done], finish[done]),
    }
    multi = out_tok > 1
    gaps = np.maximum(out_tok - 1 - accepted, 1)[multi]
    itl = ((e2e - ttft)[multi] / gaps)
    series = {"ttft": (ttft, None), "tpot": (tpot[multi], None), "itl": (itl, gaps), "e2el": (e2e, None)}
    for name in percentile_metrics:
        values, weights = series[name]
        if weights is not None and values.size:
            mean, median, std, ps = _weighted_stats(values, weights, metric_percentiles)
        else:
            mean, median, std, ps = _stats(values, metric_percentiles)
        result[f"mean_{name}_ms"] = mean * 1000
        result[f"median_{name}_ms"] = median * 1000
        result[f"std_{name}_ms"] = std * 1000
        for q, v in zip(metric_percentiles, ps):
            result[percentile_key(name, q)] = v * 1000
    return result
