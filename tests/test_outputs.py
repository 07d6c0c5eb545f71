"""Every command's file outputs go through aisim.files: never over an input, streams written as streams.

For each command that writes a file: an output that is one of its inputs is refused (exit 2, one
line, the input untouched), a FIFO is written as a stream (it stays a FIFO, and a reader gets the
same bytes the regular file gets), and ``-`` writes to standard output.
"""

import json
import os
import stat
import threading

import duckdb
import pytest
from click.testing import CliRunner

from aisim import files
from aisim.cli import main
from aisim.errors import OutputError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")
ENGINE = os.path.join(EXAMPLES, "engine.json")


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _trace(tmp_path, n=30):
    with open(os.path.join(EXAMPLES, "trace.jsonl"), encoding="utf-8") as fh:
        lines = fh.readlines()[:n]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(lines))
    return path


class Fifo:
    """A FIFO at ``path`` with a reader thread collecting what is written to it."""

    def __init__(self, path):
        self.path = path
        os.mkfifo(path)
        self.data = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        with open(self.path, "rb") as fh:
            self.data = fh.read()

    def read(self) -> bytes:
        self.thread.join(30)
        assert not self.thread.is_alive()
        assert stat.S_ISFIFO(os.stat(self.path).st_mode)  # never renamed over
        return self.data


def _no_temporaries(*dirs):
    for d in dirs:
        left = [f for f in os.listdir(d) if f.startswith(files.TEMP_PREFIX)]
        assert not left, left


# ---------------------------------------------------------------- the door itself


