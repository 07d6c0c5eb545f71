"""Pipeline runs on the synchronous scheduler: results, reruns, failures, locks, model routing."""

import json
import os
import shutil
import subprocess
import sys

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from aisim.config.engine import load_engine_config
from aisim.pipeline import landing
from aisim.errors import DatabaseLocked, PipelineError, ShardFailed
from aisim.pipeline.run import land_run, run_pipeline
from aisim.pipeline.runkey import resolve_inputs, run_key
from aisim.pipeline.spec import spec_from_dict
from aisim.replay import replay
from aisim.traces import READERS, read_trace

from test_pipeline_common import EXAMPLES, PIPELINES, TIMED, demo_dict, demo_spec, dump, multi_model_reader


def _rows(con, sql, *params):
    return con.execute(sql, list(params)).fetchall()


@pytest.fixture
def demo_db(tmp_path):
    db = tmp_path / "demo.duckdb"
    report = run_pipeline(demo_spec(db), scheduler="sync")
    return db, report


def test_demo_lands_every_table(demo_db):
    db, report = demo_db
    assert report.landed and not report.replaced and report.run_seq == 1
    assert report.scheduler == "sync" and report.workers == 1
    assert report.rows["requests"] == 4300 and report.rows["shards"] == 3 and report.rows["summaries"] == 3
    con = duckdb.connect(str(db), read_only=True)
    try:
        (run,) = _rows(con, "SELECT run_id, name, shards, requests, steps, rows_read, rows_skipped, scheduler "
                            "FROM runs")
        assert run[0] == report.run_id and run[1:] == ("demo", 3, 4300, report.rows["steps"], 2300, 0, "sync")
        shards = _rows(con, "SELECT shard_id, model, engine, requests, clock FROM shards ORDER BY shard_id")
        assert shards == [(0, "llama-3.1-8b", "base", 2000, "time"), (1, "llama-3.1-8b", "nocache", 2000, "time"),
                          (2, "qwen3-next-80b", "align", 300, "step")]
        per_shard = _rows(con, "SELECT shard_id, count(*), min(request_index), max(request_index) FROM requests "
                               "GROUP BY shard_id ORDER BY shard_id")
        assert per_shard == [(0, 2000, 0, 1999), (1, 2000, 0, 1999), (2, 300, 0, 299)]
        # Rows lie in key order: shard, then request index / step.
        keys = _rows(con, "SELECT shard_id, request_index FROM requests")
        assert keys == sorted(keys)
        steps = _rows(con, "SELECT shard_id, step FROM steps")
        assert steps == sorted(steps) and len(set(steps)) == len(steps)
        assert _rows(con, "SELECT count(*) FROM requests WHERE run_id <> ?", report.run_id) == [(0,)]
    finally:
        con.close()


def test_landed_rows_are_the_replay(demo_db):
    """Shard 0 holds exactly what aisim.replay gives for its trace and engine (NaN landed as NULL)."""
    db, report = demo_db
    direct = replay(read_trace(os.path.join(EXAMPLES, "trace.jsonl")),
                    load_engine_config(os.path.join(EXAMPLES, "engine.json")))
    con = duckdb.connect(str(db), read_only=True)
    try:
        got = con.sql("SELECT * FROM requests WHERE shard_id = 0 ORDER BY request_index").to_arrow_table()
        steps = con.sql("SELECT * FROM steps WHERE shard_id = 0 ORDER BY step").to_arrow_table()
        summary = json.loads(_rows(con, "SELECT summary_json FROM summaries WHERE shard_id = 0")[0][0])
        (p50, finished) = _rows(con, "SELECT ttft_p50_s, finished FROM summaries WHERE shard_id = 0")[0]
    finally:
        con.close()
    for name in direct.requests.column_names:
        want = direct.requests.column(name)
        if pa.types.is_dictionary(want.type):
            want = want.cast(pa.string())
        if pa.types.is_floating(want.type):
            w = want.to_numpy(zero_copy_only=False)
            g = got.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
            np.testing.assert_array_equal(np.isnan(w), np.isnan(g))
            np.testing.assert_array_equal(w[~np.isnan(w)], g[~np.isnan(g)])
        else:
            assert got.column(name).to_pylist() == want.to_pylist(), name
    assert steps.num_rows == direct.steps.num_rows
    assert steps.column("physical_usage").to_pylist() == direct.steps.column("physical_usage").to_pylist()
    assert summary == json.loads(json.dumps(direct.summary))
    assert p50 == direct.summary["ttft_s"]["p50"] and finished == direct.summary["finished"]


