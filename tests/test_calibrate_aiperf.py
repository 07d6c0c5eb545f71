"""AIPerf's summary export read as measured runs, and a fit on it."""

import json
import math

import pytest

from aisim.calibrate.benchserve import read_bench_serve
from aisim.calibrate.fit import fit, fitted_keys, prepare
from aisim.errors import MeasurementError

from benchserve_points import aiperf_result, result, truth_engine, truth_values


def _write(tmp_path, doc, name="profile_export_aiperf.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return str(p)


def test_an_export_is_the_run_bench_serve_reports(tmp_path):
    eng = truth_engine(truth_values())
    bench = read_bench_serve(_write(tmp_path, result("bursty-8rps-1024x96", eng), "b.json"))[0]
    perf = read_bench_serve(_write(tmp_path, aiperf_result("bursty-8rps-1024x96", eng)))[0]
    # The same workload: rate 8 with gamma shape 0.5, no cap, 60 requests of 1,024 and 96 tokens.
    for k in ("num_prompts", "request_rate", "burstiness", "max_concurrency", "total_input_tokens",
              "total_output_tokens"):
        assert getattr(perf, k) == getattr(bench, k), k
    assert perf.duration_s == pytest.approx(bench.duration_s)
    # AIPerf's inter-token latency is vLLM's TPOT; it has no pooled ITL.
    assert perf.metrics == {k: v for k, v in bench.metrics.items() if k != "itl"}
    assert perf.model_id == "qwen3-8b"


def test_patterns_and_units(tmp_path):
    doc = aiperf_result("cap4-7000x64", truth_engine())
    run = read_bench_serve(_write(tmp_path, doc))[0]
    assert (run.request_rate, run.max_concurrency, run.burstiness) == (math.inf, 4, 1.0)
    doc["input_config"]["loadgen"].update(request_rate=2.0, arrival_pattern="constant")
    doc["time_to_first_token"] = {"unit": "sec", "avg": 0.25}
    run = read_bench_serve(_write(tmp_path, doc))[0]
    assert (run.request_rate, run.burstiness, run.metrics["ttft"]) == (2.0, math.inf, 250.0)


@pytest.mark.parametrize("change, words", [
    (lambda d: d.pop("total_isl"), "missing key 'total_isl.avg'"),
    (lambda d: d.update(error_request_count={"unit": "requests", "avg": 2.0}), "2 failed"),
    (lambda d: d["input_config"]["loadgen"].update(concurrency=[4, 8]), "'input_config.loadgen.concurrency'"),
    (lambda d: d["input_config"]["loadgen"].update(arrival_pattern="burst"), "'input_config.loadgen.arrival_pattern'"),
    (lambda d: d["time_to_first_token"].update(unit="ticks"), "'time_to_first_token.unit'"),
])
def test_refusals_name_file_and_key(tmp_path, change, words):
    doc = aiperf_result("cap1-128x200", truth_engine())
    change(doc)
    p = _write(tmp_path, doc)
    with pytest.raises(MeasurementError) as e:
        read_bench_serve(p)
    assert p in str(e.value) and words in str(e.value)


def test_fit_recovers_the_constants_from_exports(tmp_path):
    truth = truth_values()
    eng = truth_engine(truth)
    stems = ("cap1-8000x2", "cap1-1000x2", "cap1-128x200", "cap64-256x256", "cap4-7000x64", "burst-2048x64")
    runs = [r for s in stems for r in read_bench_serve(_write(tmp_path, aiperf_result(s, eng), s + ".json"))]
    got = fit(prepare(runs), truth_engine(), tuple(truth))
    for k, v in truth.items():
        assert got.values[k] == pytest.approx(v, rel=1e-3), k
