"""Dynamo's mocker (``ai-dynamo-runtime``), timed on the workloads of replay_speed.py.

The mocker replays a trace offline in Rust (``dynamo._core.run_mocker_trace_replay`` and
``run_mocker_synthetic_trace_replay``).  It is timed in this interpreter when ``dynamo`` imports
here, else in the interpreter given by ``--mocker-python`` (a separate virtual environment with
``pip install ai-dynamo-runtime``), else not at all.  Its engine is aisim's: the same block size,
batch limits and pool, one block fewer (it has no null block), a fixed 10 ms decode step, and
vLLM v1's preemption of the newest running request.
"""

from __future__ import annotations

import json
import subprocess
import sys

# The mocker's engine for a job's engine keys: chunked prefill and prefix caching on, constant 10 ms steps.
_ENGINE = r"""
def engine_args(job):
    return {"engine": dict(job["engine"], enable_prefix_caching=True, enable_chunked_prefill=True,
                           preemption_mode="lifo",
                           timing_model={"type": "fixed", "prefill_ms": 0.0, "decode_ms": 10.0})}


def run(job):
    from dynamo._core import run_mocker_synthetic_trace_replay, run_mocker_trace_replay

    if job["kind"] == "synthetic":
        return run_mocker_synthetic_trace_replay(job["prompt"], job["output"], job["requests"],
                                                 extra_engine_args=engine_args(job), arrival_interval_ms=0)
    return run_mocker_trace_replay([job["path"]], extra_engine_args=engine_args(job), trace_format="mooncake",
                                   trace_block_size=job["trace_block_size"], replay_mode="offline")
"""

# Runs in the mocker's interpreter: one JSON line of every run's wall time (seconds) and the requests
# completed, per workload.
_SCRIPT = _ENGINE + r"""
import json, sys, time
jobs = json.loads(sys.argv[1])
out = {}
for name, job in jobs.items():
    times, done = [], None
    for _ in range(job["repeat"]):
        t0 = time.perf_counter()
        r = run(job)
        times.append(time.perf_counter() - t0)
        done = r.summary["completed_requests"] if isinstance(r.summary, dict) else None
    out[name] = {"times_s": times, "completed": done}
print(json.dumps(out))
"""

# One replay as a whole process (start-up included), printing the mocker's summary as aisim prints its own.
PROCESS_SCRIPT = _ENGINE + r"""
import json, sys
r = run(json.loads(sys.argv[1]))
print(json.dumps(r.summary, indent=1, default=str))
"""


def mocker_engine(eng):
    """The mocker's engine arguments for an aisim EngineConfig (one block fewer: no null block)."""
    return {"block_size": eng.block_size, "num_gpu_blocks": eng.num_gpu_blocks - 1,
            "max_num_seqs": eng.max_num_seqs, "max_num_batched_tokens": eng.max_num_batched_tokens,
            "max_model_len": eng.max_model_len}


def mocker_python(python=None):
    """The interpreter that runs the mocker (this one when ``dynamo`` imports here), or None."""
    try:
        import dynamo._core  # noqa: F401
    except ImportError:
        return python
    return sys.executable


def time_mocker(jobs, python=None):
    """Every run's wall seconds and the requests completed, per job name; None when no mocker is available.

    ``jobs``: name -> dict(kind="synthetic", prompt, output, requests | kind="mooncake", path,
    trace_block_size; engine=mocker_engine(...), repeat).  Runs in this interpreter when
    ``dynamo`` imports, else in ``python``; errors other than a missing mocker propagate.
    """
    python = mocker_python(python)
    if python is None:
        return None
    proc = subprocess.run([python, "-c", _SCRIPT, json.dumps(jobs)], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])
