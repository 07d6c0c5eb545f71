"""``--request-rate R --burstiness B``: a trace re-timed as ``vllm bench serve`` sends its requests.

vLLM's ``get_request`` (``vllm/benchmarks/serve.py``): the requests keep their order; with rate
``inf`` every one is sent at 0 s; otherwise request i is sent after the sum of i + 1 gaps drawn from a
gamma distribution of shape ``B`` and scale ``1 / (R * B)`` (``B = 1``: exponential gaps, a Poisson
process; ``B = inf``: every gap ``1 / R``), and the sums are scaled so that the last request is sent
at ``n / R`` seconds (vLLM closes the 1-2 % gap a sum of random gaps leaves, so runs of different
seeds offer the same rate).  The gaps come from ``numpy.random.default_rng(seed)`` (vLLM draws from
numpy's global generator after its dataset sampling, so the draws themselves differ).

aisim's own ``--poisson-rate`` (:mod:`aisim.traces.load`) differs on purpose: its first request is
sent at 0 s and its sums are not scaled, so that a trace re-timed in pieces gets the same arrivals.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from aisim.errors import ConfigError


def check_request_rate(rate, burstiness) -> None:
    """Refuse a rate or burstiness vLLM refuses (both must be positive; either may be ``inf``)."""
    for name, v in (("--request-rate", rate), ("--burstiness", burstiness)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or not v > 0:
            raise ConfigError(f"{name} must be a positive number (or inf), got {v!r}")


def send_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """When each of ``n`` requests is sent, in seconds (see the module docstring)."""
    check_request_rate(rate, burstiness)
    if n == 0 or math.isinf(rate):
        return np.zeros(n)
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / rate)
    else:
        gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    delay = np.cumsum(gaps)
    if delay[-1] != 0:
        delay = delay * ((n / rate) / delay[-1])
    return delay


def retime_request_rate(trace: pa.Table, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> pa.Table:
    """``trace`` with its arrivals replaced by :func:`send_times` (clocked in seconds)."""
    arrival = send_times(trace.num_rows, request_rate, burstiness, seed)
    i = trace.schema.get_field_index("arrival_s")
    out = trace.set_column(i, trace.schema.field(i), pa.array(arrival, pa.float64()))
    j = out.schema.get_field_index("arrival_step")
    out = out.set_column(j, out.schema.field(j), pa.nulls(out.num_rows, out.schema.field(j).type))
    meta = dict(out.schema.metadata or {})
    meta[b"clock"] = b"time"
    return out.replace_schema_metadata(meta)