def test_an_output_that_is_an_input_is_refused_by_identity_not_name(tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text("x\n")
    os.link(a, tmp_path / "hard.jsonl")
    os.symlink(a, tmp_path / "soft.jsonl")
    for other in ("hard.jsonl", "soft.jsonl", "./a.jsonl"):
        with pytest.raises(OutputError) as err:
            files.check_outputs({"--log": str(tmp_path / other)}, {"--trace": str(a)})
        assert str(err.value) == (f"--log {tmp_path / other} is --trace {a}, an input of this run; aisim never "
                                  "writes over its inputs")
    with pytest.raises(OutputError, match="are the same file"):
        files.check_outputs({"--a": str(tmp_path / "o"), "--b": str(tmp_path / "o")})
    files.check_outputs({"--log": str(tmp_path / "new.jsonl")}, {"--trace": str(a)})  # another file is fine
    assert a.read_text() == "x\n"


def test_a_symlinked_output_replaces_its_target_and_keeps_the_link(tmp_path):
    (tmp_path / "target.txt").write_text("old")
    os.symlink(tmp_path / "target.txt", tmp_path / "link.txt")
    files.write_text(tmp_path / "link.txt", "new")
    assert os.path.islink(tmp_path / "link.txt") and (tmp_path / "target.txt").read_text() == "new"
    _no_temporaries(tmp_path)


def test_streams_by_name_and_by_kind(tmp_path):
    os.mkfifo(tmp_path / "f")
    assert files.is_stream("-") and files.is_stream("/dev/stdout") and files.is_stream("/dev/null")
    assert files.is_stream(tmp_path / "f") and files.is_stream("/dev/fd/1")
    assert not files.is_stream(tmp_path / "missing.txt") and not files.is_stream(ENGINE)


def test_a_failed_commit_puts_back_what_it_replaced(tmp_path):
    # Three outputs, two of them over existing files; the third rename fails: the first two are put back.
    for name in ("a", "b"):
        (tmp_path / name).write_text(f"old {name}")
    with pytest.raises(OSError, match="injected fault"):
        with files.inject_fault(12), files.outputs():  # 3 x (create, write, fsync) + rename a, b, then c
            for name in ("a", "b", "c"):
                files.write_text(tmp_path / name, f"new {name}")
    assert (tmp_path / "a").read_text() == "old a" and (tmp_path / "b").read_text() == "old b"
    assert not (tmp_path / "c").exists()
    _no_temporaries(tmp_path)
    with files.outputs():
        for name in ("a", "b", "c"):
            files.write_text(tmp_path / name, f"new {name}")
    assert [(tmp_path / n).read_text() for n in "abc"] == ["new a", "new b", "new c"]
    _no_temporaries(tmp_path)


# ---------------------------------------------------------------- aisim replay


def test_replay_refuses_to_write_over_its_trace(tmp_path):
    trace = _trace(tmp_path)
    before = trace.read_bytes()
    r = _run("replay", "--engine", ENGINE, "--trace", trace, "--decision-log", trace)
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr == (f"error: --decision-log {trace} is --trace {trace}, an input of this run; aisim never writes "
                        "over its inputs\n")
    assert trace.read_bytes() == before
    # The engine file through another name (a hard link) is refused too, and --out's files are outputs as well.
    os.link(ENGINE, tmp_path / "e.json")
    r = _run("replay", "--engine", tmp_path / "e.json", "--trace", trace, "--decision-log", ENGINE)
    assert r.exit_code == 2 and "is --engine" in r.stderr
    r = _run("replay", "--engine", ENGINE, "--trace", trace, "--out", tmp_path / "o",
             "--decision-log", tmp_path / "o" / "summary.json")
    assert r.exit_code == 2 and r.stderr.startswith("error: --decision-log") and "same file" in r.stderr
    assert not (tmp_path / "o").exists()
    r = _run("replay", "--engine", ENGINE, "--trace", trace, "--out", "-")  # a folder of files is no stream
    assert r.exit_code == 2 and "'--out': - is a stream; this output is a directory of files" in r.stderr


def test_replay_writes_a_fifo_as_a_stream_and_dash_to_stdout(tmp_path):
    trace = _trace(tmp_path)
    r = _run("replay", "--engine", ENGINE, "--trace", trace, "--decision-log", tmp_path / "log.jsonl")
    assert r.exit_code == 0, r.output
    expected = (tmp_path / "log.jsonl").read_bytes()
    assert expected.count(b"\n") > 30
    fifo = Fifo(tmp_path / "fifo")
    r = _run("replay", "--engine", ENGINE, "--trace", trace, "--decision-log", fifo.path, "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert fifo.read() == expected
    assert sorted(os.listdir(tmp_path / "out")) == ["requests.parquet", "steps.parquet", "summary.json"]
    r = _run("replay", "--engine", ENGINE, "--trace", trace, "--decision-log", "-", "--format", "json")
    assert r.exit_code == 0, r.output
    assert r.stdout_bytes == expected  # the log alone on stdout; the summary went to stderr
    assert json.loads(r.stderr.split("\ndecision log written")[0])["requests"] == 30
    _no_temporaries(tmp_path)


def test_replay_through_a_deployment_writes_every_replica_to_one_stream(tmp_path):
    trace = tmp_path / "timed.jsonl"  # a deployment's replicas share a clock in seconds
    trace.write_text("".join(json.dumps({"request_id": f"r{i}", "prompt_len": 64 + i, "max_tokens": 8,
                                         "arrival_time": 0.01 * i}) + "\n" for i in range(12)))
    (tmp_path / "d.toml").write_text("[deployment]\nreplicas = 2\n")
    r = _run("replay", "--engine", ENGINE, "--trace", trace, "--deployment", tmp_path / "d.toml",
             "--decision-log", tmp_path / "log.jsonl")
    assert r.exit_code == 0, r.output
    expected = (tmp_path / "log.replica0.jsonl").read_bytes() + (tmp_path / "log.replica1.jsonl").read_bytes()
    fifo = Fifo(tmp_path / "fifo")
    r = _run("replay", "--engine", ENGINE, "--trace", trace, "--deployment", tmp_path / "d.toml",
             "--decision-log", fifo.path)
    assert r.exit_code == 0, r.output
    assert fifo.read() == expected
    r = _run("replay", "--engine", ENGINE, "--trace", trace, "--deployment", tmp_path / "d.toml",
             "--decision-log", tmp_path / "d.toml")
    assert r.exit_code == 2 and "is --deployment" in r.stderr and "replicas = 2" in (tmp_path / "d.toml").read_text()


# ---------------------------------------------------------------- aisim plan

PROBE = {"vllm_version": "0.31.0", "max_model_len": 4096, "num_gpu_blocks": 1000,
         "kv_cache_groups": [{"type": "full", "block_size": 16}]}


def test_plan_refuses_its_probe_and_streams(tmp_path):
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps(PROBE))
    r = _run("plan", "--probe", probe, "--out", probe)
    assert r.exit_code == 2 and "is --probe" in r.stderr and json.loads(probe.read_text()) == PROBE
    r = _run("plan", "--probe", probe, "--out", tmp_path / "plan.toml")
    assert r.exit_code == 0, r.output
    expected = (tmp_path / "plan.toml").read_bytes()
    fifo = Fifo(tmp_path / "fifo")
    assert _run("plan", "--probe", probe, "--out", fifo.path).exit_code == 0
    assert fifo.read() == expected
    r = _run("plan", "--probe", probe, "--out", "-", "--format", "table")
    assert r.exit_code == 0 and r.stdout_bytes == expected and "plan written to -" in r.stderr


# ---------------------------------------------------------------- aisim trace synth / convert


def test_trace_conversion_refuses_its_input_and_streams(tmp_path):
    trace = _trace(tmp_path)
    before = trace.read_bytes()
    r = _run("trace", "convert", trace, "--trace-format", "oracle", "--out", trace)
    assert r.exit_code == 2 and "is PATH" in r.stderr and trace.read_bytes() == before
    r = _run("trace", "convert", trace, "--trace-format", "oracle", "--out", tmp_path / "t.parquet")
    assert r.exit_code == 0, r.output
    expected = (tmp_path / "t.parquet").read_bytes()
    fifo = Fifo(tmp_path / "fifo")
    assert _run("trace", "convert", trace, "--trace-format", "oracle", "--out", fifo.path).exit_code == 0
    assert fifo.read() == expected
    r = _run("trace", "convert", trace, "--trace-format", "oracle", "--out", "-")
    assert r.exit_code == 0 and r.stdout_bytes == expected and r.stderr.startswith("wrote 30 requests to -")


def test_trace_synth_streams(tmp_path):
    r = _run("trace", "synth", "-n", 20, "--out", tmp_path / "s.parquet")
    assert r.exit_code == 0, r.output
    expected = (tmp_path / "s.parquet").read_bytes()
    fifo = Fifo(tmp_path / "fifo")
    assert _run("trace", "synth", "-n", 20, "--out", fifo.path).exit_code == 0
    assert fifo.read() == expected
    r = _run("trace", "synth", "-n", 20, "--out", "-")
    assert r.exit_code == 0 and r.stdout_bytes == expected


# ---------------------------------------------------------------- aisim report (needs a run database)


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    from aisim.pipeline.run import run_pipeline
    from test_pipeline_common import demo_spec

    db = tmp_path_factory.mktemp("db") / "demo.duckdb"
    spec = demo_spec(db, sources=[{"name": "llama-chat", "paths": [os.path.join(EXAMPLES, "trace.jsonl")],
                                   "format": "oracle", "model": "llama-3.1-8b"}],
                     deployments=[{"model": "llama-3.1-8b", "engines": {"base": ENGINE}}])
    run_pipeline(spec, scheduler="sync")
    return db


def test_report_refuses_its_database_and_streams(tmp_path, database):
    before = database.read_bytes()
    r = _run("report", "--db", database, "--out", database)
    assert r.exit_code == 2 and "is --db" in r.stderr and database.read_bytes() == before
    r = _run("report", "--db", database, "--out", tmp_path / "r.html")
    assert r.exit_code == 0, r.output
    expected = (tmp_path / "r.html").read_bytes()
    fifo = Fifo(tmp_path / "fifo")
    assert _run("report", "--db", database, "--out", fifo.path).exit_code == 0
    assert fifo.read() == expected
    r = _run("report", "--db", database, "--out", "-")
    assert r.exit_code == 0 and r.stdout_bytes == expected and r.stderr.startswith("report of run demo")


def test_an_empty_statement_is_one_line(database):
    r = _run("query", "--db", database, "--sql", ";")
    assert r.exit_code == 2 and r.stderr == "error: the SQL holds no statement: ';'\n"


# ---------------------------------------------------------------- aisim sweep


def _sweep(tmp_path, best="best.toml"):
    trace = [{"request_id": f"r{i}", "prompt_len": 100, "max_tokens": 10, "arrival_step": 0} for i in range(4)]
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trace))
    (tmp_path / "base.json").write_text(json.dumps({"num_gpu_blocks": 400, "max_model_len": 1024,
                                                    "max_num_batched_tokens": 2048, "max_num_seqs": 8}))
    (tmp_path / "sweep.toml").write_text(
        f'name = "s"\ndatabase = "s.duckdb"\nmodel = "m"\nbase = "base.json"\nbest = "{best}"\n'
        '[trace]\npaths = ["trace.jsonl"]\nformat = "oracle"\n[grid]\nmax_num_seqs = [1, 8]\n[slo]\nttft_s = 0.5\n')
    return tmp_path / "sweep.toml"


