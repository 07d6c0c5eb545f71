"""``aisim pipeline`` and ``aisim query`` through click's CliRunner."""

import csv
import io
import json
import os

import pytest
from click.testing import CliRunner

from aisim.cli import main

from test_pipeline_common import EXAMPLES


def _run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


@pytest.fixture
def spec(tmp_path):
    """The demo spec copied next to a temporary database (paths point at the bundled samples)."""
    with open(os.path.join(os.path.dirname(EXAMPLES), "pipelines", "demo.toml")) as fh:
        text = fh.read()
    text = text.replace('"../examples/', f'"{EXAMPLES}/')
    p = tmp_path / "demo.toml"
    p.write_text(text)
    return p


@pytest.fixture
def db(spec, tmp_path):
    r = _run("pipeline", "run", spec, "--scheduler", "sync")
    assert r.exit_code == 0, r.output
    return tmp_path / "demo.duckdb"


def test_run_lands_and_summarises(spec, tmp_path):
    r = _run("pipeline", "run", spec, "--scheduler", "sync")
    assert r.exit_code == 0, r.output
    assert os.path.exists(tmp_path / "demo.duckdb")
    out = r.stdout
    assert "run demo (" in out and "#1 in" in out
    for frag in ("llama-3.1-8b / base", "llama-3.1-8b / nocache", "qwen3-next-80b / align", "2,000", "59.3%",
                 "landed", "4,300 requests", "rows/s", "read 2,300 trace rows", "sync, 1 worker",
                 "next: aisim query shards --db"):
        assert frag in out, frag
    # Progress goes to stderr, one line per shard when not on a terminal.
    assert "[3/3] shard" in r.stderr and "landing in DuckDB" in r.stderr
    again = _run("pipeline", "run", spec, "--scheduler", "sync")
    assert again.exit_code == 0 and "is already in" in again.stdout and "--force" in again.stdout
    forced = _run("pipeline", "run", spec, "--scheduler", "sync", "--force", "--progress", "none")
    assert forced.exit_code == 0 and "replaced" in forced.stdout and forced.stderr == ""


def test_run_with_db_override(spec, tmp_path):
    other = tmp_path / "sub" / "other.duckdb"
    r = _run("pipeline", "run", spec, "--scheduler", "sync", "--db", other, "--progress", "none")
    assert r.exit_code == 0, r.output
    assert other.exists() and not (tmp_path / "demo.duckdb").exists()


def test_bad_spec_exits_2_naming_key_and_file(spec):
    spec.write_text(spec.read_text().replace('name = "demo"', 'name = "demo"\nnmae = "x"'))
    r = _run("pipeline", "run", spec, "--scheduler", "sync")
    assert r.exit_code == 2
    assert "error: unknown key 'nmae'" in r.stderr and str(spec) in r.stderr
    missing = _run("pipeline", "run", spec.parent / "nope.toml")
    assert missing.exit_code == 2 and "cannot read pipeline spec" in missing.stderr


def test_failing_shard_exits_2_naming_it(spec, tmp_path):
    with open(os.path.join(EXAMPLES, "engine.json")) as fh:
        cfg = json.load(fh)
    cfg["max_model_len"] = 512  # shorter than some prompts of the trace
    (tmp_path / "short.json").write_text(json.dumps(cfg))
    spec.write_text(spec.read_text().replace('engines = { base =', f'engines = {{ short = "{tmp_path}/short.json", '
                                                                  'base ='))
    r = _run("pipeline", "run", spec, "--scheduler", "sync")
    assert r.exit_code == 2, r.output
    assert "shard 2 (model 'llama-3.1-8b', engine 'short') failed" in r.stderr and "max_model_len" in r.stderr
    assert not (tmp_path / "demo.duckdb").exists()


def test_scheduler_options_are_checked(spec):
    r = _run("pipeline", "run", spec, "--scheduler", "sync", "--workers", "2")
    assert r.exit_code == 2 and "synchronous scheduler" in r.stderr
    r = _run("pipeline", "run", spec, "--workers", "0")
    assert r.exit_code == 2 and "--workers" in r.output


def test_check_shows_the_plan(spec, db):
    r = _run("pipeline", "check", spec)
    assert r.exit_code == 0, r.output
    assert "run 'demo', key " in r.stdout and "already has this run" in r.stdout
    assert "shard 2: qwen3-next-80b on align" in r.stdout and "trace.jsonl (oracle" in r.stdout


