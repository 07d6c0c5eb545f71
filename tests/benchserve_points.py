"""Points aisim generates itself, shaped as ``vllm bench serve`` result files: the calibration tests' inputs.

Every file under ``tests/data/benchserve/`` was written by :func:`main` (``python
tests/benchserve_points.py``): a workload of :data:`WORKLOADS` replayed on :func:`truth_engine`
(qwen3-8b on one H100, the time model's fitted constants set to :func:`truth_values`), its statistics
taken as ``vllm bench serve`` takes them.  They are simulations, labelled as such in each file's
``label``, never measurements.
"""

from __future__ import annotations

import json
import os

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "benchserve")


def truth_values() -> dict:
    """The constants the files were generated with: every fitted constant of the time model that a
    default calibration of :func:`truth_engine` fits (those above zero it acts on), moved from its
    default alternately to 0.8 and 0.9 of it (a fit from the defaults moves all of them)."""
    from aisim.calibrate.fit import default_keys
    from aisim.config.keys import TIME_MODEL_KEYS, defaults

    d = defaults(TIME_MODEL_KEYS)
    keys = list(default_keys(truth_engine()))
    return {k: float(f"{d[k] * (0.8 if i % 2 == 0 else 0.9):.6g}") for i, k in enumerate(keys)}


# file stem -> (num_prompts, request_rate, burstiness, max_concurrency, input_len, output_len)
WORKLOADS = {
    "cap1-8000x2": (3, "inf", 1.0, 1, 8000, 2),          # one long prefill a step: matmuls and attention
    "cap1-1000x2": (3, "inf", 1.0, 1, 1000, 2),          # a short one: matmuls, little attention
    "cap1-128x200": (2, "inf", 1.0, 1, 128, 200),        # one decode a step: the weights' bytes
    "cap64-256x256": (128, "inf", 1.0, 64, 256, 256),    # 64 decodes a step: per-request overhead
    "cap4-7000x64": (8, "inf", 1.0, 4, 7000, 64),        # decodes over long contexts: the KV cache's bytes
    "burst-2048x64": (32, "inf", 1.0, None, 2048, 64),
    "poisson-4rps-512x128": (60, 4.0, 1.0, None, 512, 128),
    "bursty-8rps-1024x96": (60, 8.0, 0.5, None, 1024, 96),
}


def truth_engine(values=None):
    """qwen3-8b on one H100 as ``aisim plan`` gives it, synchronous, with the fitted constants ``values``
    (default: none set)."""
    from aisim.calibrate.fit import with_constants
    from aisim.plan import plan_from_model

    cfg, _ = plan_from_model("qwen3-8b", gpu="H100", tp=1, max_model_len=8192)
    # Synchronous, so that the CPU's costs add to every step: under async scheduling they hide under
    # the GPU's wherever the GPU takes longer, and these few workloads could not tell them apart.
    cfg = cfg.replace(async_scheduling=False)
    return with_constants(cfg, values) if values else cfg


def result(stem: str, engine, seed: int = 0) -> dict:
    """The ``vllm bench serve`` result of workload ``stem`` replayed on ``engine``."""
    from aisim.calibrate.benchserve import METRIC_KEYS, MeasuredRun
    from aisim.calibrate.predict import replay_metrics
    from aisim.calibrate.workload import run_trace

    n, rate, burst, cap, il, ol = WORKLOADS[stem]
    run = MeasuredRun(source=stem, index=0, model_id="qwen3-8b", num_prompts=n, completed=n,
                      request_rate=float(rate), burstiness=burst, max_concurrency=cap, total_input_tokens=n * il,
                      total_output_tokens=n * ol, duration_s=1.0)
    m = replay_metrics(*run_trace(run, seed), engine)
    duration = n * ol / m["throughput"]
    out = {"date": "", "backend": "vllm", "label": "simulated by aisim (tests/benchserve_points.py), not measured",
           "model_id": "qwen3-8b", "num_prompts": n, "request_rate": rate, "burstiness": burst,
           "max_concurrency": cap, "duration": duration, "completed": n, "failed": 0, "total_input_tokens": n * il,
           "total_output_tokens": n * ol, "request_throughput": n / duration}
    out.update({key: m[name] for name, key in METRIC_KEYS.items()})
    return out


def main() -> None:
    eng = truth_engine(truth_values())
    for stem in WORKLOADS:
        with open(os.path.join(HERE, stem + ".json"), "w", encoding="utf-8") as fh:
            json.dump(result(stem, eng), fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    main()


def aiperf_result(stem: str, engine, seed: int = 0) -> dict:
    """Workload ``stem`` replayed on ``engine``, shaped as AIPerf's ``profile_export_aiperf.json``.

    AIPerf's ``inter_token_latency`` is a request's ``(latency - TTFT) / (output tokens - 1)``
    averaged: vLLM's TPOT.  A workload at rate inf with a cap is AIPerf's ``--concurrency`` alone.
    """
    b = result(stem, engine, seed)
    n, rate, burst, cap, il, ol = WORKLOADS[stem]
    pattern = {1.0: "poisson"}.get(burst, "gamma")
    load = {"concurrency": cap, "arrival_pattern": pattern, "request_count": n}
    if rate != "inf":
        load["request_rate"] = rate
    if pattern == "gamma":
        load["arrival_smoothness"] = burst
    return {"schema_version": "1.0", "benchmark_id": "simulated by aisim (tests/benchserve_points.py), not measured",
            "request_count": {"unit": "requests", "avg": float(n)},
            "time_to_first_token": {"unit": "ms", "avg": b["mean_ttft_ms"]},
            "inter_token_latency": {"unit": "ms", "avg": b["mean_tpot_ms"]},
            "request_latency": {"unit": "ms", "avg": b["mean_e2el_ms"]},
            "output_token_throughput": {"unit": "tokens/sec", "avg": b["output_throughput"]},
            "request_throughput": {"unit": "requests/sec", "avg": b["request_throughput"]},
            "benchmark_duration": {"unit": "sec", "avg": b["duration"]},
            "total_isl": {"unit": "tokens", "avg": float(n * il)},
            "total_osl": {"unit": "tokens", "avg": float(n * ol)},
            "input_config": {"endpoint": {"model_names": ["qwen3-8b"]}, "loadgen": load}}