def test_a_sweep_whose_best_is_its_base_engine_is_refused(tmp_path):
    spec = _sweep(tmp_path, best="base.json")
    before = (tmp_path / "base.json").read_bytes()
    r = _run("sweep", spec, "--scheduler", "sync")
    assert r.exit_code == 2 and r.stderr == (
        f"error: 'best' in {spec} {tmp_path / 'base.json'} is 'base' {tmp_path / 'base.json'}, an input of this "
        "run; aisim never writes over its inputs\n")
    assert (tmp_path / "base.json").read_bytes() == before and not (tmp_path / "s.duckdb").exists()
    for name in ("trace.jsonl", "sweep.toml", "s.duckdb"):
        if name == "s.duckdb":
            (tmp_path / name).write_bytes(b"")
        r = _run("sweep", _sweep(tmp_path, best=name), "--scheduler", "sync")
        assert r.exit_code == 2 and "an input of this run" in r.stderr, (name, r.stderr)


def test_a_sweep_writes_its_best_to_a_fifo_as_a_stream(tmp_path):
    spec = _sweep(tmp_path)
    assert _run("sweep", spec, "--scheduler", "sync").exit_code == 0
    expected = (tmp_path / "best.toml").read_bytes()
    fifo = Fifo(tmp_path / "fifo")
    r = _run("sweep", _sweep(tmp_path, best=str(fifo.path)), "--scheduler", "sync")
    assert r.exit_code == 0, r.output
    assert fifo.read() == expected
    _no_temporaries(tmp_path)