def test_rerun_lands_nothing_and_force_replaces(demo_db):
    db, first = demo_db
    before = dump(db, bookkeeping=True)
    again = run_pipeline(demo_spec(db), scheduler="sync")
    assert not again.landed and again.run_id == first.run_id
    assert dump(db, bookkeeping=True) == before
    forced = run_pipeline(demo_spec(db), scheduler="sync", force=True)
    assert forced.landed and forced.replaced and forced.run_seq == 1
    assert dump(db) == _strip_bookkeeping(before)


def _strip_bookkeeping(d):
    """dump(bookkeeping=True) -> dump(): drop the bookkeeping columns by position."""
    from aisim import sql
    from aisim.pipeline.run import BOOKKEEPING

    con = duckdb.connect()
    sql.apply_schema(con)
    out = {}
    for t, rows in d.items():
        cols = [r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                                          "ORDER BY ordinal_position", [t]).fetchall()]
        keep = [i for i, c in enumerate(cols) if c not in BOOKKEEPING.get(t, ())]
        out[t] = [tuple(r[i] for i in keep) for r in rows]
    con.close()
    return out


def test_second_run_of_other_inputs_lands_beside_the_first(demo_db, tmp_path):
    db, first = demo_db
    other = run_pipeline(demo_spec(db, window={"end_step": 2000, "end_s": 150.0}), scheduler="sync")
    assert other.landed and other.run_seq == 2 and other.run_id != first.run_id
    con = duckdb.connect(str(db), read_only=True)
    try:
        runs = _rows(con, "SELECT run_seq, requests FROM runs ORDER BY run_seq")
        assert runs[0] == (1, 4300) and runs[1][1] < 4300
        assert _rows(con, "SELECT count(DISTINCT run_id) FROM requests") == [(2,)]
    finally:
        con.close()


def _bad_engine_spec(db, tmp_path):
    with open(os.path.join(EXAMPLES, "engine.json")) as fh:
        cfg = json.load(fh)
    cfg["num_gpu_blocks"] = 8  # valid, but too small for the trace's longest request
    cfg["startup_check"] = False  # (vLLM's engine would refuse it at start-up already)
    bad = tmp_path / "tiny.json"
    bad.write_text(json.dumps(cfg))
    raw = demo_dict(db)
    raw["deployments"][0]["engines"]["tiny"] = str(bad)
    return spec_from_dict(raw, base_dir=PIPELINES)


def test_failing_shard_lands_nothing_and_names_the_shard(demo_db, tmp_path):
    db, _ = demo_db
    before = dump(db, bookkeeping=True)
    with pytest.raises(ShardFailed) as err:
        run_pipeline(_bad_engine_spec(db, tmp_path), scheduler="sync")
    msg = str(err.value)
    assert "shard 2 (model 'llama-3.1-8b', engine 'tiny') failed" in msg and "KV-cache blocks" in msg
    assert dump(db, bookkeeping=True) == before


def test_failing_run_creates_no_database(tmp_path):
    db = tmp_path / "new.duckdb"
    with pytest.raises(ShardFailed, match="engine 'tiny'"):
        run_pipeline(_bad_engine_spec(db, tmp_path), scheduler="sync")
    assert not os.path.exists(db)


def test_bad_trace_file_is_named(tmp_path):
    trace = tmp_path / "broken.jsonl"
    with open(os.path.join(EXAMPLES, "qwen3-next-trace.jsonl")) as fh:
        lines = fh.read().splitlines()
    lines[5] = '{"request_id": "x", "prompt_len": "many"}'
    trace.write_text("\n".join(lines) + "\n")
    raw = demo_dict(tmp_path / "db.duckdb")
    raw["sources"][1]["paths"] = [str(trace)]
    with pytest.raises(ShardFailed) as err:
        run_pipeline(spec_from_dict(raw, base_dir=str(tmp_path)), scheduler="sync")
    assert "reading broken.jsonl (source 'qwen-chat') failed" in str(err.value)
    assert "broken.jsonl:6" in str(err.value)
    assert not os.path.exists(tmp_path / "db.duckdb")


