"""What every command shares (aisim.cli_util): --format, --trace-format, whole table cells, the number
formats, Ctrl-C, phase progress and --out paths, through click's CliRunner."""

import json
import os
import shutil

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.cli_util import fmt_num, fmt_pct, fmt_seconds
from aisim.traces import FORMATS, READERS

from conftest import ORACLE
from helpers import copy_oracle_config

LONG = "a-directory-name-long-enough-that-no-table-could-fit-it-in-a-hundred-and-twenty-columns-" * 2


@pytest.fixture
def scenario(tmp_path):
    src = os.path.join(ORACLE, "full_small")
    copy_oracle_config(src, tmp_path / "engine.json")
    deep = tmp_path / LONG
    deep.mkdir()
    shutil.copy(os.path.join(src, "trace.jsonl"), deep / "trace.jsonl")
    return tmp_path


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _replay(scenario, *args):
    return _run("replay", "--engine", scenario / "engine.json", "--trace", scenario / LONG / "trace.jsonl", *args)


@pytest.mark.parametrize("v, text", [(0.0123, "12.3 ms"), (0.123, "123 ms"), (1.234, "1.23 s"), (0.9997, "1.00 s"),
                                     (0.000456, "456 µs"), (12.34, "12.3 s"), (1234.5, "1,234 s"), (0, "0 s"),
                                     (None, "-"), (float("nan"), "-")])
def test_fmt_seconds(v, text):
    assert fmt_seconds(v) == text


def test_fmt_num_and_pct():
    assert fmt_num(1234567) == "1,234,567"
    assert fmt_num(1234.5678) == "1,234.568"
    assert fmt_num(1234.5678, 0) == "1,235"
    assert fmt_num(None) == "-"
    assert fmt_pct(0.1234) == "12.3%"
    assert fmt_pct(None) == "-"


def test_replay_table_keeps_long_paths_whole(scenario):
    r = _replay(scenario)
    assert r.exit_code == 0, r.output
    assert f"{LONG}/trace.jsonl" in r.stdout and "…" not in r.stdout
    assert "40 / 40" in r.stdout


def test_replay_json_is_alone_on_stdout(scenario):
    out = scenario / "new" / "deeper" / "out"
    r = _replay(scenario, "--format", "json", "--out", out)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["requests"] == 40 and doc["finished"] == 40 and doc["steps"] == 241
    assert doc["prefix_cache_stats"]["hits"] == 4352
    assert r.stderr == f"results written to {out}/ (requests.parquet, steps.parquet, summary.json)\n"
    assert (out / "summary.json").exists()  # missing parents created


def test_replay_csv_is_key_value(scenario):
    r = _replay(scenario, "--format", "csv")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == "key,value"
    assert "requests,40" in lines and "prefix_cache_stats.hits,4352" in lines


def test_trace_format_choices_are_the_readers(scenario):
    r = _replay(scenario, "--trace-format", "nope")
    assert r.exit_code == 2
    assert "'nope' is not one of " + ", ".join(f"'{f}'" for f in sorted(READERS)) in r.stderr
    # The names --help lists without importing a reader are the registry's.
    assert list(FORMATS) == sorted(READERS)


def test_trace_inspect_and_convert_formats(tmp_path):
    src = os.path.join(ORACLE, "full_small", "trace.jsonl")
    r = _run("trace", "inspect", src, "--trace-format", "oracle", "--format", "json")
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert info["requests"] == 40 and info["prompt_tokens"]["total"] == 13769
    old = _run("trace", "inspect", src, "--trace-format", "oracle", "--json")  # the deprecated spelling
    assert old.exit_code == 0 and json.loads(old.stdout) == info
    r = _run("trace", "inspect", src, "--format", "csv")
    assert r.exit_code == 0 and r.stdout.splitlines()[:2] == ["key,value", "requests,40"]
    out = tmp_path / "made" / "t.parquet"
    r = _run("trace", "convert", src, "--trace-format", "oracle", "--out", out)
    assert r.exit_code == 0, r.output
    assert pq.read_table(out).num_rows == 40
    assert r.stdout == f"wrote 40 requests to {out}\n"


def test_out_of_the_wrong_kind_is_one_clear_error(scenario, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    r = _replay(scenario, "--out", afile)
    assert r.exit_code == 2 and f"Invalid value for '--out': {afile} is a file, not a directory" in r.stderr
    r = _run("trace", "synth", "-n", 5, "--out", tmp_path)
    assert r.exit_code == 2 and f"{tmp_path} is a directory, not a file" in r.stderr
    r = _run("trace", "synth", "-n", 5, "--out", afile / "sub" / "t.parquet")
    assert r.exit_code == 2 and f"{afile} is a file, so {afile / 'sub' / 't.parquet'} cannot be created" in r.stderr
    assert afile.read_text() == "x"


def test_ctrl_c_is_one_line_and_writes_nothing(scenario, monkeypatch):
    import aisim.replay

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(aisim.replay, "replay", interrupted)
    out = scenario / "out"
    r = _replay(scenario, "--out", out)
    assert r.exit_code == 130 and r.stderr == "error: interrupted\n" and r.stdout == ""
    assert not out.exists()


def test_a_refused_file_is_one_line(scenario, monkeypatch):
    import aisim.output

    def refused(result, out_dir, decision_log=None, inputs=None):
        raise PermissionError(13, "Permission denied", str(out_dir))

    monkeypatch.setattr(aisim.output, "write_result", refused)
    r = _replay(scenario, "--out", scenario / "out")
    assert r.exit_code == 2 and r.stderr == f"error: {scenario / 'out'}: Permission denied\n" and r.stdout == ""


def test_interrupted_trace_write_leaves_nothing(tmp_path, monkeypatch):
    import pyarrow.parquet

    def half_written(table, sink):  # the staged file aisim.files hands the writer
        sink.write(b"PAR1")
        raise KeyboardInterrupt

    monkeypatch.setattr(pyarrow.parquet, "write_table", half_written)
    r = _run("trace", "synth", "-n", 10, "--out", tmp_path / "t.parquet")
    assert r.exit_code == 130 and r.stderr == "error: interrupted\n"
    assert os.listdir(tmp_path) == []


def test_progress_only_when_asked_off_a_terminal(scenario, tmp_path):
    r = _replay(scenario)
    assert r.exit_code == 0 and r.stderr == ""
    r = _replay(scenario, "--progress", "--format", "json")
    assert r.exit_code == 0, r.output
    phases = [line.split(":")[0] for line in r.stderr.splitlines()]
    assert phases == ["reading trace", "replaying"]
    assert r.stderr.splitlines()[0].startswith("reading trace: 40 requests, ")
    json.loads(r.stdout)
    r = _run("trace", "synth", "-n", 10, "--progress", "--out", tmp_path / "t.parquet")
    assert r.exit_code == 0 and [line.split(":")[0] for line in r.stderr.splitlines()] == ["generating", "writing"]
