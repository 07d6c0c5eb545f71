"""Reading AIPerf's summary export, ``profile_export_aiperf.json``, as measured runs.

AIPerf (``aiperf profile``) writes one JSON object per run: a stats block per metric
(``unit``, ``avg``, ``p50``, ``p99``, ...; ``JsonMetricResult`` in
``src/aiperf/common/models/export_models.py``) and the run's settings under ``input_config``,
the load generator's under ``input_config.loadgen`` (``request_rate``, ``concurrency``,
``arrival_pattern``: ``constant``, ``poisson`` or ``gamma``, ``arrival_smoothness``: the gamma
shape, vLLM's burstiness).  What the fit compares: ``time_to_first_token``, ``inter_token_latency``
(per request ``(latency - TTFT) / (output tokens - 1)``, averaged: vLLM's TPOT),
``request_latency`` (E2E) and ``output_token_throughput``; the workload comes from
``request_count``, ``total_isl``, ``total_osl`` and ``benchmark_duration``.  AIPerf reports no
pooled inter-token latency (vLLM's ITL), so its runs have none.
"""

from __future__ import annotations

import math

from aisim.errors import MeasurementError

# Milliseconds per unit of a latency's stats block.
_MS = {"ms": 1.0, "s": 1e3, "sec": 1e3, "us": 1e-3, "ns": 1e-6}
# The fitted metric (aisim.config.calibration.METRICS) of each AIPerf metric, and the bench-serve key
# of its median and 99th percentile (aisim.calibrate.benchserve.EXTRA_KEYS).
_LATENCIES = {"time_to_first_token": ("ttft", "ttft"), "inter_token_latency": ("tpot", "tpot"),
              "request_latency": ("e2el", "e2el")}
# The burstiness of each arrival pattern (gamma: arrival_smoothness, 1 without one).
_PATTERNS = {"constant": math.inf, "poisson": 1.0, "gamma": None}


def is_aiperf(obj: dict) -> bool:
    """Whether a JSON object is an AIPerf summary export (its ``input_config`` and stats blocks)."""
    return isinstance(obj.get("input_config"), dict) and isinstance(obj.get("request_count"), dict)


def aiperf_run(obj: dict, path: str, index: int, at: str):
    """One AIPerf export as a :class:`~aisim.calibrate.benchserve.MeasuredRun`.

    Raises
    ------
    MeasurementError
        A missing or mistyped key, named with the file (``at``).
    """
    from aisim.calibrate.benchserve import MeasuredRun

    def stat(key, field="avg", required=True):
        block = obj.get(key)
        if block is None and not required:
            return None
        if not isinstance(block, dict) or not _number(block.get(field)):
            raise MeasurementError(f"{at}: missing key '{key}.{field}' (a number)")
        return float(block[field])

    def latency_ms(key, field):
        v = stat(key, field, required=False)
        if v is None:
            return None
        unit = obj[key].get("unit")
        if unit not in _MS:
            raise MeasurementError(f"{at}: '{key}.unit' must be one of {', '.join(_MS)}, got {unit!r}")
        return v * _MS[unit]

    load = obj["input_config"].get("loadgen") or {}
    if not isinstance(load, dict):
        raise MeasurementError(f"{at}: 'input_config.loadgen' must be a mapping")
    stat("benchmark_duration")  # required
    n = stat("request_count")
    errors = stat("error_request_count", required=False) or 0
    if n < 1 or n != int(n) or errors:
        raise MeasurementError(f"{at}: {int(n)} requests completed and {int(errors)} failed ('request_count', "
                               "'error_request_count'); only runs where every request completed are calibrated on")
    rate = load.get("request_rate")
    if rate is not None and (not _number(rate) or not rate > 0):
        raise MeasurementError(f"{at}: 'input_config.loadgen.request_rate' must be a positive number, got {rate!r}")
    cap = load.get("concurrency")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise MeasurementError(f"{at}: 'input_config.loadgen.concurrency' must be a positive integer (one run, not a "
                               f"sweep), got {cap!r}")
    pattern = load.get("arrival_pattern", "poisson")
    if pattern not in _PATTERNS:
        raise MeasurementError(f"{at}: 'input_config.loadgen.arrival_pattern' must be one of "
                               f"{', '.join(_PATTERNS)}, got {pattern!r}")
    burst = _PATTERNS[pattern]
    if burst is None:
        smooth = load.get("arrival_smoothness")
        if smooth is not None and (not _number(smooth) or not smooth > 0):
            raise MeasurementError(f"{at}: 'input_config.loadgen.arrival_smoothness' must be a positive number, "
                                   f"got {smooth!r}")
        burst = float(smooth) if smooth is not None else 1.0
    metrics = {name: latency_ms(key, "avg") for key, (name, _) in _LATENCIES.items()}
    metrics["throughput"] = stat("output_token_throughput", required=False)
    extra = {}
    for key, (_, short) in _LATENCIES.items():
        for field, word in (("p50", "median"), ("p99", "p99")):
            v = latency_ms(key, field) if isinstance(obj.get(key), dict) and field in obj[key] else None
            if v is not None:
                extra[f"{word}_{'e2el' if short == 'e2el' else short}_ms"] = v
    if stat("request_throughput", required=False) is not None:
        extra["request_throughput"] = stat("request_throughput")
    models = obj["input_config"].get("endpoint", {}).get("model_names") if isinstance(
        obj["input_config"].get("endpoint"), dict) else None
    return MeasuredRun(
        source=path, index=index, model_id=models[0] if isinstance(models, list) and models else None,
        num_prompts=int(n), completed=int(n), request_rate=float(rate) if rate is not None else math.inf,
        burstiness=burst, max_concurrency=cap, total_input_tokens=int(stat("total_isl")),
        total_output_tokens=int(stat("total_osl")), duration_s=latency_ms("benchmark_duration", "avg") / 1e3,
        metrics={k: v for k, v in metrics.items() if v}, extra=extra)


def _number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
