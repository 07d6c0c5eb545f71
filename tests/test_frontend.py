"""The serial API server in front of the engine, and the timing harness's use of it."""

import importlib.util
import os

import numpy as np
import pytest

from aisim.perf.frontend import engine_arrivals, service_s

HARNESS = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "timing_accuracy.py")


def _harness():
    spec = importlib.util.spec_from_file_location("timing_accuracy", HARNESS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_service_is_per_request_plus_per_token():
    assert service_s([100, 0], 0.002, 1e-5).tolist() == [0.002 + 100 * 1e-5, 0.002]


def test_burst_is_spaced_by_the_service():
    # Three requests sent at once, 10 ms + 1 us x 1,000 tokens = 11 ms each: 11, 22, 33 ms.
    e = engine_arrivals([0.0, 0.0, 0.0], [1000, 1000, 1000], 0.010, 1e-6)
    assert e == pytest.approx([0.011, 0.022, 0.033])


def test_an_idle_server_takes_a_request_when_sent():
    # 5 ms each: the second waits for the first (0.005 -> 0.010), the third finds the server idle
    # (sent at 1.0, served by 1.005), the fourth queues behind it (1.010).
    e = engine_arrivals([0.0, 0.001, 1.0, 1.0], [0, 0, 0, 0], 0.005, 0.0)
    assert e == pytest.approx([0.005, 0.010, 1.005, 1.010])


def test_free_server_keeps_the_send_times():
    send = [0.0, 0.5, 0.5, 2.0]
    assert engine_arrivals(send, [10, 20, 30, 40], 0.0, 0.0).tolist() == send


@pytest.mark.parametrize("send, lens, cost, message", [
    ([0.0, 1.0], [1], (0.0, 0.0), "2 send times for 1 prompts"),
    ([1.0, 0.0], [1, 1], (0.0, 0.0), "non-decreasing"),
    ([0.0], [1], (-1.0, 0.0), "non-negative"),
])
def test_refusals(send, lens, cost, message):
    with pytest.raises(ValueError, match=message):
        engine_arrivals(send, lens, *cost)


def test_harness_sends_at_the_client_s_times_and_leaves_the_server_to_the_replay():
    # The trace holds the client's sends; the replay's own API server (the engine's time model)
    # spaces them, so the harness adds no cost of its own.  A capped run's sends are held by the core.
    h = _harness()
    point = {"point": "p", "num_prompts": 4, "input_len": 100, "output_len": 8, "workload": "concurrency",
             "concurrency": 2, "rate_rps": None, "seed": None}
    trace, kw, send = h.trace_for(point, 0)
    assert kw == {"max_concurrency": 2}
    assert trace.column("arrival_s").to_pylist() == [0.0] * 4
    burst = dict(point, workload="burst")
    trace, kw, send = h.trace_for(burst, 0)
    assert kw == {} and send.tolist() == [0.0] * 4
    assert trace.column("arrival_s").to_pylist() == [0.0] * 4
    rate = dict(point, workload="rate", rate_rps=1000.0, seed=7)
    trace, kw, send = h.trace_for(rate, 0)
    assert kw == {"max_concurrency": 2} and h.capped(rate)
    assert send[0] == 0.0 and np.all(np.diff(send) > 0)
    assert trace.column("arrival_s").to_pylist() == send.tolist()
    trace, kw, _ = h.trace_for(dict(rate, concurrency=None), 0)
    assert kw == {} and trace.column("arrival_s").to_pylist() == send.tolist()
    # A run of benchmark_serving.py before vLLM 0.10: the client's own sends, redrawn from its seed.
    from aisim.calibrate.workload import legacy_send_times

    legacy = dict(rate, concurrency=None, client_vocab_size=128000, requested_output_len=8)
    _, _, send = h.trace_for(legacy, 0)
    assert send.tolist() == legacy_send_times(4, 1000.0, 1.0, 7, 128000).tolist() and send[0] == 0.0


def test_published_points_name_catalog_models_and_gpus():
    from aisim.config.catalog import get_gpu, get_model

    h = _harness()
    points = h.load_points()
    assert len({p["point"] for p in points}) == len(points)
    for p in points:
        get_model(p["model"])
        get_gpu(p["gpu"])
        assert p["workload"] in ("burst", "concurrency", "rate")
        assert p["workload"] != "concurrency" or p["concurrency"] >= 1


def test_fit_follows_the_ttft_of_bursts_and_of_cold_long_prompts():
    h = _harness()
    every, no_ttft = ("ttft", "tpot", "throughput"), ("tpot", "throughput")
    cold = dict(workload="concurrency", cached_prefix_by_run="", input_len=2048)
    assert h._fitted_metrics(cold) == every
    assert h._fitted_metrics(dict(cold, input_len=2047)) == no_ttft
    assert h._fitted_metrics(dict(cold, cached_prefix_by_run="512")) == no_ttft
    assert h._fitted_metrics(dict(cold, workload="rate", input_len=512)) == no_ttft
    assert h._fitted_metrics(dict(cold, workload="burst", input_len=128)) == every


def test_harness_warms_the_first_prompts_a_run_shares_with_an_earlier_one():
    # "1000@2": an earlier run with the same seed sent the first 2 of these 3 prompts; they are
    # cached (one warm-up request each), the third reaches a cold cache.
    h = _harness()
    assert h.cached_runs({"cached_prefix_by_run": "512;1000@2"}) == [(512, None), (1000, 2)]
    assert h.cached_runs({"cached_prefix_by_run": ""}) == [(0, None)]
    point = {"point": "p", "num_prompts": 3, "input_len": 1000, "output_len": 8, "workload": "burst",
             "concurrency": None, "rate_rps": None, "seed": None}
    trace, _, send = h.trace_for(point, 1000, cached_prompts=2)
    ids = trace.column("request_id").to_pylist()
    assert sorted(i for i in ids if i.startswith("w")) == ["w0", "w1"]
    assert send.tolist() == [h.WARM_UP_S] * 3
    every, _, _ = h.trace_for(point, 1000)
    assert sum(i.startswith("w") for i in every.column("request_id").to_pylist()) == 3


def test_cross_validation_predicts_each_source_by_a_fit_that_never_saw_it(monkeypatch, capsys):
    # Three sources of two, one and one points; the fit and the prediction are stand-ins that say
    # what each fold was given: a fold's fit sees every other source's points and none of its own.
    h = _harness()
    points = [dict(point=f"{s}{i}", source=s, ttft_ms=10.0, tpot_ms=10.0, throughput_tok_s=10.0, ttft_stat="p50",
                   tpot_stat="p50", output_len=10, requested_output_len=10)
              for s, n in (("a", 2), ("b", 1), ("c", 1)) for i in range(n)]
    seen = {}

    def fake_fit(train, start, iters, label="fit"):
        seen[label] = sorted(p["point"] for p in train)
        return {"compute_efficiency": len(train) / 10}

    monkeypatch.setattr(h, "fit", fake_fit)
    monkeypatch.setattr(h, "predict", lambda p, eff: {"ttft": 10.0 * (1 + eff["compute_efficiency"]),
                                                      "tpot": 10.0, "throughput": 10.0})
    h.cross_validate(points, {}, iters=3)
    assert seen == {"without a": ["b0", "c0"], "without b": ["a0", "a1", "c0"], "without c": ["a0", "a1", "b0"]}
    out = capsys.readouterr().out
    # Source a's points are predicted by the fit on 2 points (TTFT +20 %), b's and c's on 3 (+30 %).
    assert "a, fitted on the other sources (2 points): TTFT 20.0%" in out
    assert "b, fitted on the other sources (1 points): TTFT 30.0%" in out
    assert "every source, each fitted on the others (4 points): TTFT 25.0%, TPOT 0.0%, E2E -, throughput 0.0%" in out
    with pytest.raises(SystemExit, match="two sources or more"):
        h.cross_validate(points[:2], {}, iters=3)


def test_the_docs_state_the_fitted_numbers_the_code_holds():
    from aisim.config.keys import TIME_MODEL_KEYS, defaults
    from aisim.perf import frontend

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def text(*path):
        with open(os.path.join(root, *path), encoding="utf-8") as fh:
            return " ".join(fh.read().split())

    d = defaults(TIME_MODEL_KEYS)
    server = f"{frontend.PER_REQUEST_S * 1e3:.1f} ms a request and {frontend.PER_TOKEN_S * 1e6:.1f} us a prompt token"
    assert f"({server}, fitted)" in text("docs", "step-time.md")
    assert (f"compute efficiency {d['compute_efficiency']:g} and attention efficiency {d['attention_efficiency']:g} "
            f"of the GPU's achievable matmul FLOP/s (attention's in the KV cache's dtype), bandwidth efficiency "
            f"{d['bandwidth_efficiency']:g}, {d['overhead_s'] * 1e3:.1f} ms a step and "
            f"{d['overhead_per_req_s'] * 1e6:.0f} us a scheduled request, {d['executor_per_req_s'] * 1e6:.0f} us more "
            f"on more than one GPU (`aisim/config/keys.py`); the API server "
            f"{server}") in text("benchmarks", "data", "README.md")


def test_published_e2e_follows_from_mean_ttft_and_tpot():
    # nerdalert at 10 req/s: 100 tokens each (--ignore-eos), mean TTFT 56.9 ms, mean TPOT 11.84 ms:
    # 56.9 + 99 x 11.84 = 1,229.06 ms a request on average.
    h = _harness()
    points = {p["point"]: p for p in h.load_points()}
    assert h.published_e2e(points["nerdalert-llama-3.1-8b-h100-rate10"]) == pytest.approx(1229.06)
    # cssnoeasy publishes medians: no exact mean latency follows.
    assert h.published_e2e(points["cssnoeasy-tp1-2048x128-c16"]) is None
    # A run whose requests stopped early (mean output below the requested length) has none either.
    early = dict(points["nerdalert-llama-3.1-8b-h100-rate10"], output_len=97)
    assert h.published_e2e(early) is None
