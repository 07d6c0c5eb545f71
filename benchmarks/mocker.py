"""Dynamo's mocker (``ai-dynamo-runtime``), timed on the workloads of replay_speed.py.

The mocker replays a trace offline in Rust (``dynamo._core.run_mocker_trace_replay`` and
``run_mocker_synthetic_trace_replay``).  It is timed in this interpreter when ``dynamo`` imports
here, else in the interpreter given by ``--mocker-python`` (a separate virtual environment with
``pip install ai-dynamo-runtime``), else not at all.  Its engine is aisim's: the same block size,
batch limits and pool, one block fewer (it has no null block), a fixed 10 ms decode step.
"""

from __future__ import annotations

import json
import subprocess

# Runs in the mocker's interpreter: one JSON line of best wall times (seconds) per workload.
_SCRIPT = r"""
import json, sys, time
from dynamo._core import run_mocker_synthetic_trace_replay, run_mocker_trace_replay
jobs = json.loads(sys.argv[1])
out = {}
for name, job in jobs.items():
    engine = {"engine": dict(job["engine"], enable_prefix_caching=True, enable_chunked_prefill=True,
                             preemption_mode="lifo",
                             timing_model={"type": "fixed", "prefill_ms": 0.0, "decode_ms": 10.0})}
    best = None
    for _ in range(job["repeat"]):
        t0 = time.perf_counter()
        if job["kind"] == "synthetic":
            run_mocker_synthetic_trace_replay(job["prompt"], job["output"], job["requests"],
                                              extra_engine_args=engine, arrival_interval_ms=0)
        else:
            run_mocker_trace_replay([job["path"]], extra_engine_args=engine, trace_format="mooncake",
                                    trace_block_size=job["trace_block_size"], replay_mode="offline")
        t = time.perf_counter() - t0
        best = t if best is None else min(best, t)
    out[name] = best
print(json.dumps(out))
"""


def mocker_engine(eng):
    """The mocker's engine arguments for an aisim EngineConfig (one block fewer: no null block)."""
    return {"block_size": eng.block_size, "num_gpu_blocks": eng.num_gpu_blocks - 1,
            "max_num_seqs": eng.max_num_seqs, "max_num_batched_tokens": eng.max_num_batched_tokens,
            "max_model_len": eng.max_model_len}


def time_mocker(jobs, python=None):
    """Best wall seconds per job name, or None when no mocker is available.

    ``jobs``: name -> dict(kind="synthetic", prompt, output, requests | kind="mooncake", path,
    trace_block_size; engine=mocker_engine(...), repeat).  Runs in this interpreter when
    ``dynamo`` imports, else in ``python``; errors other than a missing mocker propagate.
    """
    try:
        import dynamo._core  # noqa: F401
    except ImportError:
        if python is None:
            return None
        cmd = [python, "-c", _SCRIPT, json.dumps(jobs)]
    else:
        import sys
        cmd = [sys.executable, "-c", _SCRIPT, json.dumps(jobs)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])
