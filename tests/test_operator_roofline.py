"""The operator roofline's pieces against hand-derived numbers: CUDA-graph padding, a decode's KV reads,
and a steady rate well under capacity answering near the idle TTFT (no queue the engine never had)."""

import numpy as np
import pyarrow as pa
import pytest

from aisim.perf.graphs import capture_sizes, padded

from helpers import run_log


def test_capture_sizes_as_vllm_builds_them():
    # vllm/config/vllm.py _set_cudagraph_sizes (0.33): max = min(max_num_seqs x 2, 512), 1024 on compute
    # capability 10; 1, 2, 4, every 8 below 256, every 16 from 256; max_num_batched_tokens when under max.
    s = capture_sizes(256, 8192, capability=9)
    assert s[:6] == [1, 2, 4, 8, 16, 24] and s[32:36] == [240, 248, 256, 272]
    assert s[-1] == 512 and len(s) == 51
    assert capture_sizes(8, 8192) == [1, 2, 4, 8, 16]              # max 16: 1, 2, 4, 8, 16
    assert capture_sizes(1024, 16384, capability=10)[-1] == 1024    # Blackwell's ceiling
    assert capture_sizes(256, 100)[-2:] == [96, 100]                # the token budget captured, 256 left out
    # A step of n tokens runs the smallest graph >= n; past the largest, eagerly on its own tokens.
    assert [padded(n, s) for n in (1, 3, 5, 250, 257, 512, 513)] == [1, 4, 8, 256, 272, 512, 513]


def _engine(prompt_blocks=2000, **tm):
    t = {"kind": "roofline", "gpu": "H100", "model": "llama-3.1-8b", "compute_efficiency": 0.5,
         "attention_efficiency": 0.25, "bandwidth_efficiency": 0.8, "overhead_s": 0.002, "overhead_per_req_s": 0.0,
         "executor_per_req_s": 0.0}
    return dict(num_gpu_blocks=prompt_blocks, max_model_len=4096, max_num_batched_tokens=4096, time_model=dict(t, **tm))


def test_decode_step_reads_each_requests_kv_cache():
    # One decode at context 1,001 against one at 2,001: the same GEMMs, sampler and CPU; the decode kernel
    # reads 1,000 more tokens' K and V: 8 KV heads x 128 x 2 (K, V) x 2 B x 32 layers = 131,072 B a token,
    # 131.072 MB at 3.35 TB/s x 0.8 = 48.9 us.  Its FLOPs (2 x 256 x 32 x 32 = 524,288 a key, 1.05 GFLOP at
    # 198.6 TFLOP/s = 5.3 us) stay under the reads.
    def decode_s(prompt):
        _, _, res = run_log(_engine(), [dict(id="a", prompt=prompt, max_tokens=2, at=0)])
        st = res.steps.to_pydict()
        return dict(zip(st["step"], st["duration_s"]))[1]

    assert decode_s(2000) - decode_s(1000) == pytest.approx(131_072 * 1000 / (3.35e12 * 0.8), rel=1e-9)
    assert 131_072 * 1000 / (3.35e12 * 0.8) == pytest.approx(48.91e-6, rel=1e-3)


def _poisson(rate, n, seed=0):
    from aisim.traces import from_frame

    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    gaps[0] = 0.0
    return from_frame(pa.table({"request_id": [f"r{i}" for i in range(n)], "prompt_len": [1000] * n,
                                "max_tokens": [100] * n, "arrival_time": np.cumsum(gaps).tolist()}))


def test_steady_rate_under_capacity_answers_near_idle():
    # llama-3.1-8b on one H100 as `aisim plan` writes it, at the fitted defaults: a 1,000-token prefill is
    # 16 GFLOP a token x 1,000 = about 22 ms of GEMMs at 0.67 of 794.5 TFLOP/s, so 10 req/s asks a quarter
    # of the GPU's prefill time and a step of decodes reads the 16 GB of weights in about 6 ms.  The engine
    # keeps up: mean TTFT stays within 3x of its value at 0.5 req/s (measured on vLLM: 45 ms at 1 req/s,
    # 57 ms at 10) and no request waits for a queue to drain.
    from aisim.plan import plan_from_model
    from aisim.replay import replay

    cfg, _ = plan_from_model("llama-3.1-8b", tp=1, gpu="H100", max_model_len=4096)
    idle = replay(_poisson(0.5, 40), cfg).requests.column("ttft_s").to_numpy()
    busy = replay(_poisson(10.0, 400), cfg).requests.column("ttft_s").to_numpy()
    assert busy.mean() < 3 * idle.mean() and busy.max() < 10 * idle.mean()