@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_failure_inside_the_landing_transaction_rolls_back(demo_db, tmp_path, monkeypatch, exc):
    db, first = demo_db
    before = dump(db, bookkeeping=True)
    real = landing.insert_parquet

    def failing(con, table, paths):
        if table == "steps":
            raise exc
        return real(con, table, paths)

    monkeypatch.setattr(landing, "insert_parquet", failing)
    with pytest.raises(type(exc)) as err:
        run_pipeline(demo_spec(db), scheduler="sync", force=True)
    if isinstance(exc, KeyboardInterrupt):
        staged = f"{db}.staging{os.sep}{first.run_id}"
        assert str(err.value) == (f"interrupted while landing; nothing was landed, and the results stay staged in "
                                  f"{staged}: aisim pipeline land {first.run_id} --db {db}")
    assert dump(db, bookkeeping=True) == before
    # The staged run stays; landing it later needs no replay.
    assert os.path.exists(f"{db}.staging/{first.run_id}/run.json")
    monkeypatch.setattr(landing, "insert_parquet", real)
    later = land_run(first.run_id, database=str(db), force=True)
    assert later.landed and later.replaced and later.rows == first.rows
    assert dump(db) == _strip_bookkeeping(before)
    assert not os.path.exists(f"{db}.staging")
    monkeypatch.setattr(landing, "insert_parquet", failing)
    fresh = tmp_path / "fresh.duckdb"
    with pytest.raises(type(exc)):
        run_pipeline(demo_spec(fresh), scheduler="sync")
    assert not os.path.exists(fresh) and not os.path.exists(str(fresh) + ".wal")


def test_locked_database_is_a_clear_error(demo_db):
    db, _ = demo_db
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('ready', flush=True); "
                               "sys.stdin.read()", str(db)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(DatabaseLocked) as err:
            run_pipeline(demo_spec(db), scheduler="sync", force=True, wait_s=0.3)
        assert f"database {db} is in use by process {holder.pid}" in str(err.value)
        assert "one writer at a time" in str(err.value)
        run_id = err.value.args[0].rsplit(" ", 3)[-3]
        assert str(err.value).endswith(f"; the results stay staged in {db}.staging{os.sep}{run_id}: "
                                       f"aisim pipeline land {run_id} --db {db}")
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()
    # Released: the staged run lands without a replay.
    report = land_run(run_id, database=str(db), force=True)
    assert report.landed and report.replaced and report.rows["requests"] == 4300
    assert not os.path.exists(f"{db}.staging")


def test_model_column_map_and_skipped_rows(tmp_path, monkeypatch):
    monkeypatch.setitem(READERS, "multi", multi_model_reader)
    raw = {
        "name": "multi",
        "database": str(tmp_path / "m.duckdb"),
        "sources": [{"paths": [os.path.join(EXAMPLES, "trace.jsonl")], "format": "multi",
                     "model_map": {"src-a": "alpha"}}],
        "deployments": [
            {"model": "alpha", "engines": {"base": os.path.join(EXAMPLES, "engine.json")}},
            {"model": "gamma", "engines": {"base": os.path.join(EXAMPLES, "engine.json")}},
        ],
    }
    report = run_pipeline(spec_from_dict(raw, base_dir=str(tmp_path)), scheduler="sync")
    # 2,000 rows: evens are src-a (-> alpha); odds src-b (no deployment), but every tenth row has no model.
    assert report.rows_read == 2000
    assert report.skipped_models == {"": 200, "src-b": 800}
    assert [(s["model"], s["requests"]) for s in report.shards] == [("alpha", 1000), ("gamma", 0)]
    con = duckdb.connect(str(tmp_path / "m.duckdb"), read_only=True)
    try:
        assert _rows(con, "SELECT rows_skipped, skipped_models FROM runs") == [
            (1000, json.dumps({"": 200, "src-b": 800}, sort_keys=True))]
        ids = [r[0] for r in _rows(con, "SELECT request_id FROM requests ORDER BY request_index")]
        assert ids[:3] == ["r0", "r2", "r4"]
        assert _rows(con, "SELECT requests, steps, clock FROM shards WHERE model = 'gamma'") == [(0, 0, None)]
    finally:
        con.close()


