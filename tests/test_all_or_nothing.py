"""All or nothing: a run killed at any write step leaves every output it was asked for, or none.

A fault is injected at the k-th write step of a command (:func:`aisim.files.inject_fault`: a
temporary file made, written or synced, a rename, a database commit, a staged file), for k = 1,
2, ... until a run has fewer steps than k and completes, as SQLite's tests fail every I/O in turn.
The fault is an ``OSError`` (a full disk) or a ``KeyboardInterrupt`` (Ctrl-C at that step).
After each faulted run: the command failed with one line, the files are all there with the bytes a
clean run writes or none is, no temporary file is left, and the database holds what it held before
or the whole run.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import duckdb
import pytest
from click.testing import CliRunner

from aisim import files
from aisim.cli import main

from test_pipeline_common import dump

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")
ENGINE = os.path.join(EXAMPLES, "engine.json")
FAULTS = [OSError, KeyboardInterrupt]


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _every_step(attempt, check, exc=None, limit=400):
    """Run ``attempt(k)`` with a fault at step k = 1, 2, ... and ``check(k, result)`` each failed one;
    returns (the completed run's result, how many steps it had).  ``exc`` None: an ``OSError`` at odd
    steps and a ``KeyboardInterrupt`` at even ones (one loop covers both at half the cost)."""
    for k in range(1, limit):
        kind = exc or FAULTS[(k - 1) % 2]
        with files.inject_fault(k, kind) as fault:
            result = attempt(k)
        if fault.fired is None:
            return result, fault.steps
        assert result.exit_code == (2 if kind is OSError else 130), (k, fault.fired, result.output)
        # One error line, last (a pipeline's progress lines come before it).
        lines = result.stderr.strip().splitlines()
        assert lines[-1].startswith("error: ") and sum(x.startswith("error: ") for x in lines) == 1, result.stderr
        check(k, result)
    raise AssertionError(f"still faulting after {limit} steps")


def _leftovers(root):
    """Temporary names anywhere under ``root``."""
    return [os.path.join(d, f) for d, dirs, fs in os.walk(root) for f in fs + dirs
            if f.startswith(files.TEMP_PREFIX) or ".partial-" in f]


def _contents(root, names):
    out = {}
    for n in names:
        path = os.path.join(root, n)
        if os.path.exists(path):
            with open(path, "rb") as fh:
                out[n] = fh.read()
        else:
            out[n] = None
    return out


# ---------------------------------------------------------------- replay: a folder and a decision log


@pytest.mark.parametrize("exc", FAULTS)
def test_replay_writes_its_folder_and_log_together_or_not_at_all(tmp_path, exc):
    with open(os.path.join(EXAMPLES, "trace.jsonl"), encoding="utf-8") as fh:
        (tmp_path / "t.jsonl").write_text("".join(fh.readlines()[:40]))
    names = ["out/requests.parquet", "out/steps.parquet", "out/summary.json", "log.jsonl"]

    def attempt(k):
        d = tmp_path / f"k{k}"
        d.mkdir()
        return _run("replay", "--engine", ENGINE, "--trace", tmp_path / "t.jsonl", "--out", d / "out",
                    "--decision-log", d / "log.jsonl", "--format", "json")

    failed = []
    result, steps = _every_step(attempt, lambda k, r: failed.append(k), exc)
    assert result.exit_code == 0, result.output
    done = _contents(tmp_path / f"k{steps + 1}", names)
    assert all(v is not None for v in done.values())
    assert len(failed) == steps >= 12  # 3 staged files, the log's create, write, sync; 4 renames ...
    for k in failed:
        d = tmp_path / f"k{k}"
        got = _contents(d, names)
        assert got == dict.fromkeys(names) or got == done, k
        assert _leftovers(d) == [] and os.listdir(d) in ([], ["log.jsonl", "out"], ["out", "log.jsonl"]), k


def test_a_deployment_replay_writes_its_folder_and_every_replica_log_together(tmp_path):
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"request_id": f"r{i}", "prompt_len": 64 + i,
                                                          "max_tokens": 8, "arrival_time": 0.01 * i}) + "\n"
                                              for i in range(12)))
    (tmp_path / "d.toml").write_text("[deployment]\nreplicas = 2\n")
    names = ["out/requests.parquet", "out/steps.parquet", "out/summary.json", "log.replica0.jsonl",
             "log.replica1.jsonl"]

    def attempt(k):
        d = tmp_path / f"k{k}"
        d.mkdir()
        return _run("replay", "--engine", ENGINE, "--trace", tmp_path / "t.jsonl", "--deployment",
                    tmp_path / "d.toml", "--out", d / "out", "--decision-log", d / "log.jsonl")

    failed = []
    result, steps = _every_step(attempt, lambda k, r: failed.append(k))
    assert result.exit_code == 0, result.output
    done = _contents(tmp_path / f"k{steps + 1}", names)
    assert all(v is not None for v in done.values()) and len(failed) == steps >= 15
    for k in failed:
        got = _contents(tmp_path / f"k{k}", names)
        assert got == dict.fromkeys(names) or got == done, k
        assert _leftovers(tmp_path / f"k{k}") == [], k


# ---------------------------------------------------------------- the pipeline: staging and landing


def _spec_file(tmp_path, name, engine):
    trace = tmp_path / "trace.jsonl"
    with open(os.path.join(EXAMPLES, "trace.jsonl"), encoding="utf-8") as fh:
        trace.write_text("".join(fh.readlines()[:200]))
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\ndatabase = "db.duckdb"\n[[sources]]\nname = "s"\npaths = ["{trace}"]\n'
                    f'format = "oracle"\nmodel = "m"\n[[deployments]]\nmodel = "m"\nengines = {{ e = "{engine}" }}\n')
    return path


def test_the_pipeline_lands_a_run_whole_or_leaves_the_database_as_it_was(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    first = _spec_file(base, "first", ENGINE)
    assert _run("pipeline", "run", first, "--scheduler", "sync").exit_code == 0
    before = dump(base / "db.duckdb")
    second = _spec_file(base, "second", os.path.join(EXAMPLES, "engine-nocache.json"))
    states = {}

    def attempt(k):
        d = tmp_path / f"k{k}"
        d.mkdir()
        shutil.copy(base / "db.duckdb", d / "db.duckdb")
        return _run("pipeline", "run", second, "--db", d / "db.duckdb", "--scheduler", "sync")

    def check(k, r):
        d = tmp_path / f"k{k}"
        states[k] = dump(d / "db.duckdb")
        assert _leftovers(d) == [], k
        # What stays is a whole staged run that `aisim pipeline land` can land (the message says how), or nothing.
        staging = d / "db.duckdb.staging"
        if staging.exists():
            assert "aisim pipeline land" in r.stderr, (k, r.stderr)
            (run_id,) = os.listdir(staging)
            assert (staging / run_id / "run.json").exists()
            assert states[k] == before

    result, steps = _every_step(attempt, check)
    assert result.exit_code == 0, result.output
    after = dump(tmp_path / f"k{steps + 1}" / "db.duckdb")
    assert after != before and len(after["runs"]) == 2
    assert all(s in (before, after) for s in states.values())
    assert steps > 5


# ---------------------------------------------------------------- sweep: runs, ranking and the best file


def test_a_sweep_lands_its_runs_ranking_and_best_file_together(tmp_path):
    trace = [{"request_id": f"r{i}", "prompt_len": 100, "max_tokens": 10, "arrival_step": 0} for i in range(6)]
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trace))
    (tmp_path / "base.json").write_text(json.dumps({"num_gpu_blocks": 400, "max_model_len": 1024,
                                                    "max_num_batched_tokens": 2048, "max_num_seqs": 8}))
    spec = ('name = "s"\ndatabase = "s.duckdb"\nmodel = "m"\nbase = "{root}/base.json"\nbest = "best.toml"\n'
            '[trace]\npaths = ["{root}/trace.jsonl"]\nformat = "oracle"\n[grid]\nmax_num_seqs = [8]\n'
            '[slo]\nttft_s = 0.5\n')
    # An existing database with another sweep's rows: a failed sweep leaves them exactly as they were.
    (tmp_path / "seed").mkdir()
    (tmp_path / "seed" / "sweep.toml").write_text(spec.format(root=tmp_path).replace("[8]", "[4]"))
    assert _run("sweep", tmp_path / "seed" / "sweep.toml", "--scheduler", "sync").exit_code == 0
    before = _sweep_dump(tmp_path / "seed" / "s.duckdb")
    states = {}

    def attempt(k):
        d = tmp_path / f"k{k}"
        d.mkdir()
        if k % 2:  # odd k: into the existing database; even k: a database the sweep creates
            shutil.copy(tmp_path / "seed" / "s.duckdb", d / "s.duckdb")
        (d / "sweep.toml").write_text(spec.format(root=tmp_path))
        return _run("sweep", d / "sweep.toml", "--scheduler", "sync")

    def check(k, r):
        d = tmp_path / f"k{k}"
        assert _leftovers(d) == [] and not (d / "best.toml").exists(), k
        assert not (d / "s.duckdb.staging").exists() or "aisim pipeline land" in r.stderr, (k, r.stderr)
        if k % 2:
            states[k] = _sweep_dump(d / "s.duckdb")
        else:
            assert not (d / "s.duckdb").exists() or _sweep_dump(d / "s.duckdb")["runs"] in ([], None), k

    result, steps = _every_step(attempt, check)
    assert result.exit_code == 0, result.output
    k = steps + 1
    if k % 2 == 0:  # the completed run must have started from the existing database for the comparison
        assert _run("sweep", tmp_path / f"k{k}" / "sweep.toml", "--scheduler", "sync").exit_code == 0
    assert all(s == before for s in states.values()), [k for k, s in states.items() if s != before]
    assert steps > 10


def _sweep_dump(db):
    with duckdb.connect(str(db), read_only=True) as con:
        tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()]
        out = {t: sorted(map(repr, con.execute(f"SELECT * EXCLUDE (wall_s, started_at, scheduler, workers) "
                                               f"FROM {t}" if t == "runs" else f"SELECT * FROM {t}").fetchall()))
               for t in ("runs", "shards", "summaries", "requests", "sweep_candidates") if t in tables}
    return out


# ---------------------------------------------------------------- capacity: the points land in one commit


def test_capacity_lands_every_point_or_none(tmp_path):
    lines = [{"request_id": f"r{i}", "prompt_len": 16, "max_tokens": 10, "arrival_time": float(i)} for i in range(8)]
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "engine.json").write_text(json.dumps(
        {"model": "m", "block_size": 16, "num_gpu_blocks": 1024, "max_model_len": 4096, "max_num_seqs": 1,
         "max_num_batched_tokens": 2048, "enable_prefix_caching": False,
         "time_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 0.0, "per_req_s": 0.0}}))
    spec = ('name = "{name}"\ndatabase = "{db}"\nengine = "engine.json"\n[trace]\npath = "trace.jsonl"\n'
            'format = "oracle"\n[slo]\nttft_s = 0.05\nattainment = 1.0\n[rate]\nby = "rate_scale"\nmax_points = 6\n')
    (tmp_path / "first.toml").write_text(spec.format(name="first", db="seed.duckdb"))
    assert _run("capacity", tmp_path / "first.toml").exit_code == 0

    def points(db):
        with duckdb.connect(str(db), read_only=True) as con:
            return con.execute("SELECT search_id, point, rate_req_s FROM capacity_points ORDER BY ALL").fetchall()

    before = points(tmp_path / "seed.duckdb")
    for exc in FAULTS:
        failed = []

        def attempt(k):
            shutil.copy(tmp_path / "seed.duckdb", tmp_path / f"k{k}.duckdb")
            (tmp_path / "second.toml").write_text(spec.format(name="second", db=f"k{k}.duckdb"))
            return _run("capacity", tmp_path / "second.toml")

        result, steps = _every_step(attempt, lambda k, r: failed.append(points(tmp_path / f"k{k}.duckdb")), exc)
        assert result.exit_code == 0 and steps == 1  # one commit
        assert failed == [before] and len(points(tmp_path / f"k{steps + 1}.duckdb")) > len(before)


# ---------------------------------------------------------------- a real SIGTERM


def test_sigterm_mid_replay_exits_143_and_leaves_nothing(tmp_path):
    r = _run("trace", "synth", "-n", 60000, "--rate", "200", "--prompt", "fixed:256", "--output", "fixed:64",
             "--out", tmp_path / "big.parquet")
    assert r.exit_code == 0, r.output
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "aisim.cli", "replay", "--engine", ENGINE, "--trace",
                             str(tmp_path / "big.parquet"), "--out", str(out), "--decision-log",
                             str(tmp_path / "log.jsonl")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": REPO})
    time.sleep(2.0)  # past start-up, into the replay or the writing
    assert proc.poll() is None, "the replay finished before it could be stopped; make it longer"
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert stderr.decode() == "error: terminated\n" and stdout == b""
    assert sorted(os.listdir(tmp_path)) == ["big.parquet"]


def test_sigterm_while_the_local_cluster_starts_closes_it_then_stops(monkeypatch):
    # A LocalCluster stopped half built cannot be closed (Dask's exit hook then prints a traceback):
    # SIGTERM waits for the start to end, the cluster is closed, and the command's handler stops it.
    import distributed

    from aisim.pipeline import graph

    events = []

    class Cluster:
        def __init__(self, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the workers start
            events.append("started")

        def close(self):
            events.append("closed")

    monkeypatch.setattr(distributed, "LocalCluster", Cluster)
    before = signal.getsignal(signal.SIGTERM)
    files.install_signal_handlers()
    try:
        with pytest.raises(files.Terminated):
            graph._execute_distributed({}, [], [], {}, None, "local", 1, 0)
        assert events == ["started", "closed"]
        assert files.interrupt_status() == (143, "terminated")
        assert signal.getsignal(signal.SIGTERM) is files._on_sigterm  # the command's handler is back
    finally:
        signal.signal(signal.SIGTERM, before)