# ---------------------------------------------------------------- aisim capacity and the pipeline's landing


def _capacity(tmp_path, database="cap.duckdb"):
    lines = [{"request_id": f"r{i}", "prompt_len": 16, "max_tokens": 10, "arrival_time": float(i)} for i in range(8)]
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "engine.json").write_text(json.dumps(
        {"model": "m", "block_size": 16, "num_gpu_blocks": 1024, "max_model_len": 4096, "max_num_seqs": 1,
         "max_num_batched_tokens": 2048, "enable_prefix_caching": False,
         "time_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 0.0, "per_req_s": 0.0}}))
    (tmp_path / "cap.toml").write_text(
        f'name = "c"\ndatabase = "{database}"\nengine = "engine.json"\n[trace]\npath = "trace.jsonl"\n'
        'format = "oracle"\n[slo]\nttft_s = 0.05\nattainment = 1.0\n[rate]\nby = "rate_scale"\nmax_points = 6\n')
    return tmp_path / "cap.toml"


@pytest.mark.parametrize("content", [b"", b"not a database at all\n"])
def test_capacity_refuses_a_database_that_is_no_duckdb_file_up_front(tmp_path, content, monkeypatch):
    import aisim.capacity.search

    def never(*args, **kwargs):
        raise AssertionError("searched before the database was checked")

    monkeypatch.setattr(aisim.capacity.search, "highest_rate", never)
    spec = _capacity(tmp_path)
    (tmp_path / "cap.duckdb").write_bytes(content)
    r = _run("capacity", spec)
    assert r.exit_code == 2 and r.stderr == f"error: {tmp_path / 'cap.duckdb'} is not a DuckDB database\n"
    assert (tmp_path / "cap.duckdb").read_bytes() == content
    r = _run("capacity", _capacity(tmp_path, database="trace.jsonl"))
    assert r.exit_code == 2 and r.stderr == f"error: {tmp_path / 'trace.jsonl'} is not a DuckDB database\n"
    os.mkfifo(tmp_path / "fifo")  # never opened: reading its header would wait for a writer
    r = _run("capacity", _capacity(tmp_path, database="fifo"))
    assert r.exit_code == 2 and r.stderr == f"error: database {tmp_path / 'fifo'} is not a regular file\n"


def test_no_op_pipeline_runs_leave_no_staging_behind(tmp_path):
    from aisim.errors import SpecError
    from aisim.pipeline.run import run_pipeline
    from test_pipeline_common import demo_spec

    db = tmp_path / "d.duckdb"
    spec = demo_spec(db, sources=[{"name": "none", "paths": [str(tmp_path / "*.nothing")], "format": "oracle",
                                   "model": "llama-3.1-8b"}],
                     deployments=[{"model": "llama-3.1-8b", "engines": {"base": ENGINE}}])
    with pytest.raises(SpecError, match="no file matches"):
        run_pipeline(spec, scheduler="sync")
    assert os.listdir(tmp_path) == []
    spec = demo_spec(db, sources=[{"name": "llama-chat", "paths": [os.path.join(EXAMPLES, "trace.jsonl")],
                                   "format": "oracle", "model": "llama-3.1-8b"}],
                     deployments=[{"model": "llama-3.1-8b", "engines": {"base": ENGINE}}])
    assert run_pipeline(spec, scheduler="sync").landed
    assert sorted(os.listdir(tmp_path)) == ["d.duckdb"]
    assert not run_pipeline(spec, scheduler="sync").landed  # the same spec again: landed already
    assert sorted(os.listdir(tmp_path)) == ["d.duckdb"]
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