def test_time_window_keeps_and_shifts_arrivals(tmp_path):
    raw = {
        "name": "timed",
        "database": str(tmp_path / "t.duckdb"),
        "window": {"start_s": 2.0, "end_s": 6.0},
        "sources": [{"paths": [os.path.join(TIMED, "trace.jsonl")], "model": "m"}],
        "deployments": [{"model": "m", "engines": {"base": os.path.join(TIMED, "config.json")}}],
    }
    report = run_pipeline(spec_from_dict(raw, base_dir=str(tmp_path)), scheduler="sync")
    full = read_trace(os.path.join(TIMED, "trace.jsonl"))
    arrival = full.column("arrival_s").to_numpy()
    inside = (arrival >= 2.0) & (arrival < 6.0)
    assert report.rows_read == full.num_rows and report.rows_in_window == int(inside.sum())
    # The shard is the replay of the window's rows with arrivals shifted by the window's start.
    part = full.filter(pa.array(inside))
    part = part.set_column(part.schema.get_field_index("arrival_s"), "arrival_s",
                           pa.array(part.column("arrival_s").to_numpy() - 2.0))
    direct = replay(part.replace_schema_metadata(full.schema.metadata), load_engine_config(
        os.path.join(TIMED, "config.json")))
    con = duckdb.connect(str(tmp_path / "t.duckdb"), read_only=True)
    try:
        got = _rows(con, "SELECT request_id, arrival_s, finish_s FROM requests ORDER BY request_index")
    finally:
        con.close()
    assert [g[0] for g in got] == direct.requests.column("request_id").to_pylist()
    assert [g[1] for g in got] == direct.requests.column("arrival_s").to_pylist()
    assert [g[2] for g in got] == direct.requests.column("finish_s").to_pylist()
    # A stepped trace under a window that bounds only seconds is refused, naming the file.
    raw2 = demo_dict(tmp_path / "s.duckdb", window={"end_s": 10.0})
    with pytest.raises(ShardFailed, match=r"trace\.jsonl \(source '[a-z]+-chat'\) failed: a stepped trace, but the "
                                          r"window only bounds seconds"):
        run_pipeline(spec_from_dict(raw2, base_dir=PIPELINES), scheduler="sync")


def test_files_of_one_model_merge_in_arrival_order(tmp_path):
    for name in ("a.jsonl", "b.jsonl"):
        shutil.copy(os.path.join(EXAMPLES, "qwen3-next-trace.jsonl"), tmp_path / name)
    raw = {
        "name": "merge",
        "database": str(tmp_path / "m.duckdb"),
        "sources": [{"name": "a", "paths": [str(tmp_path / "a.jsonl")], "model": "q", "request_id_prefix": "a-"},
                    {"name": "b", "paths": [str(tmp_path / "b.jsonl")], "model": "q", "request_id_prefix": "b-"}],
        "deployments": [{"model": "q", "engines": {"align": os.path.join(EXAMPLES, "qwen3-next-80b.json")}}],
    }
    report = run_pipeline(spec_from_dict(raw, base_dir=str(tmp_path)), scheduler="sync")
    assert report.shards[0]["requests"] == 600
    con = duckdb.connect(str(tmp_path / "m.duckdb"), read_only=True)
    try:
        ids = [r[0] for r in _rows(con, "SELECT request_id FROM requests ORDER BY request_index")]
        sources = json.loads(_rows(con, "SELECT sources FROM shards")[0][0])
    finally:
        con.close()
    steps = [r["arrival_step"] for r in read_trace(str(tmp_path / "a.jsonl")).to_pylist()]
    rids = read_trace(str(tmp_path / "a.jsonl")).column("request_id").to_pylist()
    # Arrival order; ties keep file order (every row of a.jsonl before b.jsonl's at the same step).
    want = [f"{src}-{rid}" for _, src, _, rid in sorted(
        (step, src, i, rid) for src in ("a", "b") for i, (step, rid) in enumerate(zip(steps, rids)))]
    assert ids == want and ids[:2] == ["a-r0", "b-r0"]
    assert sources == [{"path": "a.jsonl", "rows": 300}, {"path": "b.jsonl", "rows": 300}]
    for s in raw["sources"]:
        s["request_id_prefix"] = ""
    with pytest.raises(ShardFailed, match=r"request_id 'r0' appears more than once \(in a\.jsonl, b\.jsonl\)"):
        run_pipeline(spec_from_dict(raw, base_dir=str(tmp_path)), scheduler="sync")


