"""``aisim replay`` through click's CliRunner: outputs, decision log, and bad input."""

import json
import os
import shutil

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.config.versions import DEFAULT_VLLM_VERSION

from conftest import ORACLE
from helpers import copy_oracle_config


@pytest.fixture
def scenario(tmp_path):
    src = os.path.join(ORACLE, "full_small")
    copy_oracle_config(src, tmp_path / "engine.json")
    shutil.copy(os.path.join(src, "trace.jsonl"), tmp_path / "trace.jsonl")
    return tmp_path


def _run(*args):
    return CliRunner().invoke(main, list(args))


def test_replay_writes_outputs_and_decision_log(scenario):
    out = scenario / "out"
    log = scenario / "decisions.jsonl"
    r = _run("replay", "--engine", str(scenario / "engine.json"), "--trace", str(scenario / "trace.jsonl"),
             "--out", str(out), "--decision-log", str(log))
    assert r.exit_code == 0, r.output
    assert "40 / 40" in r.output
    requests = pq.read_table(out / "requests.parquet")
    steps = pq.read_table(out / "steps.parquet")
    summary = json.loads((out / "summary.json").read_text())
    assert requests.num_rows == 40 and steps.num_rows == 241
    assert summary["prefix_cache_stats"]["hits"] == 4352
    # No vllm_version in the configuration: the default release's rules.
    with open(os.path.join(ORACLE, "full_small", f"vllm-{DEFAULT_VLLM_VERSION}.jsonl")) as fh:
        expected_text = fh.read().splitlines()
    got_text = log.read_text().splitlines()
    # Step lines are byte-identical to the recorded log (key order included).
    assert got_text[1:-1] == expected_text[1:-1]
    expected = [json.loads(line) for line in expected_text]
    got = [json.loads(line) for line in got_text]
    assert got[0]["type"] == "header" and got[0]["vllm_version"] == DEFAULT_VLLM_VERSION
    assert {k: got[-1][k] for k in expected[-1]} == expected[-1]


def test_version_override(scenario):
    log = scenario / "d.jsonl"
    r = _run("replay", "--engine", str(scenario / "engine.json"), "--trace", str(scenario / "trace.jsonl"),
             "--decision-log", str(log), "--vllm-version", "0.31.0")
    assert r.exit_code == 0, r.output
    assert json.loads(log.read_text().splitlines()[0])["vllm_version"] == "0.31.0"


def _assert_refused(r, *fragments, nothing_in=None):
    assert r.exit_code != 0
    for f in fragments:
        assert f in r.output
    if nothing_in is not None:
        assert not os.path.exists(nothing_in) or os.listdir(nothing_in) == []


def test_unknown_config_key_is_named(scenario):
    cfg = json.loads((scenario / "engine.json").read_text())
    cfg["max_num_seq"] = 8
    (scenario / "engine.json").write_text(json.dumps(cfg))
    out = scenario / "out"
    r = _run("replay", "--engine", str(scenario / "engine.json"), "--trace", str(scenario / "trace.jsonl"),
             "--out", str(out))
    _assert_refused(r, "unknown key 'max_num_seq'", "engine.json", nothing_in=out)


@pytest.mark.parametrize("key,value,message", [
    ("num_gpu_blocks", 1, "'num_gpu_blocks'"),
    ("max_num_seqs", 0, "'max_num_seqs'"),
    ("block_size", "16", "must be an integer"),
    ("policy", "lifo", "'policy'"),
    ("vllm_version", "0.30.0", "'vllm_version'"),
    ("watermark", 1.5, "'watermark'"),
    ("enable_prefix_caching", "yes", "true or false"),
    ("max_num_batched_tokens", 4, "at least 'max_num_seqs'"),
])
def test_out_of_range_values_are_named(scenario, key, value, message):
    cfg = json.loads((scenario / "engine.json").read_text())
    cfg[key] = value
    (scenario / "engine.json").write_text(json.dumps(cfg))
    out = scenario / "out"
    r = _run("replay", "--engine", str(scenario / "engine.json"), "--trace", str(scenario / "trace.jsonl"),
             "--out", str(out))
    _assert_refused(r, message, nothing_in=out)


