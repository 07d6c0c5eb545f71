"""aisim calibrate: the bench-serve reader, the rebuilt workload, the statistics, the fit and its record."""

import glob
import json
import math
import os

import numpy as np
import pytest
from click.testing import CliRunner

from aisim.calibrate.benchserve import read_bench_serve
from aisim.calibrate.fit import calibrate, fit, fitted_keys, prepare
from aisim.calibrate.predict import replay_metrics
from aisim.config.calibration import parse_calibration, scale_band
from aisim.calibrate.workload import legacy_send_times, run_trace, send_times
from aisim.cli import main
from aisim.config.engine import engine_config_from_dict, load_engine_config
from aisim.errors import ConfigError, MeasurementError

from benchserve_points import HERE, WORKLOADS, result, truth_engine, truth_values

# The workloads whose statistics move smoothly with the step times (a burst, or sends the cap
# releases at step ends): a fit on them has one exact minimum.  Poisson sends fall between step
# boundaries, so their TTFT jumps as the step times move.
SMOOTH = [s for s in WORKLOADS if not s.startswith(("poisson", "bursty"))]


def _good(**changes):
    doc = {"num_prompts": 2, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": None, "duration": 1.0,
           "completed": 2, "failed": 0, "total_input_tokens": 200, "total_output_tokens": 6,
           "output_throughput": 6.0, "mean_ttft_ms": 10.0}
    doc.update(changes)
    return {k: v for k, v in doc.items() if v != "DROP"}


def _write(tmp_path, doc, name="run.json"):
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(p)


# ---------------------------------------------------------------- reading


def test_reads_shipped_files():
    runs = read_bench_serve(os.path.join(HERE, "cap4-7000x64.json"))
    assert len(runs) == 1
    r = runs[0]
    assert (r.num_prompts, r.request_rate, r.max_concurrency, r.total_input_tokens) == (8, math.inf, 4, 56000)
    assert set(r.metrics) == {"ttft", "tpot", "itl", "e2el", "throughput"}


def test_appended_runs_are_one_a_line(tmp_path):
    p = _write(tmp_path, json.dumps(_good()) + "\n" + json.dumps(_good(request_rate=2.0)) + "\n")
    runs = read_bench_serve(p)
    assert [r.request_rate for r in runs] == [math.inf, 2.0]
    assert [r.label for r in runs] == ["run.json", "run.json#2"]