def test_scheduler_arguments_are_checked(tmp_path):
    spec = demo_spec(tmp_path / "x.duckdb")
    with pytest.raises(PipelineError, match="synchronous scheduler"):
        run_pipeline(spec, scheduler="sync", workers=2)
    with pytest.raises(PipelineError, match="existing scheduler"):
        run_pipeline(spec, scheduler="tcp://127.0.0.1:1", workers=2)


def test_unreachable_scheduler_is_a_clear_error(tmp_path):
    import dask

    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}), \
            pytest.raises(PipelineError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:9"):
        run_pipeline(demo_spec(tmp_path / "x.duckdb"), scheduler="tcp://127.0.0.1:9")


def test_run_key_in_database_matches_spec(demo_db):
    db, report = demo_db
    spec = demo_spec(db)
    assert run_key(spec, resolve_inputs(spec)) == report.run_id
    assert landing.run_landed(str(db), report.run_id)
    assert not landing.run_landed(str(db), "0" * 16)


@pytest.mark.parametrize("sizes", [[], [0], [5], [3, 4, 5, 6, 7, 8], [10, 10, 10], [1] * 25, [23, 1, 9]])
def test_staged_files_hold_whole_pieces_in_order(tmp_path, monkeypatch, sizes):
    """Rows arrive in pieces of any size and are staged as files of FILE_ROWS rows, in order."""
    import pyarrow.parquet as pq

    from aisim.pipeline import shards as fn
    from aisim.pipeline.staging import Staging

    monkeypatch.setattr(fn, "FILE_ROWS", 10)
    schema = pa.schema([("x", pa.int64())])
    start = np.cumsum([0] + sizes)
    pieces = [pa.table({"x": pa.array(np.arange(a, b), pa.int64())}) for a, b in zip(start, start[1:])]
    stage = Staging(str(tmp_path / "stage"))
    staged = fn._Pieces({"staging": stage, "run_id": "run", "shard_id": 0}, "x", schema)
    for piece in pieces:
        staged.add(piece)
    names, total = staged.close()
    got = [pq.read_table(stage.run_path("run", n)).column("x").to_numpy() for n in names]
    assert total == sum(sizes)
    assert names == [f"shards/00000/x-{i:05d}.parquet" for i in range(len(names))]
    assert [len(g) for g in got[:-1]] == [10] * (len(got) - 1) and 0 <= len(got[-1]) <= 10
    assert len(names) == max(1, -(-sum(sizes) // 10))
    np.testing.assert_array_equal(np.concatenate(got), np.arange(sum(sizes)))
    assert not [p for p in os.listdir(stage.run_path("run", "shards/00000")) if "partial" in p]


def test_bad_input_is_a_failure_result_not_an_exception(tmp_path):
    """Deterministic errors travel as results (no Dask retries); the graph turns them into ShardFailed."""
    from aisim.pipeline import reads
    from aisim.pipeline import shards as fn
    from aisim.pipeline.run import build_plan
    from aisim.pipeline.staging import Staging

    spec = demo_spec(tmp_path / "x.duckdb")
    plan = build_plan(spec, resolve_inputs(spec), "f" * 16, Staging(str(tmp_path / "stage")))
    read = dict(plan["reads"][0], path=str(tmp_path / "gone.jsonl"), display="gone.jsonl")
    out = reads.read_whole(read)
    assert fn.is_failure(out) and out["aisim_failure"] == (
        f"reading gone.jsonl (source 'llama-chat') failed: cannot read trace {tmp_path / 'gone.jsonl'}: "
        "No such file or directory")
    assert fn.source_stats(out) is out
    shard = {k: v for k, v in plan["shards"][0].items() if k != "reads"}
    assert fn.run_shard(dict(shard, files=[(0, "gone.jsonl")]), [out]) is out
    good = reads.read_whole(plan["reads"][0])
    again = reads.read_whole(dict(plan["reads"][0], index=5, display="again.jsonl"))
    display = plan["reads"][0]["display"]
    res = fn.run_shard(dict(shard, files=[(0, display), (5, "again.jsonl")]), [good, again])
    assert fn.is_failure(res) and res["aisim_failure"] == (
        "shard 0 (model 'llama-3.1-8b', engine 'base') failed: request_id 'r0' appears more than once (in "
        f"{display}, again.jsonl); give the sources distinct 'request_id_prefix' values")
