"""Reading the result files of ``vllm bench serve``.

``vllm bench serve --save-result`` writes one JSON object per run (``vllm/benchmarks/serve.py``,
``main``: the traffic keys ``num_prompts``, ``request_rate`` (a number, or ``"inf"``),
``burstiness``, ``max_concurrency``, then ``benchmark``'s result: ``duration``, ``completed``,
``failed``, ``total_input_tokens``, ``total_output_tokens``, ``request_throughput``,
``output_throughput``, and ``mean_/median_/p99_`` ``ttft_ms``, ``tpot_ms``, ``itl_ms``,
``e2el_ms`` for the metrics selected); ``--append-result`` appends further runs, one a line;
``--save-detailed`` keeps the per-request ``input_lens``, ``output_lens``, ``ttfts`` and
``itls``.  The dataset's settings are not written, except as ``--metadata KEY=VALUE`` pairs:
``random_input_len``, ``random_output_len``, ``random_range_ratio`` and ``random_prefix_len``
are read from there when present (strings, as ``--metadata`` writes them, or numbers).

:func:`read_bench_serve` reads every run of a file strictly: a missing or mistyped key is a
:class:`~aisim.errors.MeasurementError` naming the file, the run and the key.  An AIPerf summary
export (``profile_export_aiperf.json``) is read too (:mod:`aisim.calibrate.aiperf`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

from aisim.errors import MeasurementError

# What each fitted metric is in a result file: vllm bench serve's mean of each latency (ms) and
# its output throughput (tokens/s); the names are aisim.config.calibration.METRICS.
METRIC_KEYS = {"ttft": "mean_ttft_ms", "tpot": "mean_tpot_ms", "itl": "mean_itl_ms", "e2el": "mean_e2el_ms",
               "throughput": "output_throughput"}
# Further statistics kept for the measured_runs table when the file has them.
EXTRA_KEYS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms",
              "median_e2el_ms", "p99_e2el_ms", "request_throughput")
_REQUIRED = ("num_prompts", "request_rate", "burstiness", "max_concurrency", "completed",
             "total_input_tokens", "total_output_tokens", "duration", "output_throughput")
_METADATA_LENS = ("random_input_len", "random_output_len", "random_prefix_len")


@dataclass(frozen=True)
class MeasuredRun:
    """One ``vllm bench serve`` run as a result file records it.

    Attributes
    ----------
    source : str
        The file.
    index : int
        The run's place in the file (0 for a file of one run).
    model_id : str or None
        The served model as the file names it.
    num_prompts, completed : int
        Requests sent and completed (every one: a run with failed requests is refused).
    request_rate : float
        Requests per second (``math.inf``: every request at once).
    burstiness : float
        Shape of the gamma distribution of the gaps between sends (1: Poisson; ``math.inf``: even).
    max_concurrency : int or None
        The client's cap on requests in flight.
    total_input_tokens, total_output_tokens : int
    duration_s : float
        From the benchmark's start to the last response.
    metrics : dict
        :data:`METRIC_KEYS` name -> measured value (ms, or tokens/s), those the file has.
    extra : dict
        :data:`EXTRA_KEYS` -> value, those the file has.
    input_lens, output_lens : tuple of int or None
        Per request (``--save-detailed``).
    random_input_len, random_output_len, random_prefix_len : int or None
    random_range_ratio : float
        The random dataset's settings when the file's metadata holds them.
    """

    source: str
    index: int
    model_id: str | None
    num_prompts: int
    completed: int
    request_rate: float
    burstiness: float
    max_concurrency: int | None
    total_input_tokens: int
    total_output_tokens: int
    duration_s: float
    metrics: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    input_lens: tuple | None = None
    output_lens: tuple | None = None
    random_input_len: int | None = None
    random_output_len: int | None = None
    random_prefix_len: int | None = None
    random_range_ratio: float = 0.0

    @property
    def label(self) -> str:
        """``FILE`` or ``FILE#K`` (the K-th run of a file of several, from 1)."""
        return os.path.basename(self.source) + (f"#{self.index + 1}" if self.index else "")


def read_bench_serve(path: str | os.PathLike) -> list[MeasuredRun]:
    """Every run of a ``vllm bench serve`` result file.

    Parameters
    ----------
    path : path-like
        A ``--save-result`` JSON file: one object, or several (``--append-result``).

    Returns
    -------
    list of MeasuredRun

    Raises
    ------
    MeasurementError
        A file that cannot be read, is not JSON objects, or lacks or mistypes a key; the message
        names the file, the run (when the file has several) and the key.
    """
    from aisim.textin import STRICT_JSON, DuplicateKey, decode_utf8, duplicate_message, read_bytes

    path = os.fspath(path)
    data = read_bytes(path, MeasurementError)
    text = decode_utf8(data, path, MeasurementError)
    objs, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            break
        try:
            obj, i = STRICT_JSON.raw_decode(text, i)
        except DuplicateKey as exc:
            raise MeasurementError(f"{path}: {duplicate_message(exc.key)}") from None
        except json.JSONDecodeError as exc:
            raise MeasurementError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise MeasurementError(f"{path}: run {len(objs) + 1} is not a JSON object (a vllm bench serve result)")
        objs.append(obj)
    if not objs:
        raise MeasurementError(f"{path}: no runs (an empty file)")
    from aisim.calibrate.aiperf import aiperf_run, is_aiperf

    several = len(objs) > 1
    return [aiperf_run(o, path, k if several else 0, path + (f", run {k + 1}" if several else ""))
            if is_aiperf(o) else _run(o, path, k, several) for k, o in enumerate(objs)]


