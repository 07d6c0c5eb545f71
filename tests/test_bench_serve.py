"""``aisim replay`` in ``vllm bench serve``'s words: its flags, its JSON keys and units, the planned engine,
``--set``, and Hugging Face ids of the model catalog."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.errors import ConfigError


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def tiny(tmp_path):
    """Two requests at 0 s on a linear engine: 10 ms a step plus 1 ms a scheduled token.

    Step 0 (0 s): prefills of a (16 tokens) and b (32): 10 + 48 ms, ends at 58 ms, both first tokens.
    Step 1 (58 ms): a and b decode (2 tokens): 12 ms, ends at 70 ms; b has its 2 tokens and finishes.
    Step 2 (70 ms): a decodes: 11 ms, ends at 81 ms; a has its 3 tokens and finishes.
    """
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"request_id": "a", "prompt_len": 16, "max_tokens": 3, "arrival_time": 0.0}) + "\n"
                     + json.dumps({"request_id": "b", "prompt_len": 32, "max_tokens": 2, "arrival_time": 0.0}) + "\n")
    engine = tmp_path / "e.json"
    engine.write_text(json.dumps({"num_gpu_blocks": 100, "max_model_len": 4096,
                                  "time_model": {"base_s": 0.01, "per_token_s": 0.001}}))
    return engine, trace


# vLLM's result keys (vllm/benchmarks/serve.py, benchmark(): result and process_one_metric) with the
# default --percentile-metrics ttft,tpot,itl and --metric-percentiles 99, after the setup keys.
VLLM_KEYS = [
    "model_id", "num_prompts", "request_rate", "burstiness", "max_concurrency",
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
    "request_goodput", "output_throughput", "total_token_throughput", "max_concurrent_requests",
    "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "std_itl_ms", "p99_itl_ms",
]


def test_json_has_vllm_keys_in_order_then_engine_load_and_versions(tiny):
    engine, trace = tiny
    r = _run("replay", "--engine", engine, "--trace", trace, "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    keys = list(doc)
    assert keys[:len(VLLM_KEYS)] == VLLM_KEYS
    assert keys[len(VLLM_KEYS):len(VLLM_KEYS) + 4] == ["goodput", "aisim_version", "engine", "load"]
    assert doc["engine"]["num_gpu_blocks"] == 100 and doc["vllm_version"] == doc["engine"]["vllm_version"]
    assert doc["request_goodput"] is None and doc["goodput"] is None  # as vLLM: None without --goodput


def test_metrics_by_hand(tiny):
    engine, trace = tiny
    r = _run("replay", "--engine", engine, "--trace", trace, "--format", "json", "--goodput", "ttft:60", "tpot:11.8",
             "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    # Arrivals at 0 s, last finish at 81 ms (the fixture's steps).
    assert d["duration"] == pytest.approx(0.081, abs=1e-15)
    assert (d["completed"], d["failed"], d["total_input_tokens"], d["total_output_tokens"]) == (2, 0, 48, 5)
    assert d["request_throughput"] == pytest.approx(2 / 0.081)
    assert d["output_throughput"] == pytest.approx(5 / 0.081)
    assert d["total_token_throughput"] == pytest.approx(53 / 0.081)
    assert d["max_concurrent_requests"] == 2  # both in flight in second 0
    # Goodput: both TTFTs 58 ms <= 60; TPOT a = (81 - 58) / 2 = 11.5 ms <= 11.8, b = (70 - 58) / 1 = 12 ms > 11.8.
    assert d["request_goodput"] == pytest.approx(1 / 0.081)
    assert d["mean_ttft_ms"] == pytest.approx(58) and d["std_ttft_ms"] == pytest.approx(0, abs=1e-9)
    assert d["mean_tpot_ms"] == pytest.approx(11.75) and d["p99_tpot_ms"] == pytest.approx(11.5 + 0.5 * 0.99)
    # ITL: every chunk after a request's first, the gap to its previous chunk: a at 70 ms (12 ms after
    # 58) and at 81 ms (11 ms), b at 70 ms (12 ms) -> [11, 12, 12]; the median 12, p99 at index 1.98: 12.
    assert d["mean_itl_ms"] == pytest.approx(35 / 3)
    assert d["median_itl_ms"] == pytest.approx(12) and d["p50_itl_ms"] == pytest.approx(12)
    assert d["p99_itl_ms"] == pytest.approx(12)
    assert d["std_itl_ms"] == pytest.approx(float(np.std([11.0, 12.0, 12.0])))
    assert d["mean_e2el_ms"] == pytest.approx((81 + 70) / 2) and d["p50_e2el_ms"] == pytest.approx(75.5)
    table = _run("replay", "--engine", engine, "--trace", trace, "--goodput", "ttft:60", "tpot:11.8").stdout
    assert "ITL mean / median / P99" in table and "within ttft 60 ms, tpot 11.8 ms" in table


def test_a_spread_past_float_range_is_inf_without_a_warning():
    import warnings

    from aisim.stats import weighted_stats

    # Gaps of 1e200 s and 0 (a calibration's trial constants can price steps so): mean 5e199, the
    # squared deviations 2.5e399 overflow, so the spread is inf; the percentiles stay exact.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mean, median, std, ps = weighted_stats(np.array([0.0, 1e200]), np.array([1, 1]), [0, 100])
    assert (mean, median, std, ps) == (5e199, 5e199, math.inf, [0.0, 1e200])


def test_weighted_itl_statistics_equal_numpy_on_the_repeated_gaps():
    from aisim.stats import Tally, weighted_stats

    rng = np.random.default_rng(7)
    v, w = rng.random(200), rng.integers(1, 9, 200)
    rep = np.repeat(v, w)
    qs = [0, 25, 50, 90, 99, 99.9, 100]
    mean, median, std, ps = weighted_stats(v, w, qs)
    assert median == np.median(rep) and ps == [float(x) for x in np.percentile(rep, qs)]
    assert mean == pytest.approx(np.mean(rep), rel=1e-14) and std == pytest.approx(np.std(rep), rel=1e-12)
    # The same pairs given in pieces, values repeated across pieces, merge to each value once.
    tally = Tally()
    for k in range(0, 200, 30):
        tally.add(np.concatenate([v[k:k + 30], v[:5]]), np.concatenate([w[k:k + 30], np.ones(5, np.int64)]))
    values, counts = tally.pairs()
    assert list(values) == sorted(v) and tally.n == int(w.sum()) + 35
    assert counts[np.searchsorted(values, v[0])] == w[0] + 7


@pytest.mark.parametrize("args, message", [
    (("--goodput", "ttft=500"), "give KEY:MILLISECONDS"),
    (("--goodput", "itl:5"), "the metric is one of ttft, tpot, e2el"),
    (("--goodput", "ttft:-1"), "must not be negative"),
    (("--percentile-metrics", "ttft,foo"), "unknown metric 'foo'"),
    (("--percentile-metrics", "client_queue_time"), "'client_queue_time' is not computed"),
    (("--metric-percentiles", "99,101"), "'101' is not a percentile"),
    (("--burstiness", "2"), "add --request-rate"),
    (("--request-rate", "0"), "--request-rate must be a positive number"),
    (("--request-rate", "2", "--poisson-rate", "3"), "give one"),
    (("--gpu", "H100"), "--gpu and --tp plan an engine with --model"),
])
def test_bad_bench_flags_are_refused_by_name(tiny, args, message):
    engine, trace = tiny
    r = _run("replay", "--engine", engine, "--trace", trace, *args)
    assert r.exit_code == 2 and message in r.output, r.output


def test_max_concurrent_requests_buckets_whole_seconds_as_vllm():
    from aisim.bench_metrics import _max_concurrent

    # Started at 0, 0.5, 1.2 and 3.0 s, ending at 1.1, 2.5, 1.3 and 3.1 s: seconds 0-1, 0-2, 1-1, 3-3 ->
    # second 1 holds three.
    assert _max_concurrent(np.array([0.0, 0.5, 1.2, 3.0]), np.array([1.1, 2.5, 1.3, 3.1])) == 3
    assert _max_concurrent(np.zeros(0), np.zeros(0)) == 0


def test_request_rate_sends_as_vllm_does():
    from aisim.traces.request_rate import send_times

    assert send_times(4, math.inf).tolist() == [0.0, 0.0, 0.0, 0.0]
    even = send_times(4, 2.0, math.inf)  # every gap 1/2 s; the last request at n/R = 2 s
    assert even == pytest.approx([0.5, 1.0, 1.5, 2.0], abs=1e-15)
    bursty = send_times(1000, 5.0, 0.5, seed=3)
    assert bursty[-1] == pytest.approx(200.0, abs=1e-9) and np.all(np.diff(bursty) >= 0)
    assert np.array_equal(bursty, send_times(1000, 5.0, 0.5, seed=3))
    gaps = np.diff(bursty)  # gamma of shape 0.5: coefficient of variation sqrt(2)
    assert 1.2 < gaps.std() / gaps.mean() < 1.6


def test_request_rate_and_num_prompts_on_the_command_line(tiny, tmp_path):
    engine, trace = tiny
    r = _run("replay", "--engine", engine, "--trace", trace, "--request-rate", "4", "--burstiness", "inf",
             "--num-prompts", "1", "--format", "json", "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert (d["num_prompts"], d["request_rate"], d["burstiness"]) == (1, 4.0, "inf")
    assert d["load"] == {"request_rate": 4.0, "burstiness": "inf", "seed": 0, "num_prompts": 1}
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "o" / "requests.parquet").column("arrival_s").to_pylist() == [0.25]


def test_model_and_gpu_plan_the_engine_as_aisim_plan_does(tiny, tmp_path):
    _, trace = tiny
    r = _run("replay", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--trace", trace,
             "--format", "json")
    assert r.exit_code == 0, r.output
    planned = _run("plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--out", tmp_path / "p.toml")
    assert planned.exit_code == 0, planned.output
    from aisim.config.engine import load_engine_config

    expected = load_engine_config(tmp_path / "p.toml").to_dict()
    got = json.loads(r.stdout)["engine"]
    assert got == expected
    assert "engine planned for meta-llama/Llama-3.1-8B-Instruct on 1 x H100" in r.stderr
    # The default release (0.34.0): the whole 80 GiB less the weights and activations, 64-token blocks.
    assert ("- llama-3.1-8b on H100 (80 GiB) x TP 1: 64.0 GiB of KV cache at gpu_memory_utilization 1, 8197 blocks"
            " of 64 tokens") in r.stderr
    assert _run("replay", "--model", "llama-3.1-8b", "--trace", trace).output.endswith("add --gpu (e.g. --gpu H100)\n")
    assert "give the engine" in _run("replay", "--trace", trace).output


def test_model_with_a_release_plans_that_release_s_serve_and_says_what_the_flags_changed(tiny, tmp_path):
    # vllm serve 0.31.0 starts llama-3.1-8b on an H100 with 16-token blocks at gpu_memory_utilization 0.92:
    # 29,513 blocks (tests/test_plan_serve_defaults.py), not 0.34.0's 8,197 of 64 tokens relabelled.
    _, trace = tiny
    r = _run("replay", "--model", "llama-3.1-8b", "--gpu", "H100", "--vllm-version", "0.31.0", "--trace", trace,
             "--set", "max_num_seqs=128", "--kv-offloading-size", "16", "--format", "json")
    assert r.exit_code == 0, r.output
    planned = _run("plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--vllm-version", "0.31.0", "--set",
                   "max_num_seqs=128", "--kv-offloading-size", "16", "--out", tmp_path / "p.toml")
    assert planned.exit_code == 0, planned.output
    from aisim.config.engine import load_engine_config

    got = json.loads(r.stdout)["engine"]
    assert got == load_engine_config(tmp_path / "p.toml").to_dict()
    assert (got["vllm_version"], got["block_size"], got["num_gpu_blocks"], got["max_num_seqs"]) == (
        "0.31.0", 16, 29513, 128)
    lines = r.stderr.splitlines()
    assert lines[0] == ("engine planned for llama-3.1-8b on 1 x H100 (aisim plan --model llama-3.1-8b --gpu H100 "
                        "--vllm-version 0.31.0):")
    # 16 GiB over 2 MiB a 16-token block (32 layers x 4,096 B x 16): 8,192 chunks.
    assert lines[-2:] == ["- --kv-offloading-size 16: vLLM's CPU OffloadingConnector, 16 GiB, 8,192 chunks",
                          "- changed with --set: max_num_seqs=128"]


# ---------------------------------------------------------------- --set


def test_set_changes_engine_and_deployment_keys(tiny):
    engine, trace = tiny
    r = _run("replay", "--engine", engine, "--trace", trace, "--format", "json", "--set", "max_num_seqs=1",
             "--set", "time_model.base_s=0.02", "--set", "enable_prefix_caching=false")
    assert r.exit_code == 0, r.output
    e = json.loads(r.stdout)["engine"]
    assert (e["max_num_seqs"], e["time_model"]["base_s"], e["enable_prefix_caching"]) == (1, 0.02, False)
    # One sequence at a time: a alone (10 + 16 ms), then its decodes (21 ms each), then b.
    assert json.loads(r.stdout)["mean_ttft_ms"] > 58
    r = _run("replay", "--engine", engine, "--trace", trace, "--format", "json", "--set", "deployment.replicas=2",
             "--set", "deployment.router=least_loaded")
    assert r.exit_code == 0, r.output
    # The router's own options only (a least-loaded router counts by requests; no KV-aware options).
    assert json.loads(r.stdout)["deployment"] == {"replicas": 2, "router": {
        "kind": "least_loaded", "by": "requests", "view_delay_s": 0.0}}


@pytest.mark.parametrize("pair, message", [
    ("max_num_seq=1", "unknown key 'max_num_seq'; the keys of the engine: num_gpu_blocks, block_size"),
    ("time_model.speed=1", "unknown key 'time_model.speed'; the keys of 'time_model': kind, base_s"),
    ("deployment.replica=2", "unknown key 'deployment.replica'; the keys of 'deployment': replicas, router"),
    ("max_num_seqs=many", "'max_num_seqs' is an integer"),
    ("enable_prefix_caching=yes", "'enable_prefix_caching' is true or false"),
    ("kv_cache_groups=[]", "set it in the configuration file"),
    ("max_num_seqs", "give KEY=VALUE"),
    ("max_num_seqs=0", "'max_num_seqs'"),  # the factory's own check, as a file's value
    ("deployment.router=fastest", "fastest"),
])
def test_set_refuses_with_the_key_named(tiny, pair, message):
    engine, trace = tiny
    r = _run("replay", "--engine", engine, "--trace", trace, "--set", pair)
    assert r.exit_code == 2 and message in r.output, r.output


def test_set_on_plan(tmp_path):
    r = _run("plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--set", "max_num_seqs=64", "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["max_num_seqs"] == 64
    assert "unknown key 'nope'" in _run("plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--set", "nope=1").output


# ---------------------------------------------------------------- the docs table


def test_docs_table_is_the_mapping_and_names_real_options():
    from aisim.bench_flags import DOC_PATH, FLAGS, render_table
    from aisim.cli import replay

    with open(DOC_PATH, encoding="utf-8") as fh:
        assert fh.read() == render_table(), "regenerate: python -m aisim.bench_flags --write"
    flags = [f for f, _, _ in FLAGS]
    assert len(flags) == len(set(flags)) == 101  # vLLM 0.33: 47 dataset flags + 54 of serve.py
    options = {o for p in replay.params for o in (*p.opts, *p.secondary_opts)}
    for _, ours, _ in FLAGS:
        if ours is not None:
            assert ours.split()[0] in options, ours


# ---------------------------------------------------------------- Hugging Face ids


def test_hugging_face_ids_resolve_to_the_catalog():
    from aisim.config.catalog import MODELS, get_model

    assert get_model("meta-llama/Llama-3.1-8B-Instruct") is MODELS["llama-3.1-8b"]
    assert get_model("qwen/qwen3-8b") is MODELS["qwen3-8b"]
    r = _run("plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["model"] == "llama-3.1-8b"


def test_an_unknown_hugging_face_id_lists_the_catalog_and_says_how_to_give_a_config():
    r = _run("plan", "--model", "acme/Giant-1T", "--gpu", "H100")
    assert r.exit_code == 2
    assert r.output.startswith("error: model 'acme/Giant-1T' is not in the catalog; the catalog has: llama-3.1-8b, "
                               "llama-3.1-70b, ")
    assert "GLM-5.3-Flash (each also by its Hugging Face ids, e.g. meta-llama/Llama-3.1-8B-Instruct" in r.output
    assert "give its path, e.g. --model DIR/config.json" in r.output
    assert "No such file" not in r.output
    with pytest.raises(ConfigError, match="unknown model 'nosuch'; the catalog has: llama-3.1-8b"):
        from aisim.config.catalog import get_model

        get_model("nosuch")


def test_a_config_path_is_still_a_file(tmp_path):
    from aisim.config.catalog import get_model

    with pytest.raises(ConfigError, match="cannot read model configuration"):
        get_model(str(tmp_path / "missing" / "config.json"))
