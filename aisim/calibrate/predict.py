"""A run's statistics as ``vllm bench serve`` takes them, from a replay of its rebuilt trace.

``vllm/benchmarks/serve.py`` ``calculate_metrics``: TTFT and E2E latency of each request count
from the moment its request function starts, the client's send (under ``--max-concurrency``, when
the cap lets it go); TPOT is ``(latency - ttft) / (output_len - 1)`` over the requests of more than
one output token; ITL pools every gap between two tokens of every request, so its mean is the
requests' summed ``latency - ttft`` over their summed ``output_len - 1``; output throughput is the
run's output tokens over the benchmark's duration, from its start (before the first send) to the
last response.
"""

from __future__ import annotations

import numpy as np


def replay_metrics(trace, kw: dict, sends: np.ndarray, engine) -> dict:
    """The :data:`aisim.config.calibration.METRICS` of one replay (ms, and tokens/s).

    Parameters
    ----------
    trace, kw, sends
        :func:`aisim.calibrate.workload.run_trace`.
    engine : EngineConfig
    """
    from aisim.replay import replay

    rq = replay(trace, engine, **kw).requests
    col = {c: rq.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
           for c in ("arrival_s", "first_token_s", "finish_s", "output_tokens")}
    # Rows come in trace order (request ids r0, r1, ...).  Under a cap a request is sent when the
    # cap releases it, which the replay reports as its arrival; otherwise at its trace time.
    send = np.maximum(sends, col["arrival_s"]) if kw.get("max_concurrency") else sends
    ttft = col["first_token_s"] - send
    e2el = col["finish_s"] - send
    out = col["output_tokens"]
    many = out > 1
    after, gaps = e2el[many] - ttft[many], out[many] - 1
    return {"ttft": 1e3 * float(ttft.mean()), "tpot": 1e3 * float((after / gaps).mean()) if many.any() else 0.0,
            "itl": 1e3 * float(after.sum() / gaps.sum()) if many.any() else 0.0,
            "e2el": 1e3 * float(e2el.mean()), "throughput": _throughput(out, col["finish_s"])}


def _throughput(out: np.ndarray, finish: np.ndarray) -> float:
    """Output throughput (aisim.throughput): the run's sending starts at 0, before its first send."""
    from aisim.throughput import Span, per_second

    done = ~np.isnan(finish)
    span = Span()
    span.add([0.0], finish)
    return float(per_second(out[done].sum(), span.duration(int(done.sum()))) or 0.0)