def _run(o: dict, path: str, k: int, several: bool) -> MeasuredRun:
    at = f"{path}" + (f", run {k + 1}" if several else "")

    def bad(key, want):
        return MeasurementError(f"{at}: '{key}' must be {want}, got {o[key]!r}")

    for key in _REQUIRED:
        if key not in o:
            raise MeasurementError(f"{at}: missing key '{key}' (is it a vllm bench serve --save-result file?)")
    ints = {}
    for key in ("num_prompts", "completed", "total_input_tokens", "total_output_tokens"):
        v = o[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if key != "total_input_tokens" else 0):
            raise bad(key, "a positive integer")
        ints[key] = v
    failed = o.get("failed", 0)
    if ints["completed"] != ints["num_prompts"] or failed:
        raise MeasurementError(f"{at}: {ints['completed']} of {ints['num_prompts']} requests completed "
                               f"('completed', 'failed' {failed}); aisim cannot rebuild what a failed request "
                               "did, so only runs where every request completed are calibrated on")
    rate = o["request_rate"]
    if rate == "inf":
        rate = math.inf
    elif isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise bad("request_rate", 'a positive number or "inf"')
    burst = o["burstiness"]
    if isinstance(burst, bool) or not isinstance(burst, (int, float)) or not burst > 0:
        raise bad("burstiness", "a positive number")
    cap = o["max_concurrency"]
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise bad("max_concurrency", "a positive integer or null")
    if o.get("ramp_up_strategy") is not None:
        raise MeasurementError(f"{at}: 'ramp_up_strategy' is set; a ramped request rate is not rebuilt, only a "
                               "fixed one")
    nums = {}
    for key in ("duration",) + tuple(METRIC_KEYS.values()) + EXTRA_KEYS:
        if key in o and o[key] is not None:
            v = o[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise bad(key, "a finite non-negative number")
            nums[key] = float(v)
    if not nums.get("duration"):
        raise bad("duration", "a positive number")
    metrics = {m: nums[k] for m, k in METRIC_KEYS.items() if nums.get(k)}
    lens = {}
    for key in ("input_lens", "output_lens"):
        v = o.get(key)
        if v is None:
            continue
        if (not isinstance(v, list) or len(v) != ints["num_prompts"]
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v)):
            raise MeasurementError(f"{at}: '{key}' must be a list of {ints['num_prompts']} positive integers "
                                   "(one per request)")
        lens[key] = tuple(v)
    meta = {}
    for key in _METADATA_LENS:
        if o.get(key) is not None:
            meta[key] = _meta_number(o, key, at, int)
    ratio = _meta_number(o, "random_range_ratio", at, float) if o.get("random_range_ratio") is not None else 0.0
    if not 0.0 <= ratio < 1.0:
        raise MeasurementError(f"{at}: 'random_range_ratio' must be in [0, 1), got {ratio}")
    model = o.get("model_id")
    return MeasuredRun(
        source=path, index=k if several else 0, model_id=model if isinstance(model, str) else None,
        num_prompts=ints["num_prompts"], completed=ints["completed"], request_rate=float(rate),
        burstiness=float(burst), max_concurrency=cap, total_input_tokens=ints["total_input_tokens"],
        total_output_tokens=ints["total_output_tokens"], duration_s=nums["duration"], metrics=metrics,
        extra={k: nums[k] for k in EXTRA_KEYS if k in nums}, input_lens=lens.get("input_lens"),
        output_lens=lens.get("output_lens"), random_range_ratio=ratio, **meta)


def _meta_number(o: dict, key: str, at: str, kind):
    v = o[key]
    try:
        if isinstance(v, bool):
            raise ValueError
        x = kind(v) if isinstance(v, str) else v
        if kind is int and (not isinstance(x, int) or x < (0 if key == "random_prefix_len" else 1)):
            raise ValueError
        if kind is float and (not isinstance(x, (int, float)) or not math.isfinite(x)):
            raise ValueError
    except ValueError:
        want = "a non-negative integer" if key == "random_prefix_len" else (
            "a positive integer" if kind is int else "a number")
        raise MeasurementError(f"{at}: '{key}' must be {want}, got {v!r}") from None
    return float(x) if kind is float else x