def test_check_and_run_formats(spec, db):
    r = _run("pipeline", "check", spec, "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["name"] == "demo" and doc["landed"] is True
    assert [(s["shard_id"], s["model"], s["engine"]) for s in doc["shards"]] == [
        (0, "llama-3.1-8b", "base"), (1, "llama-3.1-8b", "nocache"), (2, "qwen3-next-80b", "align")]
    r = _run("pipeline", "check", spec, "--format", "csv")
    assert r.exit_code == 0
    assert r.stdout.splitlines()[0] == "shard_id,model,engine,engine_path,input_files,replicas,router"
    assert r.stdout.splitlines()[3].startswith("2,qwen3-next-80b,align,")
    r = _run("pipeline", "run", spec, "--scheduler", "sync", "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["name"] == "demo" and doc["landed"] is False  # already landed by the fixture


def test_query_formats(db):
    r = _run("query", "shards", "--db", db)
    assert r.exit_code == 0, r.output
    assert "llama-3.1-8b" in r.stdout and "qwen3-next-80b" in r.stdout and "3 rows" in r.stdout
    r = _run("query", "latency", "--db", db, "--format", "csv")
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [(x["model"], x["engine"]) for x in rows] == [("llama-3.1-8b", "base"), ("llama-3.1-8b", "nocache"),
                                                         ("qwen3-next-80b", "align")]
    assert float(rows[0]["ttft_p50_s"]) > 0
    r = _run("query", "slo", "--db", db, "--param", "ttft_s=1e9", "--param", "tpot_s=1e9", "--format", "json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert len(data) == 3 and all(d["attainment"] == 1.0 for d in data)


def test_query_sql_with_bound_parameters(db):
    r = _run("query", "--db", db, "--sql", "SELECT count(*) AS n FROM requests WHERE prompt_tokens > $p",
             "--param", "p=1000", "--format", "json")
    assert r.exit_code == 0, r.output
    n = json.loads(r.stdout)[0]["n"]
    assert 0 < n < 4300
    r = _run("query", "--db", db, "--sql", "SELECT count(*) AS n FROM runs WHERE name = $name",
             "--param", "name=demo' OR '1'='1", "--format", "csv")
    assert r.exit_code == 0 and r.stdout.splitlines() == ["n", "0"]


def test_query_database_from_the_environment(db):
    r = _run("query", "runs", "--format", "csv", env={"AISIM_DB": str(db)})
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[1].startswith("1,demo,")


@pytest.mark.parametrize("args,message", [
    (["nosuch"], "unknown query 'nosuch'"),
    (["slo", "--param", "ttft=1"], "query 'slo' has no parameter 'ttft'"),
    (["slo", "--param", "ttft_s"], "expected KEY=VALUE, got 'ttft_s'"),
    (["slo", "--param", "ttft_s=1", "--param", "ttft_s=2"], "ttft_s is given twice"),
    (["slo", "--param", "ttft_s=soon"], "must be DOUBLE"),
    (["--sql", "SELECT * FROM nowhere"], "the SQL failed"),
    (["shards", "--sql", "SELECT 1"], "not both"),
    ([], "give a query NAME"),
])
def test_query_errors(db, args, message):
    r = _run("query", "--db", db, *args)
    assert r.exit_code == 2, r.output
    assert message in r.stderr


def test_query_needs_an_existing_database(tmp_path):
    r = _run("query", "runs", "--db", tmp_path / "none.duckdb")
    assert r.exit_code == 2 and "no database at" in r.stderr
    r = _run("query", "runs")
    assert r.exit_code == 2 and "--db" in r.stderr


def test_query_list():
    r = _run("query", "--list")
    assert r.exit_code == 0
    for name in ("latency", "slo", "prefix_reuse", "kv_timeline", "compare", "runs", "shards"):
        assert name in r.stdout
    assert "ttft_s" in r.stdout


def test_help_lists_the_commands():
    r = _run("--help")
    assert r.exit_code == 0 and "pipeline" in r.stdout and "query" in r.stdout
    r = _run("pipeline", "run", "--help")
    assert r.exit_code == 0 and "--scheduler" in r.stdout and "--force" in r.stdout


def test_query_on_a_database_being_written_is_a_clear_error(db):
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('ready', flush=True); "
                               "sys.stdin.read()", str(db)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        r = _run("query", "runs", "--db", db)
        assert r.exit_code == 2
        assert f"database {db} is in use by process {holder.pid}" in r.stderr and "Try again" in r.stderr
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()
