"""``aisim capacity`` from flags: the same spec as the file, the same bytes out; ``--set`` on a search."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from aisim.cli import main

# The hand model of tests/test_capacity.py: 10 ms a step, one sequence at a time, 21 requests 1 s apart.
ENGINE = {"model": "m", "block_size": 16, "num_gpu_blocks": 1024, "max_model_len": 4096, "max_num_seqs": 1,
          "max_num_batched_tokens": 2048, "enable_prefix_caching": False,
          "time_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 0.0, "per_req_s": 0.0}}


@pytest.fixture
def inputs(tmp_path, monkeypatch):
    lines = [{"request_id": f"r{i}", "prompt_len": 16, "max_tokens": 10, "arrival_time": float(i)} for i in range(21)]
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "engine.json").write_text(json.dumps(ENGINE))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(*args):
    return CliRunner().invoke(main, ["capacity", *map(str, args)])


RATE_FILE = ('name = "c"\ndatabase = "cap.duckdb"\nengine = "engine.json"\n[trace]\npath = "trace.jsonl"\n'
             'format = "oracle"\n[slo]\nttft_s = 0.215\nattainment = 1.0\n[rate]\nby = "rate_scale"\nrel_tol = 0.01\n')
RATE_FLAGS = ("--name", "c", "--db", "cap.duckdb", "--engine", "engine.json", "--trace", "trace.jsonl",
              "--trace-format", "oracle", "--slo", "ttft_s=0.215", "--slo", "attainment=1.0",
              "--rate", "by=rate_scale", "--rate", "rel_tol=0.01")


@pytest.mark.parametrize("fmt", ["json", "csv", "table"])
def test_flags_and_file_give_the_same_bytes(inputs, fmt):
    (inputs / "cap.toml").write_text(RATE_FILE)
    from_file = _run("cap.toml", "--format", fmt)
    assert from_file.exit_code == 0, from_file.output
    from_flags = _run(*RATE_FLAGS, "--format", fmt)
    assert from_flags.exit_code == 0, from_flags.output
    assert from_flags.stdout == from_file.stdout
    if fmt == "json":
        assert json.loads(from_file.stdout)["answer"] is not None


def test_fleet_flags_and_written_spec_give_the_same_bytes(inputs):
    flags = ("--engine", "engine.json", "--trace", "trace.jsonl", "--slo", "ttft_s=0.215", "--slo", "attainment=1.0",
             "--fleet", "max_replicas=4", "--fleet", 'grid={"max_num_seqs": [1, 2]}', "--db", "cap2.duckdb")
    r = _run(*flags, "--format", "json", "--write-spec", "specs/cap.toml")
    assert r.exit_code == 0, r.output
    text = (inputs / "specs" / "cap.toml").read_text()
    assert 'engine = "../engine.json"' in text and 'path = "../trace.jsonl"' in text
    again = _run("specs/cap.toml", "--format", "json")
    assert again.exit_code == 0, again.output
    assert again.stdout == r.stdout
    doc = json.loads(r.stdout)
    assert doc["search"] == "capacity" and doc["question"] == "deployment"
    assert [p["knobs"] for p in doc["points"]][:2] == ['{"layout": "aggregated", "max_num_seqs": 1}',
                                                        '{"layout": "aggregated", "max_num_seqs": 2}']


def test_rate_alone_asks_the_rate_question_with_its_defaults(inputs):
    r = _run("--engine", "engine.json", "--trace", "trace.jsonl", "--slo", "ttft_s=0.215", "--slo",
             "attainment=1.0", "--rate", "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["question"] == "rate"


@pytest.mark.parametrize("args, message", [
    (("cap.toml", "--engine", "engine.json"), "--engine: the spec is cap.toml"),
    (("--engine", "engine.json", "--slo", "ttft_s=1", "--rate"), "--trace missing"),
    (("--engine", "engine.json", "--trace", "trace.jsonl", "--slo", "ttft_s=1"), "ask one question"),
    (("--engine", "engine.json", "--trace", "trace.jsonl", "--slo", "ttft_s=1", "--slo", "attainment=1", "--rate",
      "step=2"), "unknown key 'rate.step'"),
    (("--engine", "engine.json", "--trace", "trace.jsonl", "--slo", "ttft=1", "--rate"), "unknown key 'slo.ttft'"),
    (("--engine", "engine.json", "--trace", "trace.jsonl", "--slo", "ttft_s=1", "--slo", "attainment=1", "--rate",
      "--set", "max_num_sequences=2"), "unknown key 'max_num_sequences'"),
])
def test_bad_flags_are_named(inputs, args, message):
    (inputs / "cap.toml").write_text(RATE_FILE)
    r = _run(*args)
    assert r.exit_code == 2 and message in r.output, r.output


def test_set_changes_the_searched_engine(inputs):
    """Two sequences at a time serve more: the highest rate within the SLO rises, and the search is another."""
    (inputs / "cap.toml").write_text(RATE_FILE)
    one = json.loads(_run("cap.toml", "--format", "json").stdout)
    two = _run("cap.toml", "--format", "json", "--set", "max_num_seqs=2")
    assert two.exit_code == 0, two.output
    two = json.loads(two.stdout)
    assert two["search_id"] != one["search_id"]
    best = [p["rate_req_s"] for d in (one, two) for p in d["points"] if p["answer"]]
    assert best[1] > best[0]


def test_a_planned_engine_gives_the_same_search_as_its_written_files(inputs):
    flags = ("--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--trace", "trace.jsonl",
             "--slo", "ttft_s=0.5", "--slo", "attainment=1.0", "--rate", "by=rate_scale", "--rate", "rel_tol=0.25",
             "--format", "json")
    r = _run(*flags, "--write-spec", "plan/cap.toml")
    assert r.exit_code == 0, r.output
    assert "engine planned for meta-llama/Llama-3.1-8B-Instruct on 1 x H100" in r.stderr
    assert 'engine = "cap.engine.toml"' in (inputs / "plan" / "cap.toml").read_text()
    from aisim.config.engine import load_engine_config

    from aisim.plan import plan_from_model

    planned, _ = plan_from_model("llama-3.1-8b", gpu="H100")  # what aisim plan gives an H100
    assert load_engine_config(inputs / "plan" / "cap.engine.toml").num_gpu_blocks == planned.num_gpu_blocks
    again = _run("plan/cap.toml", "--format", "json")
    assert again.exit_code == 0, again.output
    assert again.stdout == r.stdout
    unwritten = _run(*flags)  # planned in a temporary folder: the same search
    assert unwritten.exit_code == 0, unwritten.output
    assert unwritten.stdout == r.stdout
    r = _run(*flags, "--engine", "engine.json")
    assert r.exit_code == 2 and "give the engine once" in r.output


def test_a_planned_config_json_and_a_refused_set_name_what_the_user_gave(inputs):
    # The plan of a config.json path names it relative to the plan's file: from a temporary folder, and
    # beside a written spec in another folder, the search finds the model.
    import os
    import shutil

    (inputs / "m").mkdir()
    shutil.copy(os.path.join(os.path.dirname(__file__), "data", "hf", "llama-3.1-8b.json"), inputs / "m" / "config.json")
    flags = ("--model", "m/config.json", "--gpu", "H100", "--trace", "trace.jsonl", "--slo", "ttft_s=0.5",
             "--slo", "attainment=1.0", "--rate", "by=rate_scale", "--rate", "rel_tol=0.25", "--format", "json")
    unwritten = _run(*flags)
    assert unwritten.exit_code == 0, unwritten.output
    written = _run(*flags, "--write-spec", "plan/cap.toml")
    assert written.exit_code == 0, written.output
    assert 'model = "../m/config.json"' in (inputs / "plan" / "cap.engine.toml").read_text()
    again = _run("plan/cap.toml", "--format", "json")
    assert again.exit_code == 0 and again.stdout == written.stdout
    assert json.loads(unwritten.stdout)["points"][0]["rate_req_s"] == json.loads(written.stdout)["points"][0][
        "rate_req_s"]
    # 500 blocks of 64 tokens hold 499 usable; a 131,072-token request needs 2,048.
    r = _run(*flags, "--set", "num_gpu_blocks=500")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.splitlines()[-1] == (
        "error: 'num_gpu_blocks' (500) in the engine planned for m/config.json leaves 499 usable blocks, but one "
        "request of max_model_len (131072) needs 2048 blocks; the estimated maximum model length is 31936; vLLM "
        "refuses to start such an engine")


def test_progress_gives_every_point_its_verdict(inputs):
    # A p99 SLO has no attainment: each point still ends its progress line with its verdict.
    import re

    r = _run("--engine", "engine.json", "--trace", "trace.jsonl", "--slo", "ttft_p99_s=0.215", "--rate",
             "by=rate_scale", "--rate", "rel_tol=0.01", "--progress", "--format", "json")
    assert r.exit_code == 0, r.output
    points = json.loads(r.stdout)["points"]
    lines = [x for x in r.stderr.splitlines() if x.startswith("point ")]
    assert len(lines) == len(points) >= 3
    for line, p in zip(lines, points):
        m = re.fullmatch(r"point (\d+) \((\w+)\): .*: (meets|fails), [0-9.]+ [mµ]?s", line)
        assert m is not None, line
        assert (int(m.group(1)), m.group(2), m.group(3)) == (p["point"], p["phase"], p["verdict"])


def test_the_table_is_titled_by_the_search_s_name(inputs):
    args = ("--engine", "engine.json", "--trace", "trace.jsonl", "--slo", "ttft_p99_s=0.215", "--rate", "rel_tol=0.25")
    assert _run(*args).stdout.splitlines()[0] == "capacity: SLO ttft_p99_s <= 0.215"
    assert _run(*args, "--name", "llama").stdout.splitlines()[0] == "capacity llama: SLO ttft_p99_s <= 0.215"