@pytest.mark.parametrize("line,message", [
    ("{not json", ":3: not valid JSON"),
    ('{"request_id": "x", "prompt_len": 10, "max_tokens": 0, "arrival_step": 5}', ":3: field 'max_tokens'"),
    ('{"request_id": "x", "prompt_len": 10, "max_tokens": 2}', ":3: exactly one of 'arrival_step'"),
    ('{"request_id": "r0", "prompt_len": 10, "max_tokens": 2, "arrival_step": 5}', "already used on line 1"),
    ('{"request_id": "x", "prompt_len": 5000, "max_tokens": 2, "arrival_step": 5}', ":3: field 'prompt_len' (5000) must be below max_model_len"),
    ('{"request_id": "x", "prompt_len": 10, "max_tokens": 2, "arrival_step": 5, "colour": 1}', ":3: unknown field 'colour'"),
])
def test_malformed_trace_line_is_named(scenario, line, message):
    lines = (scenario / "trace.jsonl").read_text().splitlines()
    lines.insert(2, line)
    (scenario / "trace.jsonl").write_text("\n".join(lines) + "\n")
    out = scenario / "out"
    log = scenario / "d.jsonl"
    r = _run("replay", "--engine", str(scenario / "engine.json"), "--trace", str(scenario / "trace.jsonl"),
             "--out", str(out), "--decision-log", str(log))
    _assert_refused(r, "trace.jsonl" + message if message.startswith(":") else message, nothing_in=out)
    assert not log.exists()


def test_missing_files_are_clear(tmp_path):
    r = _run("replay", "--engine", str(tmp_path / "nope.json"), "--trace", str(tmp_path / "t.jsonl"))
    _assert_refused(r, "cannot read engine configuration", "nope.json")


def test_unknown_group_type_is_refused_with_reason(scenario):
    cfg = json.loads((scenario / "engine.json").read_text())
    cfg["kv_cache_groups"] = [{"type": "full"}, {"type": "sliding_windw", "sliding_window": 128}]
    (scenario / "engine.json").write_text(json.dumps(cfg))
    r = _run("replay", "--engine", str(scenario / "engine.json"), "--trace", str(scenario / "trace.jsonl"))
    _assert_refused(r, "kv_cache_groups[1].type", "sliding_windw")


def test_request_larger_than_the_pool_is_refused(scenario):
    cfg = json.loads((scenario / "engine.json").read_text())
    cfg["num_gpu_blocks"] = 20
    (scenario / "engine.json").write_text(json.dumps(cfg))
    r = _run("replay", "--engine", str(scenario / "engine.json"), "--trace", str(scenario / "trace.jsonl"))
    _assert_refused(r, "KV-cache blocks", "only 19 usable blocks")


def test_version_and_help():
    from aisim import __version__

    r = _run("--version")
    assert r.exit_code == 0 and __version__ in r.output
    r = _run("--help")
    for command in ("replay", "pipeline", "query", "report", "sweep", "trace", "config", "plan"):
        assert command in r.output


@pytest.mark.parametrize("args, message", [
    (("--max-concurrency", "0"), "--max-concurrency must be a positive integer, got 0"),
    (("--seed", "3"), "--seed seeds a Poisson re-timing; set --poisson-rate"),
    (("--rate-scale", "2", "--poisson-rate", "3"), "--rate-scale and --poisson-rate are alternatives; give one"),
    (("--rate-scale", "-1"), "--rate-scale must be a finite positive number, got -1.0"),
])
def test_bad_load_flags_are_named_as_flags(scenario, args, message):
    r = _run("replay", "--engine", str(scenario / "engine.json"), "--trace", str(scenario / "trace.jsonl"), *args)
    assert r.exit_code == 2 and r.output == f"error: {message}\n"
