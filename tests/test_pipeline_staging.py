"""Staged results: workers write Parquet, the driver lands from it; failed landings stay staged.

Every run here uses the synchronous scheduler on the bundled demo (a second or
two); the one subprocess test sends a real Ctrl-C in the middle of a landing.
"""

import os
import signal
import subprocess
import sys

import duckdb
import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.errors import PipelineError
from aisim.pipeline import landing
from aisim.pipeline.run import land_run, run_pipeline
from aisim.pipeline.spec import spec_from_dict

from test_pipeline_common import REPO, demo_dict, demo_spec, dump


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The demo landed the ordinary way: a database in tables, staged beside it."""
    db = tmp_path_factory.mktemp("ref") / "ref.duckdb"
    report = run_pipeline(demo_spec(db), scheduler="sync")
    assert not os.path.exists(f"{db}.staging")  # staging is removed once landed
    return report, dump(db)


def test_an_fsspec_url_stages_the_same_rows(tmp_path, reference):
    import fsspec

    report, want = reference
    db = tmp_path / "m.duckdb"
    got = run_pipeline(demo_spec(db), scheduler="sync", staging="memory://aisim-test/stage")
    assert got.landed and got.run_id == report.run_id and dump(db) == want
    assert fsspec.filesystem("memory").ls("/aisim-test/stage") == []


@pytest.mark.parametrize("location,message", [
    ("bogus://bucket/stage", "cannot use the staging location bogus://bucket/stage: Protocol not known: bogus"),
    ("s3://bucket/stage", "cannot use the staging location s3://bucket/stage: Install s3fs to access S3 "
                          "(pip install 'aisim[s3]')"),
])
def test_a_staging_location_that_cannot_be_used_fails_before_any_replay(tmp_path, location, message):
    pytest.importorskip("fsspec")
    if location.startswith("s3") and _has("s3fs"):
        pytest.skip("s3fs is installed: an s3 URL is usable")
    raw = demo_dict(tmp_path / "d.duckdb", landing={"staging": location})
    r = _run("pipeline", "run", _toml(tmp_path, raw), "--scheduler", "sync", "--progress", "none")
    assert r.exit_code == 2 and r.stderr == f"error: {message}\n"
    assert os.listdir(tmp_path) == ["spec.toml"]


def test_an_unwritable_staging_directory_fails_before_any_replay(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PipelineError) as err:
        run_pipeline(demo_spec(tmp_path / "d.duckdb"), scheduler="sync", staging=str(blocker / "stage"))
    assert str(err.value).startswith(f"cannot write to the staging location {blocker / 'stage'}: ")
    assert sorted(os.listdir(tmp_path)) == ["file"]


def test_an_unwritable_database_fails_before_any_replay(tmp_path):
    db = tmp_path / "d.duckdb"
    db.write_text("not a database")
    r = _run("pipeline", "run", _toml(tmp_path, demo_dict(db)), "--scheduler", "sync", "--progress", "none")
    assert r.exit_code == 2 and r.stderr == f"error: {db} is not a DuckDB database\n"
    assert not os.path.exists(f"{db}.staging")


def test_a_database_that_cannot_be_written_fails_before_any_replay(tmp_path, monkeypatch):
    db = tmp_path / "d.duckdb"
    duckdb.connect(str(db)).close()
    real = os.access
    # the tests may run as root, whom permission bits do not stop: the file answers as read-only
    monkeypatch.setattr(landing.os, "access", lambda p, mode: False if str(p) == str(db) else real(p, mode))
    r = _run("pipeline", "run", _toml(tmp_path, demo_dict(db)), "--scheduler", "sync", "--progress", "none")
    assert r.exit_code == 2 and r.stderr == f"error: database {db} is not writable\n"
    assert not os.path.exists(f"{db}.staging")


def test_land_of_an_unknown_run_names_the_staged_runs(tmp_path):
    db = tmp_path / "d.duckdb"
    r = _run("pipeline", "land", "0123456789abcdef", "--db", db)
    assert r.exit_code == 2
    assert r.stderr == (f"error: no staged run 0123456789abcdef in {db}.staging; nothing is staged there\n")
    (tmp_path / "d.duckdb.staging" / "feedfacefeedface").mkdir(parents=True)
    (tmp_path / "d.duckdb.staging" / "feedfacefeedface" / "run.json").write_text("{}")
    r = _run("pipeline", "land", "0123456789abcdef", "--db", db)
    assert r.exit_code == 2 and r.stderr.endswith("; staged runs there: feedfacefeedface\n")
    r = _run("pipeline", "land", "0123456789abcdef")
    assert r.exit_code == 2 and r.stderr == "error: give --db (the database the run lands in), --spec or --staging\n"
    assert not db.exists()


def test_a_locked_database_leaves_the_run_staged_and_land_lands_it(tmp_path):
    db = tmp_path / "d.duckdb"
    spec, report, want = _toml_reference(tmp_path, demo_dict(db))
    duckdb.connect(str(db)).close()
    holder = _hold(db)
    try:
        r = _run("pipeline", "run", spec, "--scheduler", "sync", "--progress", "none", "--lock-timeout", "0.2")
    finally:
        _release(holder)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert r.stderr.endswith(f"one writer at a time. Wait for it to finish, or use another --db; the results stay "
                             f"staged in {db}.staging{os.sep}{report.run_id}: aisim pipeline land {report.run_id} "
                             f"--db {db}\n")
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM information_schema.tables").fetchone() == (0,)  # as it was: empty
    con.close()
    r = _run("pipeline", "land", report.run_id, "--db", db, "--format", "json")
    assert r.exit_code == 0, r.output
    assert dump(db) == want and not os.path.exists(f"{db}.staging")
    again = _run("pipeline", "land", report.run_id, "--db", db)
    assert again.exit_code == 2 and f"no staged run {report.run_id}" in again.stderr


def test_keep_parquet_lands_views_over_the_files(tmp_path, reference):
    report, want = reference
    db = tmp_path / "p.duckdb"
    spec = demo_spec(db, landing={"keep_parquet": True})
    got = run_pipeline(spec, scheduler="sync")
    assert got.landed and dump(db) == want
    store = tmp_path / "p.duckdb.parquet" / report.run_id / "shards"
    assert sorted(os.listdir(store)) == ["00000", "00001", "00002"]
    con = duckdb.connect(str(db), read_only=True)
    try:
        kinds = dict(con.execute("SELECT table_name, table_type FROM information_schema.tables").fetchall())
        assert kinds["requests"] == kinds["steps"] == "VIEW" and kinds["runs"] == "BASE TABLE"
        assert con.execute("SELECT count(*) FROM latency_percentiles").fetchone()[0] > 0
    finally:
        con.close()
    # A second run lands beside it; the views cover both.
    other = run_pipeline(demo_spec(db, landing={"keep_parquet": True}, window={"end_step": 2000, "end_s": 150.0}),
                         scheduler="sync")
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT count(DISTINCT run_id) FROM requests").fetchone()[0] == 2
        assert con.execute("SELECT count(*) FROM requests").fetchone()[0] == 4300 + other.rows["requests"]
    finally:
        con.close()
    # A database keeps its rows one way.
    with pytest.raises(PipelineError, match="keeps requests and steps as Parquet files"):
        run_pipeline(demo_spec(db, window={"end_step": 1000, "end_s": 75.0}), scheduler="sync")
    tables = tmp_path / "t.duckdb"
    run_pipeline(demo_spec(tables), scheduler="sync")
    with pytest.raises(PipelineError, match="keeps requests and steps in tables"):
        run_pipeline(demo_spec(tables, landing={"keep_parquet": True}, window={"end_step": 1000, "end_s": 75.0}),
                     scheduler="sync")


def test_landing_options_are_checked(tmp_path):
    from aisim.errors import SpecError

    for landing_opts, message in (
            ({"stagin": "x"}, "unknown key 'landing.stagin'"),
            ({"keep_parquet": "yes"}, "'landing.keep_parquet' in s.toml must be true or false, got 'yes'"),
            ({"lock_timeout_s": -1}, "'landing.lock_timeout_s' in s.toml must be a non-negative number, got -1"),
            ({"parquet_dir": "p"}, "'landing.parquet_dir' in s.toml applies with 'landing.keep_parquet = true'"),
            ({"staging": ""}, "'landing.staging' in s.toml must be a non-empty path or URL")):
        with pytest.raises(SpecError) as err:
            spec_from_dict(demo_dict(tmp_path / "d.duckdb", landing=landing_opts), source="s.toml")
        assert message in str(err.value)
    spec = spec_from_dict(demo_dict(tmp_path / "d.duckdb", landing={"staging": "st", "lock_timeout_s": 5}),
                          source="s.toml", base_dir=str(tmp_path))
    assert spec.landing.staging == str(tmp_path / "st") and spec.landing.lock_timeout_s == 5.0
    # Landing options do not change what a run computes: same run key.
    from aisim.pipeline.runkey import resolve_inputs, run_key

    plain = spec_from_dict(demo_dict(tmp_path / "d.duckdb"), source="s.toml", base_dir=str(tmp_path))
    assert run_key(spec, resolve_inputs(spec)) == run_key(plain, resolve_inputs(plain))


def test_reclaim_truncates_what_a_rolled_back_insert_left(tmp_path):
    db = str(tmp_path / "r.duckdb")
    con = duckdb.connect(db)
    con.execute("CREATE TABLE t (x BIGINT, y VARCHAR)")
    con.execute("INSERT INTO t SELECT range, 'row ' || range FROM range(200000)")
    con.execute("CHECKPOINT")
    before = os.path.getsize(db)
    con.execute("BEGIN")
    con.execute("INSERT INTO t SELECT range, 'row ' || range FROM range(3000000)")
    con.execute("ROLLBACK")
    grown = os.path.getsize(db)
    assert grown > before + 10_000_000  # DuckDB keeps the rolled-back blocks in the file
    assert landing.reclaim(con, db) == grown - before
    assert os.path.getsize(db) == before and con.execute("SELECT count(*) FROM t").fetchone() == (200000,)
    assert landing.reclaim(con, db) == 0
    con.close()


def test_ctrl_c_during_landing_exits_130_and_leaves_the_database_as_it_was(tmp_path):
    """A real SIGINT while the landing transaction writes a large insert."""
    db = tmp_path / "c.duckdb"
    spec, report, want = _toml_reference(tmp_path, demo_dict(db))
    run_pipeline(spec, scheduler="sync")
    size = os.path.getsize(db)
    # The child lands through a landing whose steps insert first writes a lot (about 100 MB), slowly
    # enough to be interrupted in the middle.
    child = f"""
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # a test runner may start us with SIGINT ignored
from aisim.pipeline import landing
real = landing.insert_parquet
def slow(con, table, paths):
    n = real(con, table, paths)
    if table == "steps":
        print("landing", flush=True)
        con.execute("INSERT INTO steps SELECT s.* FROM steps s, range(100000)")
    return n