@pytest.mark.parametrize("doc, words", [
    (_good(num_prompts="DROP"), "missing key 'num_prompts'"),
    (_good(request_rate=-1), "'request_rate' must be a positive number or \"inf\""),
    (_good(burstiness=0), "'burstiness' must be a positive number"),
    (_good(max_concurrency=0), "'max_concurrency' must be a positive integer or null"),
    (_good(completed=1, failed=1), "1 of 2 requests completed"),
    (_good(mean_ttft_ms="fast"), "'mean_ttft_ms' must be a finite non-negative number"),
    (_good(input_lens=[100]), "'input_lens' must be a list of 2 positive integers"),
    (_good(random_prefix_len="x"), "'random_prefix_len' must be a non-negative integer"),
    (_good(ramp_up_strategy="linear"), "'ramp_up_strategy' is set"),
    ([1, 2], "run 1 is not a JSON object"),
    ('{"num_prompts": 1,\n "num_prompts": 2}', "key 'num_prompts' appears twice"),
    ('{"num_prompts": 1,\n oops}', ":2: not valid JSON"),
    ("", "no runs"),
])
def test_refusals_name_file_and_key(tmp_path, doc, words):
    p = _write(tmp_path, doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(MeasurementError) as e:
        read_bench_serve(p)
    assert p in str(e.value) and words in str(e.value)


def test_refusal_names_the_run_of_an_appended_file(tmp_path):
    p = _write(tmp_path, json.dumps(_good()) + "\n" + json.dumps(_good(burstiness=-2)) + "\n")
    with pytest.raises(MeasurementError, match=r"run\.json, run 2: 'burstiness'"):
        read_bench_serve(p)


# ---------------------------------------------------------------- the workload and its statistics


def test_send_times_as_vllm_bench_serve():
    # Even gaps of 1 / rate (infinite burstiness), the first one too: 0.5, 1.0, 1.5, 2.0.
    assert send_times(4, 2.0, math.inf).tolist() == [0.5, 1.0, 1.5, 2.0]
    assert send_times(3, math.inf, 1.0).tolist() == [0.0, 0.0, 0.0]
    # Gamma gaps are rescaled so the last send is num_prompts / rate = 50 / 5 = 10 s.
    s = send_times(50, 5.0, 0.5, seed=3)
    assert s[-1] == pytest.approx(10.0, rel=1e-12) and np.all(np.diff(s) >= 0) and s[0] > 0
    # serve.py main_async: np.random.seed(--seed), then one np.random.gamma a request (the random dataset
    # draws from its own generator): with --seed 3 the first of 50 sends is that first gap, rescaled.
    state = np.random.RandomState(3)   # the stream np.random.seed(3) gives the global functions
    gaps = [state.gamma(shape=0.5, scale=1.0 / (5.0 * 0.5)) for _ in range(50)]
    assert s[0] == pytest.approx(gaps[0] * 10.0 / sum(gaps), rel=1e-12)


def test_legacy_client_sends_redrawn_from_its_seed():
    # benchmark_serving.py before vLLM 0.10: the first send at 0, then a gamma gap after each send, drawn
    # after the random dataset's offsets.  A published run (nerdalert, Llama 3.1 8B, 120 prompts at 1 req/s,
    # --seed 1, 1,000 / 100 tokens) lasted 99.329 s with a mean E2E of 0.045 + 99 x 0.00856 = 0.89 s: the
    # redrawn last send is 98.28 s, 1.05 s before its end.  Llama 3.1's vocabulary of 128,256 rows (its
    # tokenizer's vocab_size is 128,000) would shift the draws: a last send of 122.6 s, after the run ended.
    s = legacy_send_times(120, 1.0, 1.0, 1, 128000, (1000, 1000), (100, 100))
    assert s[0] == 0.0 and len(s) == 120 and np.all(np.diff(s) > 0)
    assert s[-1] == pytest.approx(98.283, abs=1e-3) and 0.0 < 99.329 - s[-1] < 1.1
    assert legacy_send_times(120, 1.0, 1.0, 1, 128256, (1000, 1000), (100, 100))[-1] > 99.329
    # One gap is numpy's RandomState gamma after the n offsets: the second send of two.
    state = np.random.RandomState(7)
    state.randint(0, 1000, size=2)
    assert legacy_send_times(2, 4.0, 1.0, 7, 1000).tolist() == [0.0, state.gamma(1.0, 0.25)]
    assert legacy_send_times(3, math.inf, 1.0, 7, 1000).tolist() == [0.0, 0.0, 0.0]


def test_lengths_spread_the_totals(tmp_path):
    r = read_bench_serve(_write(tmp_path, _good(num_prompts=3, completed=3, total_input_tokens=301,
                                                total_output_tokens=8)))[0]
    trace, kw, sends = run_trace(r)
    assert trace.column("prompt_tokens").to_pylist() == [101, 100, 100]
    assert trace.column("output_tokens").to_pylist() == [3, 3, 2]
    assert kw == {}


def test_statistics_by_hand(tmp_path):
    # A linear time model of 10 ms a step, two requests of 100 prompt tokens and 3 output tokens
    # sent one at a time (cap 1): each takes a prefill step (its first token) and two decode steps.
    # TTFT 10 ms, TPOT = ITL = (30 - 10) / 2 = 10 ms, E2E 30 ms; 6 tokens over the 60 ms run: 100/s.
    engine = engine_config_from_dict({"num_gpu_blocks": 64, "max_model_len": 2048,
                                      "time_model": {"kind": "linear", "base_s": 0.01}})
    r = read_bench_serve(_write(tmp_path, _good(max_concurrency=1)))[0]
    m = replay_metrics(*run_trace(r), engine)
    assert m == pytest.approx({"ttft": 10.0, "tpot": 10.0, "itl": 10.0, "e2el": 30.0, "throughput": 100.0})


def test_time_scale_multiplies_every_step(tmp_path):
    # The same run at time_scale 2: every step 20 ms, so every latency doubles and throughput halves.
    engine = engine_config_from_dict({"num_gpu_blocks": 64, "max_model_len": 2048,
                                      "time_model": {"kind": "linear", "base_s": 0.01, "time_scale": 2.0}})
    r = read_bench_serve(_write(tmp_path, _good(max_concurrency=1)))[0]
    m = replay_metrics(*run_trace(r), engine)
    assert m == pytest.approx({"ttft": 20.0, "tpot": 20.0, "itl": 20.0, "e2el": 60.0, "throughput": 50.0})
    with pytest.raises(ConfigError, match="time_scale"):
        engine_config_from_dict({"num_gpu_blocks": 64, "max_model_len": 2048, "time_model": {"time_scale": 0.0}})


# ---------------------------------------------------------------- the fit


def test_fit_recovers_the_constants_that_made_the_points(tmp_path):
    # Points replayed with known constants (every fitted one moved from its default), written as
    # bench-serve files, fitted from the defaults: the constants come back (to the 4 significant
    # figures a fit reports).
    truth = truth_values()
    eng = truth_engine(truth)
    paths = [_write(tmp_path, result(s, eng), s + ".json") for s in SMOOTH]
    runs = [r for p in paths for r in read_bench_serve(p)]
    got = fit(prepare(runs), truth_engine(), tuple(truth))
    assert got.values.keys() == truth.keys()
    for k, v in truth.items():
        assert got.values[k] == pytest.approx(v, rel=1e-3), k
    assert got.loss < 1e-12


def test_shipped_files_are_what_aisim_replays():
    # The files under tests/data/benchserve hold the replays of their workloads at the truth (a change
    # of the time model changes them: rewrite them with `python tests/benchserve_points.py`).
    eng = truth_engine(truth_values())
    for s in WORKLOADS:
        with open(os.path.join(HERE, s + ".json")) as fh:
            assert json.load(fh) == pytest.approx(result(s, eng)), f"{s}: python tests/benchserve_points.py"


def test_calibrate_cross_validates_and_records(tmp_path):
    truth = truth_values()
    eng = truth_engine(truth)
    paths = [_write(tmp_path, result(s, eng), s + ".json") for s in SMOOTH[:4]]
    runs = [r for p in paths for r in read_bench_serve(p)]
    key = fitted_keys()[0]
    cal = calibrate(runs, truth_engine(), name="t", keys=(key,), max_iter=20)
    # One constant from points made with five: every fold lands on its own value.
    assert set(cal.folds) == set(paths)
    rec = cal.record
    assert rec["sources"] == [s + ".json" for s in SMOOTH[:4]] and rec["points"] == 4 and rec["fitted"] == [key]
    # The record's quantiles are those of the printed held-out errors (numpy's linear percentiles).
    e = [r["held_out_error"] for r in cal.rows if r["metric"] == "tpot"]
    assert rec["held_out"]["tpot"] == [round(float(np.percentile(e, q)), 4) for q in (10, 50, 90)]
    assert cal.engine.time_model.calibration == rec
    assert getattr(cal.engine.time_model, key) == cal.fit.values[key]


def test_calibrate_needs_two_files_and_fitted_keys(tmp_path):
    runs = read_bench_serve(os.path.join(HERE, "cap1-128x200.json"))
    with pytest.raises(MeasurementError, match="two runs or more"):
        calibrate(runs, truth_engine(), name="t")
    runs += read_bench_serve(os.path.join(HERE, "cap1-1000x2.json"))
    with pytest.raises(ConfigError, match="'gpu' is not a fitted time-model constant"):
        calibrate(runs, truth_engine(), name="t", keys=("gpu",))
    key = fitted_keys()[0]
    zero = truth_engine({key: 0.0}) if key.startswith("overhead") else None
    if zero is not None:  # an overhead may be 0; a fit cannot start from it
        with pytest.raises(ConfigError, match=f"'time_model.{key}' starts at 0.0; .* leave it out of the fit"):
            calibrate(runs, zero, name="t", keys=(key,))
    with pytest.raises(ConfigError, match="time model is 'linear', which has no fitted constants"):
        calibrate(runs, engine_config_from_dict({"num_gpu_blocks": 64, "max_model_len": 2048}), name="t")


# ---------------------------------------------------------------- the record


def test_scale_band_by_hand():
    # TPOT held out from -10 % to +25 %, ITL from -20 % to +10 %: the steps took 1/1.25 = 0.8 to
    # 1/0.9 of the predicted (TPOT) and 1/1.1 to 1/0.8 = 1.25 (ITL); the band is the wider ends.
    rec = {"quantiles": [0.1, 0.5, 0.9], "held_out": {"tpot": [-0.1, 0.0, 0.25], "itl": [-0.2, 0.0, 0.1],
                                                       "ttft": [-0.9, 0.0, 9.0]}}
    assert scale_band(rec) == (0.8, 1.25)
    assert scale_band({"quantiles": [0.1, 0.9], "held_out": {"ttft": [0.0, 0.1]}}) is None


@pytest.mark.parametrize("raw, words", [
    ({"method": "m"}, "'time_model.calibration.name' in x.toml must be a string"),
    ({"name": "n", "method": "m", "held_out": {"tpot": [0.1, 0.0, 0.2]}}, "held_out.tpot"),
    ({"name": "n", "method": "m", "held_out": {"speed": [0.1, 0.2, 0.3]}}, "unknown metric"),
    ({"name": "n", "method": "m", "quantiles": [0.9, 0.1]}, "quantiles"),
    ({"name": "n", "method": "m", "when": 1}, "unknown key 'time_model.calibration.when'"),
])
def test_record_refusals(raw, words):
    with pytest.raises(ConfigError) as e:
        parse_calibration(raw, " in x.toml")
    assert words in str(e.value) and "x.toml" in str(e.value)


def test_cli_writes_an_engine_the_other_commands_take(tmp_path):
    out = tmp_path / "cal.toml"
    files = [os.path.join(HERE, s + ".json") for s in ("cap1-128x200", "cap1-1000x2", "cap64-256x256")]
    key = fitted_keys()[0]
    r = CliRunner().invoke(main, ["calibrate", *files, "--model", "qwen3-8b", "--gpu", "H100", "--max-model-len",
                                  "8192", "--fit", key, "--max-iter", "10", "--out", str(out), "--format", "json",
                                  "--db", str(tmp_path / "m.duckdb")])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    eng = load_engine_config(out)
    assert getattr(eng.time_model, key) == doc["constants"][key]
    assert eng.time_model.calibration == doc["calibration"] and doc["calibration"]["name"] == "cal"
    assert len(doc["points"]) == 15  # three runs, five metrics each
    # Each point says its unit: vllm bench serve's latencies in ms, its output throughput in tok/s.
    assert [(p["metric"], p["unit"]) for p in doc["points"][:5]] == [
        ("ttft", "ms"), ("tpot", "ms"), ("itl", "ms"), ("e2el", "ms"), ("throughput", "tok/s")]
    import duckdb

    con = duckdb.connect(str(tmp_path / "m.duckdb"))
    assert con.execute("SELECT count(*), min(calibration) FROM measured_runs").fetchone() == (3, "cal")
    # The same inputs, the same bytes.
    again = tmp_path / "again" / "cal.toml"
    r2 = CliRunner().invoke(main, ["calibrate", *files, "--model", "qwen3-8b", "--gpu", "H100", "--max-model-len",
                                   "8192", "--fit", key, "--max-iter", "10", "--out", str(again), "--format", "json"])
    assert r2.exit_code == 0 and again.read_bytes() == out.read_bytes() and r2.stdout == r.stdout


def test_a_run_the_engine_cannot_hold_is_named(tmp_path):
    # 4,096-token prompts on an engine of max_model_len 2,048.
    p = _write(tmp_path, _good(num_prompts=2, completed=2, total_input_tokens=8192))
    runs = read_bench_serve(p) + read_bench_serve(os.path.join(HERE, "cap1-128x200.json"))
    from aisim.plan import plan_from_model

    small, _ = plan_from_model("qwen3-8b", gpu="H100", max_model_len=2048)
    with pytest.raises(MeasurementError, match=r"run\.json: the run cannot be replayed on this engine"):
        calibrate(runs, small, name="t")


def test_cli_refusals(tmp_path):
    bad = _write(tmp_path, _good(completed="x"))
    r = CliRunner().invoke(main, ["calibrate", bad, "--model", "qwen3-8b", "--gpu", "H100"])
    assert r.exit_code == 2 and f"error: {bad}: 'completed' must be a positive integer" in r.output
    r = CliRunner().invoke(main, ["calibrate", bad])
    assert r.exit_code == 2 and "give exactly one of --engine and --model" in r.output


def test_a_step_past_a_float_is_a_rejected_step_not_a_traceback(tmp_path):
    # Two Poisson runs pin few constants: the search strays to log-values whose exp() overflows a
    # float; such a step costs infinity and is rejected like one out of a constant's range.
    files = [os.path.join(HERE, "poisson-4rps-512x128.json"), os.path.join(HERE, "bursty-8rps-1024x96.json")]
    out = tmp_path / "c.toml"
    r = CliRunner().invoke(main, ["calibrate", *files, "--model", "qwen3-8b", "--gpu", "H100", "--out", str(out)])
    assert r.exit_code == 0, r.output
    tm = load_engine_config(out).time_model
    assert all(math.isfinite(getattr(tm, k)) for k in fitted_keys())


def test_fit_iterations_show_on_a_terminal_or_with_progress_only(tmp_path):
    # As every long command: --progress/--no-progress, default on a terminal (CliRunner's stderr is not one).
    files = [os.path.join(HERE, s + ".json") for s in ("cap1-128x200", "cap64-256x256")]
    args = ["calibrate", *files, "--model", "qwen3-8b", "--gpu", "H100", "--max-model-len", "8192",
            "--max-iter", "3", "--format", "json"]
    quiet = CliRunner().invoke(main, args)
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stderr == "" and CliRunner().invoke(main, [*args, "--no-progress"]).stderr == ""
    shown = CliRunner().invoke(main, [*args, "--progress"])
    assert shown.exit_code == 0 and shown.stdout == quiet.stdout
    lines = shown.stderr.splitlines()
    by_fit = {}
    for line in lines:
        label, _, rest = line.partition(": iteration ")
        by_fit.setdefault(label, []).append(int(rest.split(",")[0]))
    # The fit on both files, then one fit without each file; each counts its iterations from 1.
    assert list(by_fit) == ["fit", "without cap1-128x200.json", "without cap64-256x256.json"]
    assert all(its == list(range(1, len(its) + 1)) and 1 <= len(its) <= 3 for its in by_fit.values())


def test_a_database_that_refuses_the_runs_leaves_no_engine_file(tmp_path):
    files = [os.path.join(HERE, s + ".json") for s in ("cap1-128x200", "cap64-256x256")]
    bad_db = tmp_path / "not.duckdb"
    bad_db.write_text("hello\n")
    out = tmp_path / "cal.toml"
    args = ["calibrate", *files, "--model", "qwen3-8b", "--gpu", "H100", "--max-model-len", "8192", "--max-iter", "2"]
    r = CliRunner().invoke(main, [*args, "--out", str(out), "--db", str(bad_db)])
    assert r.exit_code == 2 and r.stdout == "" and "error: cannot open database" in r.stderr
    assert not out.exists() and bad_db.read_text() == "hello\n"
    # An output that is an input, or two outputs in one file: refused before any fit.
    r = CliRunner().invoke(main, [*args, "--db", files[0]])
    assert r.exit_code == 2 and r.output == (f"error: --db {files[0]} is RESULTS {files[0]}, an input of this run; "
                                             "aisim never writes over its inputs\n")
    r = CliRunner().invoke(main, [*args, "--out", str(out), "--db", str(out)])
    assert r.exit_code == 2 and r.output == f"error: --db {out} and --out {out} are the same file\n"