def test_the_harness_flags_a_queue_the_server_never_had():
    # A series of Poisson points at 1, 10 and 30 req/s: published TTFT 45, 57 (1.3x) and 373 ms (8.3x, past
    # the 3x the check covers).  A prediction of 45, 200 (4.4x: flagged) and 9,000 ms passes the 30 req/s
    # point (the server queued too) and flags the 10 req/s one; a second series at one rate is no series.
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "timing_accuracy.py")
    spec = importlib.util.spec_from_file_location("timing_accuracy", path)
    h = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(h)

    def point(name, rate, ttft, source="s"):
        return {"point": name, "split": "held-out", "workload": "rate", "source": source, "model": "m", "gpu": "g",
                "tp": 1, "input_len": 1000, "output_len": 100, "concurrency": None, "rate_rps": rate, "ttft_ms": ttft}

    points = [point("r1", 1, 45.0), point("r10", 10, 57.0), point("r30", 30, 373.0), point("x", 10, 50.0, "t")]
    preds = [{"ttft": 45.0}, {"ttft": 200.0}, {"ttft": 9000.0}, {"ttft": 1e6}]
    bad = h.false_saturation(points, preds)
    assert len(bad) == 1 and bad[0].startswith("r10 (held-out)")
    assert h.false_saturation(points, [{"ttft": 45.0}, {"ttft": 130.0}, {"ttft": 9000.0}, {"ttft": 1.0}]) == []


def test_the_harness_names_the_points_that_set_each_free_number():
    # Two Poisson points below 2,048 prompt tokens: TPOT and throughput are fitted (4 terms).  A stand-in
    # model predicts TPOT 10,000 x overhead_s ms and throughput 100 x compute_efficiency / 0.5 tok/s, each
    # exact at overhead_s 1 ms and compute efficiency 0.5.  Raised alone, overhead_s (1.2 ms) moves the two
    # TPOT terms by |log 1.2| = 0.18232 each, over 4 terms 0.04558 each, 0.09116 in all; compute efficiency
    # (0.55) moves the throughputs by log 1.1 = 0.09531, 0.02383 each, 0.04766 in all; the others nothing.
    import importlib.util
    import math
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "timing_accuracy.py")
    spec = importlib.util.spec_from_file_location("timing_accuracy", path)
    h = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(h)

    def point(name):
        return {"point": name, "workload": "rate", "cached_prefix_by_run": "", "input_len": 1000, "output_len": 100,
                "requested_output_len": 100, "ttft_stat": "mean", "tpot_stat": "mean", "ttft_ms": 50.0,
                "tpot_ms": 10.0, "throughput_tok_s": 100.0}

    def model(p, e):
        return {"ttft": 50.0, "tpot": 1e4 * e["overhead_s"], "e2e": 1040.0,
                "throughput": 100.0 * e["compute_efficiency"] / 0.5}

    eff = {k: 0.5 for k in h.FREE}
    eff["overhead_s"] = 0.001
    got = h.identify([point("a"), point("b")], eff, top=2, predict_fn=model)
    total, changes = got["overhead_s"]
    assert total == pytest.approx(math.log(1.2) / 2)
    assert [(pt, m) for pt, m, _ in changes] == [("a", "tpot"), ("b", "tpot")]
    assert [c for _, _, c in changes] == pytest.approx([math.log(1.2) / 4] * 2)
    assert got["compute_efficiency"][0] == pytest.approx(math.log(1.1) / 2)
    assert [m for _, m, _ in got["compute_efficiency"][1]] == ["throughput", "throughput"]
    assert all(got[k][0] == 0.0 for k in h.FREE if k not in ("overhead_s", "compute_efficiency"))


def test_the_harness_names_the_triton_quantization_for_releases_before_0_11():
    # vLLM 0.8.4 quantizes block-FP8 activations with its Triton kernel, 0.11.0 with the CUDA one first; a row
    # whose release is not stated runs the default (the CUDA kernel, not priced).
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "timing_accuracy.py")
    spec = importlib.util.spec_from_file_location("timing_accuracy", path)
    h = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(h)
    assert [h.triton_group_quant({"vllm_version": v}) for v in ("0.8.4", "0.10.1.1", "0.11.0", "0.19.0", "")] == \
        [True, True, False, False, False]
