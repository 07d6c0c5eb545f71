"""Throughput as ``vllm bench serve`` reports it: the one definition behind every throughput aisim gives.

``vllm/benchmarks/serve.py`` (``benchmark``, ``calculate_metrics``): ``benchmark_duration`` runs from
the start of sending (``benchmark_start_time``) to the last response; ``request_throughput`` is the
completed requests, ``output_throughput`` their output tokens (a failed request counts 0), each per
second of it.  A replay's start of sending is its first request's arrival (a trace says nothing
earlier), its last response the latest ``finish_s`` (the client's clock, the API server included);
a run rebuilt from a ``vllm bench serve`` result starts at the run's own start, before the first
send (:mod:`aisim.calibrate.predict`).  The replay summary (``duration_s``, ``throughput_req_s``,
``throughput_tok_s``, and through it the summaries table, capacity, sweeps, deployments and the
report), the bench-serve record (:mod:`aisim.bench_metrics`) and the calibration all read it here.
"""

from __future__ import annotations

import math

import numpy as np


class Span:
    """The start of sending and the last response of a run given in pieces."""

    def __init__(self):
        self.start = math.nan
        self.last = math.nan

    def add(self, arrival_s, finish_s) -> None:
        """Take one piece's arrival and finish times (NaN: not sent, or no response)."""
        for v, pick, name in ((arrival_s, min, "start"), (finish_s, max, "last")):
            v = np.asarray(v, dtype=np.float64)
            if v.size and not np.isnan(v).all():
                x = float(np.nanmin(v) if pick is min else np.nanmax(v))
                cur = getattr(self, name)
                setattr(self, name, x if math.isnan(cur) else pick(cur, x))

    def duration(self, completed: int, start: float | None = None) -> float:
        """:func:`benchmark_duration` of the pieces taken."""
        return benchmark_duration(self.last, self.start if start is None else start, completed)


def benchmark_duration(last_finish_s: float, start_s: float, completed: int) -> float:
    """Seconds from the start of sending to the last response; 0 when no request completed.

    Examples
    --------
    >>> benchmark_duration(12.5, 0.5, 10)
    12.0
    >>> benchmark_duration(float("nan"), 0.5, 0)
    0.0
    """
    if completed <= 0 or math.isnan(last_finish_s) or math.isnan(start_s):
        return 0.0
    return max(float(last_finish_s) - float(start_s), 0.0)


def per_second(count, duration_s: float):
    """``count`` per second of ``duration_s`` (a throughput); None without a duration.

    >>> per_second(30, 12.0)
    2.5
    >>> per_second(0, 0.0) is None
    True
    """
    return count / duration_s if duration_s > 0 else None
