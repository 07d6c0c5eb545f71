"""Inter-token latency as ``vllm bench serve`` takes it: every gap between two streamed outputs of a
request, pooled over the requests (``ReplayResult.gaps``, the summary's ``itl_s``, ``*_itl_ms``).

Known answers from a linear step time (base 0.01 s + 0.001 s a scheduled token): an output is
streamed at the end of the step that sampled it; the gaps below are read off the steps' clocks.
"""

import json
import os

import numpy as np
import pyarrow as pa
import pytest

from aisim.config.engine import engine_config_from_dict
from aisim.deploy import deploy
from aisim.replay import replay, replay_stream
from aisim.traces import read_trace
from aisim.traces.frame import from_frame

from conftest import ORACLE
from helpers import make_trace, oracle_engine_dict

TIME = {"base_s": 0.01, "per_token_s": 0.001}


def _gaps(result) -> list:
    """The pooled gaps, each repeated by its count, ascending (vLLM's sorted ITL list)."""
    g = result.gaps
    return sorted(np.repeat(g["gap_s"], g["count"]).tolist())


def _check_sums(result) -> None:
    """A request's gaps add up to its time from first token to finish."""
    q = result.requests.to_pydict()
    span = sum(f - t for f, t, n in zip(q["finish_s"], q["first_token_s"], q["output_tokens"]) if n > 1)
    assert float((result.gaps["gap_s"] * result.gaps["count"]).sum()) == pytest.approx(span, rel=1e-12)


def test_a_preempted_request_has_one_long_gap():
    # 4 usable blocks of 16 tokens; a and b (30-token prompts) take 2 each.
    # step 0 [0, 0.07): both prefill (60 tokens): first tokens at 0.07.
    # steps 1, 2 (12 ms each, two decodes): outputs at 0.082 and 0.094, gaps 12 ms x 4.
    # step 3 [0.094, 0.105): a needs its third block: b (the later) is preempted; a's output, 11 ms.
    # step 4 [0.105, 0.116): a's fifth token, 11 ms; a finishes.
    # step 5 [0.116, 0.159): b recomputes 33 tokens and samples its fourth: 0.159 - 0.094 = 65 ms.
    eng = engine_config_from_dict({"num_gpu_blocks": 5, "max_model_len": 64, "block_size": 16,
                                   "enable_prefix_caching": False, "time_model": TIME})
    r = replay(make_trace([dict(id="a", prompt=30, max_tokens=5, at=0), dict(id="b", prompt=30, max_tokens=4, at=0)],
                          "time"), eng)
    assert r.summary["preemptions"] == 1
    assert _gaps(r) == pytest.approx([0.011] * 2 + [0.012] * 4 + [0.065])
    _check_sums(r)
    itl = r.summary["itl_s"]
    assert itl["mean"] == pytest.approx(0.135 / 7) and itl["p50"] == pytest.approx(0.012)
    # p99 at index 6 * 0.99 = 5.94 of the sorted gaps: 12 + 0.94 * (65 - 12) ms.
    assert itl["p99"] == pytest.approx(0.012 + 0.94 * 0.053)


def test_a_speculative_output_is_one_chunk():
    # Two drafts a step, accepted 2, 0, 1 in turn (each request's own count).
    # step 0 [0, 0.03): a prefills 20: first token at 0.03 (b arrives at 5 ms, after it started).
    # step 1 [0.03, 0.053): a verifies 2, accepts 2: three tokens in one output, 23 ms; b prefills 10.
    # step 2 [0.053, 0.069): a accepts 0: one token, 16 ms; b accepts 2 but stops at 3 tokens: 16 ms.
    # step 3 [0.069, 0.082): a accepts 1 but stops at its sixth token: 13 ms.
    eng = engine_config_from_dict({"num_gpu_blocks": 100, "max_model_len": 256, "enable_prefix_caching": False,
                                   "speculative": {"num_speculative_tokens": 2, "method": "ngram",
                                                   "acceptance": {"counts": [2, 0, 1]}},
                                   "time_model": TIME})
    r = replay(make_trace([dict(id="a", prompt=20, max_tokens=6, at=0), dict(id="b", prompt=10, max_tokens=3,
                                                                              at=0.005)], "time"), eng)
    assert r.requests.column("spec_accepted").to_pylist() == [3, 2]
    # Four outputs after the first ones (9 tokens - 2 first tokens = 7 tokens in them).
    assert _gaps(r) == pytest.approx([0.013, 0.016, 0.016, 0.023])
    _check_sums(r)