landing.insert_parquet = slow
from aisim.cli import main
sys.argv = ["aisim", "pipeline", "run", {str(spec)!r}, "--scheduler", "sync", "--force", "--progress", "none"]
main()
"""
    proc = subprocess.Popen([sys.executable, "-c", child], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "landing\n"
        import time

        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert err == (f"error: interrupted while landing; nothing was landed, and the results stay staged in "
                   f"{db}.staging{os.sep}{report.run_id}: aisim pipeline land {report.run_id} --db {db}\n")
    assert dump(db) == want
    assert os.path.getsize(db) <= size + 262144  # the interrupted insert's space is given back
    assert land_run(report.run_id, database=str(db), force=True).landed and dump(db) == want


# ---------------------------------------------------------------------------- helpers


def _has(module) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _toml(tmp_path, raw) -> str:
    import tomli_w

    raw = dict(raw)
    path = tmp_path / "spec.toml"
    path.write_text(tomli_w.dumps(raw))
    return str(path)


def _toml_reference(tmp_path, raw):
    """``raw`` as a spec file, and what it lands in a database of its own: (spec, report, dump)."""
    spec = _toml(tmp_path, raw)
    ref = tmp_path / "reference.duckdb"
    report = run_pipeline(spec, scheduler="sync", database=str(ref))
    return spec, report, dump(ref)


def _hold(db):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('ready', flush=True); "
                               "sys.stdin.read()", str(db)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "ready"
    return holder


def _release(holder):
    holder.stdin.close()
    holder.wait(timeout=30)
    holder.stdout.close()