def test_an_asynchronous_engine_streams_each_batch_at_its_end():
    # A batch queue of two, 16 tokens a step.
    # step 0 [0, 0.018): a prefills 8: first token at 0.018.
    # step 1 [0.018, 0.044): a's decode and 15 of b's 20 prompt tokens: a's output, 26 ms.
    # step 2 [0.044, 0.060): a's decode, b's last 5: a 16 ms; b's first token.
    # step 3 [0.060, 0.072): both decode: 12 ms each; both finish.
    eng = engine_config_from_dict({"num_gpu_blocks": 100, "max_model_len": 256, "max_num_seqs": 4,
                                   "max_num_batched_tokens": 16, "async_scheduling": True,
                                   "enable_prefix_caching": False, "time_model": TIME})
    r = replay(make_trace([dict(id="a", prompt=8, max_tokens=4, at=0), dict(id="b", prompt=20, max_tokens=2,
                                                                             at=0.015)], "time"), eng)
    assert _gaps(r) == pytest.approx([0.012, 0.012, 0.016, 0.026])
    _check_sums(r)


def test_disaggregated_first_gap_runs_from_the_prefill_replicas_token():
    # 100-token prompt: one 0.02 s prefill step (base 0.01 + 1e-4 a token) on the prefill replica,
    # whose output is the first chunk; the KV lands 1 ms + 7 blocks x 2000 bytes / 1 GB/s later and
    # the decode replica streams a token every 0.0101 s from then.
    eng = engine_config_from_dict({"num_gpu_blocks": 4000, "block_size": 16,
                                   "kv_cache_groups": [{"type": "full", "page_size_bytes": 1000, "num_layers": 2}],
                                   "time_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4}})
    trace = from_frame(pa.table({"request_id": ["r0"], "arrival_time": [0.0], "prompt_len": [100],
                                 "max_tokens": [3]}))
    dep = deploy(trace, eng, {"prefill": {"replicas": 1}, "decode": {"replicas": 1},
                              "link": {"bandwidth_gb_s": 1.0, "latency_s": 0.001}})
    land = 0.02 + 7 * 2000 / 1e9 + 0.001
    assert sorted(np.repeat(dep.gaps["gap_s"], dep.gaps["count"]).tolist()) == pytest.approx(
        [0.0101, land + 0.0101 - 0.02])
    (row,) = dep.requests.to_pylist()
    assert dep.summary["itl_s"]["mean"] == pytest.approx((row["finish_s"] - row["first_token_s"]) / 2)


@pytest.mark.parametrize("scenario", ["timed", "full_pressure_async"])
def test_recorded_scenarios_gaps_add_up_and_stream_alike(scenario):
    path = os.path.join(ORACLE, scenario)
    d = oracle_engine_dict(path, "0.33.0")
    d["time_model"] = TIME
    eng = engine_config_from_dict(d)
    trace = read_trace(os.path.join(path, "trace.jsonl"))
    timed = (trace.schema.metadata or {}).get(b"clock") == b"time"
    whole = replay(trace, eng)
    assert whole.summary["preemptions"] > 90
    _check_sums(whole)
    q = whole.requests.to_pydict()
    assert int(whole.gaps["count"].sum()) == sum(n - 1 for n in q["output_tokens"] if n > 0)
    # Distinct gaps only: far fewer pairs than gaps (about 30,000 gaps here).
    assert len(whole.gaps["gap_s"]) < int(whole.gaps["count"].sum()) / 50
    pieces = [trace.slice(i, 40) for i in range(0, trace.num_rows, 40)]
    items = list(replay_stream(iter(pieces), eng, timed=timed, expected=trace.num_rows, out_rows=16))
    assert json.dumps(items[-1][1]["itl_s"]) == json.dumps(whole.summary["itl_s"])


def test_replay_json_reports_the_recorded_gaps(tmp_path):
    from click.testing import CliRunner

    from aisim.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in (
        {"request_id": "a", "prompt_len": 30, "max_tokens": 5, "arrival_time": 0.0},
        {"request_id": "b", "prompt_len": 30, "max_tokens": 4, "arrival_time": 0.0})))
    engine = tmp_path / "e.json"
    engine.write_text(json.dumps({"num_gpu_blocks": 5, "max_model_len": 64, "block_size": 16,
                                  "enable_prefix_caching": False, "time_model": TIME}))
    r = CliRunner().invoke(main, ["replay", "--engine", str(engine), "--trace", str(trace), "--format", "json",
                                  "--percentile-metrics", "itl", "--metric-percentiles", "50,90,100"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    # The preemption test's gaps: 11 ms x 2, 12 ms x 4, 65 ms.
    gaps = [11.0] * 2 + [12.0] * 4 + [65.0]
    assert d["mean_itl_ms"] == pytest.approx(np.mean(gaps)) and d["std_itl_ms"] == pytest.approx(np.std(gaps))
    assert d["median_itl_ms"] == pytest.approx(12.0) and d["p100_itl_ms"] == pytest.approx(65.0)
    assert d["p90_itl_ms"] == pytest.approx(float(np.percentile(gaps, 90)))
