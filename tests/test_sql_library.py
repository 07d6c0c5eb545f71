"""The SQL library (sql/, installed as aisim.sql): every file against an in-memory DuckDB, empty and with landed runs."""

import re
import tempfile

import duckdb
import pyarrow as pa
import pytest

from aisim import sql
from aisim.pipeline import graph, landing
from aisim.errors import QueryError
from aisim.query import bind
from aisim.query.runner import bind_sql, pick_run
from aisim.pipeline.run import build_plan
from aisim.pipeline.staging import Staging
from aisim.pipeline.shards import SHARD_SCHEMA, SUMMARY_SCHEMA
from aisim.pipeline.runkey import resolve_inputs, run_key

from test_pipeline_common import demo_spec

ALL_FILES = [sql.schema()] + sql.views() + sql.tables() + list(sql.queries().values()) + list(sql.sweep().values())


def _columns(con, table):
    return [r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                                      "ORDER BY ordinal_position", [table]).fetchall()]


def land_staged_results(con, key, name, results):
    """Stage-free landing for the tests: write the manifest of ``results`` and land it on ``con``.

    Returns the landed tables as Arrow, read back from the staged files.
    """
    import pyarrow.parquet as pq

    from aisim.pipeline.run import manifest

    stage = results[0]["stage"] if results and "stage" in results[0] else None
    run = {"run_id": key, "name": name, "description": "", "spec_path": None, "spec": "{}", "inputs": "[]",
           "aisim_version": "test", "shards": len(results),
           "requests": sum(r["rows"]["requests"] for r in results), "steps": sum(r["rows"]["steps"] for r in results),
           "rows_read": 0, "rows_in_window": 0, "rows_skipped": 0, "rows_bad": 0, "skipped_models": "{}"}
    m = manifest(run, results, ":memory:")
    tables = {t: pa.concat_tables([pq.read_table(stage.run_path(key, f)) for f in files])
              for t, files in m["files"].items()}
    out = landing.land_into(con, m, stage)
    assert out["landed"]
    return tables


def land_demo(con, name="demo", window=None):
    """Replay the demo (synchronous scheduler) and land it on ``con`` with land_into."""
    with tempfile.TemporaryDirectory(prefix="aisim-stage-") as tmp:
        spec = demo_spec(":memory:", name=name, **({"window": window} if window else {}))
        inputs = resolve_inputs(spec)
        key = run_key(spec, inputs)
        stage = Staging(tmp)
        results, stats, _ = graph.execute(build_plan(spec, inputs, key, stage), scheduler="sync")
        for r in results:
            r["stage"] = stage
        tables = land_staged_results(con, key, name, results)
    return key, tables


@pytest.fixture
def empty():
    con = duckdb.connect()
    sql.apply_schema(con)
    yield con
    con.close()


@pytest.fixture(scope="module")
def landed():
    con = duckdb.connect()
    first, tables = land_demo(con)
    second, _ = land_demo(con, window={"end_step": 3000, "end_s": 225.0})  # same name, other inputs: a later run
    other, _ = land_demo(con, name="other")
    yield con, {"first": first, "second": second, "other": other, "tables": tables}
    con.close()


@pytest.mark.parametrize("f", ALL_FILES, ids=lambda f: f"{f.kind}:{f.name}")
def test_every_file_has_a_header(f):
    head = f.sql.lstrip().splitlines()[0]
    kind = {"schema": "schema", "table": "table", "view": "(view|macro)", "query": "query"}[f.kind]
    assert re.match(rf"^-- {kind}: ", head), head
    assert f.purpose and f.grain and f.sources, f.name
    if f.kind == "table":
        assert head == f"-- table: {f.name}"
    if f.kind == "query":
        assert head == f"-- query: {f.name}"
        for p in f.params:
            assert f"${p.name}" in f.sql, f"{f.name} declares {p.name} but does not use it"
        used = set(re.findall(r"\$([A-Za-z_]\w*)", f.sql))
        assert used == {p.name for p in f.params}, f"{f.name}: parameters used but not declared"


@pytest.mark.parametrize("f", sql.views(), ids=lambda f: f.name)
def test_every_view_column_has_a_comment(f):
    select = f.sql.split("SELECT", 1)[1] if f.name.startswith("_") else f.sql.rsplit("\nSELECT\n", 1)[-1]
    lines = [ln for ln in re.split(r"\n\s*FROM\b", select)[0].splitlines() if ln.strip()]
    assert lines and all("--" in ln for ln in lines), f.name


@pytest.mark.parametrize("name", sorted(sql.queries()))
def test_every_query_runs_on_an_empty_database(empty, name):
    text, values = bind(name, {})
    empty.execute(text, values).fetchall()


@pytest.mark.parametrize("view", ["run_shards", "latency_percentiles", "prefix_reuse", "kv_cache_timeline",
                                  "run_comparison"])
def test_every_view_runs_on_an_empty_database(empty, view):
    assert empty.execute(f"SELECT * FROM {view}").fetchall() == []


def test_schema_matches_what_the_shards_return(empty, landed):
    _, runs = landed
    tables = runs["tables"]
    for name in ("requests", "steps"):
        assert _columns(empty, name) == tables[name].column_names, name
    assert _columns(empty, "summaries") == SUMMARY_SCHEMA.names
    assert _columns(empty, "shards") == SHARD_SCHEMA.names


@pytest.mark.parametrize("name", sorted(sql.queries()))
def test_every_query_runs_on_landed_runs(landed, name):
    con, _ = landed
    text, values = bind(name, {})
    rows = con.execute(text, values).fetchall()
    # The demo replays no deployment (tests/test_pipeline_deploy.py lands some) and lands no measured runs
    # (tests/test_measured_runs.py lands some).
    if name in ("load_balance", "sim_vs_real"):
        assert rows == []
        return
    assert rows, name


def test_resolve_run(landed):
    con, runs = landed

    def pick(sel):
        return con.execute("SELECT resolve_run(?)", [sel]).fetchone()[0]

    assert pick(None) == runs["other"]  # the latest run
    assert pick("demo") == runs["second"]  # the latest run of that name
    assert pick(runs["first"]) == runs["first"]
    assert pick(runs["first"][:6]) == runs["first"]
    assert pick("nothing-like-it") is None


def test_an_ambiguous_run_prefix_is_an_error_naming_the_runs(landed):
    con, runs = landed
    want = (f"run id prefix '' is ambiguous: 3 run ids start with it: {runs['other']} ('other', #3), "
            f"{runs['second']} ('demo', #2), {runs['first']} ('demo', #1); give more of the id")
    with pytest.raises(duckdb.InvalidInputException, match=re.escape(want)):
        con.execute("SELECT resolve_run('')").fetchone()
    with pytest.raises(QueryError, match=re.escape(want)):
        pick_run(con, "")
    text, values = bind("latency", {"run": ""})
    with pytest.raises(duckdb.InvalidInputException, match="is ambiguous"):
        con.execute(text, values).fetchall()
    assert pick_run(con, runs["first"][:12])["run_id"] == runs["first"]
    assert pick_run(con, "demo")["run_seq"] == 2 and pick_run(con, None)["name"] == "other"


def test_latency_view_agrees_with_the_replay_summary(landed):
    con, runs = landed
    rows = con.execute("""
        SELECT l.shard_id, l.ttft_p50_s, s.ttft_p50_s, l.tpot_p99_s, s.tpot_p99_s, l.e2e_p90_s, s.e2e_p90_s,
               l.requests, l.finished, s.finished
        FROM latency_percentiles l JOIN summaries s USING (run_id, shard_id) WHERE run_id = ?""",
                       [runs["first"]]).fetchall()
    assert len(rows) == 3
    for r in rows:
        assert r[1] == pytest.approx(r[2], rel=1e-9) and r[3] == pytest.approx(r[4], rel=1e-9)
        assert r[5] == pytest.approx(r[6], rel=1e-9) and r[7] == r[8] == r[9]


def test_prefix_reuse_agrees_with_the_summary(landed):
    con, runs = landed
    rows = con.execute("""
        SELECT p.prefix_queries, s.prefix_queries, p.prefix_hits, s.prefix_hits, p.prefix_hit_rate, s.prefix_hit_rate,
               p.cached_tokens, s.prefix_hit_tokens_at_admission
        FROM prefix_reuse p JOIN summaries s USING (run_id, shard_id) WHERE run_id = ?""",
                       [runs["first"]]).fetchall()
    for r in rows:
        # Without a lookup (prefix caching off) the view has no rate, the summary's is 0.
        rate = r[4] if r[0] else 0.0
        assert r[0] == r[1] and r[2] == r[3] and rate == pytest.approx(r[5]) and r[6] == r[7]


def test_kv_cache_timeline(landed):
    con, runs = landed
    n, bad = con.execute("""
        SELECT count(*), count(*) FILTER (WHERE physical_usage < kv_usage - 1e-12
                                          OR active_blocks + cached_blocks + empty_blocks < 0)
        FROM kv_cache_timeline WHERE run_id = ?""", [runs["first"]]).fetchone()
    steps = con.execute("SELECT count(*) FROM steps WHERE run_id = ?", [runs["first"]]).fetchone()[0]
    assert n == steps and bad == 0


def test_slo_attainment_thresholds(landed):
    con, runs = landed
    loose = con.execute("SELECT model, engine, attainment, goodput_req_s, throughput_req_s "
                        "FROM slo_attainment(1e9, 1e9) WHERE run_id = ? ORDER BY shard_id", [runs["first"]]).fetchall()
    assert all(r[2] == 1.0 and r[3] == pytest.approx(r[4]) for r in loose)
    tight = con.execute("SELECT attainment, goodput_req_s FROM slo_attainment(0.0, 0.0) WHERE run_id = ?",
                        [runs["first"]]).fetchall()
    assert all(r == (0.0, 0.0) for r in tight)
    mid = con.execute("SELECT shard_id, slo_met, ttft_met FROM slo_attainment(1.0, 0.05) WHERE run_id = ?",
                      [runs["first"]]).fetchall()
    for shard, met, ttft_met in mid:
        want = con.execute("SELECT count(*) FROM requests WHERE run_id = ? AND shard_id = ? AND status = 'finished' "
                           "AND ttft_s <= 1.0 AND (tpot_s <= 0.05 OR tpot_s IS NULL)",
                           [runs["first"], shard]).fetchone()[0]
        assert met == want <= ttft_met


def test_slo_attainment_e2e_threshold_and_no_limits(landed):
    con, runs = landed

    def met(*args):
        marks = ", ".join("?" for _ in args[:2]) + (", e2e_slo_s := ?" if len(args) > 2 else "")
        return con.execute(f"SELECT shard_id, slo_met FROM slo_attainment({marks}) WHERE run_id = ? ORDER BY shard_id",
                           [*args, runs["first"]]).fetchall()

    assert met(1.0, 0.05) == met(1.0, 0.05, None)
    unlimited = met(None, None)
    finished = con.execute("SELECT shard_id, count(*) FILTER (WHERE status = 'finished') FROM requests "
                           "WHERE run_id = ? GROUP BY ALL ORDER BY 1", [runs["first"]]).fetchall()
    assert unlimited == finished
    for shard, n in met(1.0, 0.05, 2.0):
        want = con.execute("SELECT count(*) FROM requests WHERE run_id = ? AND shard_id = ? AND finish_s IS NOT NULL "
                           "AND ttft_s <= 1.0 AND coalesce(tpot_s, 0) <= 0.05 AND e2e_s <= 2.0",
                           [runs["first"], shard]).fetchone()[0]
        assert n == want
    assert met(1.0, 0.05, 2.0) != met(1.0, 0.05)  # the E2E limit bites on the demo
    text, values = bind("slo", {"e2e_s": "20"})
    assert values["e2e_s"] == 20.0 and con.execute(text, values).fetchall()


@pytest.mark.parametrize("slo", [{"ttft_s": 5.0, "tpot_s": 0.05}, {"ttft_s": 1.0, "tpot_s": 0.05, "e2e_s": 20.0},
                                 {"e2e_s": 30.0}])
def test_sweep_goodput_query(landed, slo):
    """The sweep's ranking query counts what its former inline definition counted."""
    con, runs = landed
    text, values = bind_sql(sql.sweep()["goodput"], {"run": runs["first"], **slo})
    got = con.execute(text, values).fetchall()
    inf = float("inf")
    want = con.execute("""
        SELECT s.engine,
               count(*) FILTER (WHERE r.finish_s IS NOT NULL
                                  AND r.ttft_s <= ? AND coalesce(r.tpot_s, 0) <= ? AND r.e2e_s <= ?) AS good,
               count(*) FILTER (WHERE r.finish_s IS NOT NULL), count(*), max(m.duration_s)
        FROM shards s JOIN summaries m USING (run_id, shard_id) JOIN requests r USING (run_id, shard_id)
        WHERE s.run_id = ? GROUP BY s.engine ORDER BY s.engine""",
                       [slo.get("ttft_s", inf), slo.get("tpot_s", inf), slo.get("e2e_s", inf), runs["first"]]).fetchall()
    assert [r[:4] for r in got] == [r[:4] for r in want]
    assert [r[4] for r in got] == [g / d for _, g, _, _, d in want]
    assert [r[5] for r in got] == [g / n for _, g, _, n, _ in want]


def test_sweep_files_run_on_an_empty_database(empty):
    files = sql.sweep()
    assert sorted(files) == ["capacity_rate", "goodput", "sweep_candidates"]
    empty.execute(files["sweep_candidates"].sql)
    assert _columns(empty, "sweep_candidates")[:3] == ["run_id", "candidate", "knobs"]
    assert _columns(empty, "sweep_candidates")[-4:] == ["capacity_rate_req_s", "capacity_band_low_req_s",
                                                        "capacity_band_high_req_s", "calibration"]
    text, values = bind_sql(files["goodput"], {"run": "x"})
    assert empty.execute(text, values).fetchall() == []
    # capacity_points exists once a run's [capacity] section landed in the database.
    from aisim.columns import CAPACITY_POINTS, render_table

    empty.execute(render_table(CAPACITY_POINTS))
    text, values = bind_sql(files["capacity_rate"], {"run": "x"})
    assert empty.execute(text, values).fetchall() == []


def test_run_comparison_pairs_each_run_with_the_previous_of_its_name(landed):
    con, runs = landed
    rows = con.execute("SELECT run_id, base_run_id, requests, base_requests, ttft_p50_delta_s "
                       "FROM run_comparison WHERE run_name = 'demo' AND model = 'llama-3.1-8b' AND engine = 'base' "
                       "ORDER BY run_seq").fetchall()
    assert [(r[0], r[1]) for r in rows] == [(runs["first"], None), (runs["second"], runs["first"])]
    assert rows[1][2] < rows[1][3] and rows[1][4] is not None
    assert con.execute("SELECT count(*) FROM run_comparison WHERE run_name = 'other' AND base_run_id IS NOT NULL"
                       ).fetchone()[0] == 0


def test_compare_query(landed):
    con, runs = landed
    text, values = bind("compare", {"base": runs["first"], "other": runs["other"]})
    rows = con.execute(text, values).fetchall()
    assert len(rows) == 3
    assert all(r[2] == runs["first"] and r[3] == runs["other"] and r[8] == 0 for r in rows)  # same work, no change
    text, values = bind("compare", {"other": "demo"})  # default base: the run of that name before it
    rows = con.execute(text, values).fetchall()
    assert {(r[2], r[3]) for r in rows} == {(runs["first"], runs["second"])}


def test_parameters_are_bound_not_pasted(landed):
    con, _ = landed
    text, values = bind("shards", {"run": "x'; DROP TABLE runs; --"})
    assert con.execute(text, values).fetchall() == []
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 3
    text, values = bind("slowest_requests", {"limit": "5"})
    assert values["limit"] == 5 and len(con.execute(text, values).fetchall()) == 5


def test_bad_parameters_are_refused():
    with pytest.raises(QueryError, match="query 'slo' has no parameter 'ttft'; its parameters: run, ttft_s, tpot_s, e2e_s"):
        bind("slo", {"ttft": "1"})
    with pytest.raises(QueryError, match="parameter 'ttft_s' of query 'slo' must be DOUBLE, got 'fast'"):
        bind("slo", {"ttft_s": "fast"})
    with pytest.raises(QueryError, match="unknown query 'latencies'; known: compare, kv_timeline, latency"):
        bind("latencies", {})


def test_library_loads_as_package_data():
    from importlib import resources

    root = resources.files("aisim.sql")
    assert (root / "schema.sql").is_file() and (root / "sweep" / "goodput.sql").is_file()
    assert sorted(f.name for f in (root / "queries").iterdir() if f.name.endswith(".sql")) == \
        sorted(f"{n}.sql" for n in sql.queries())


def test_empty_shards_land(empty, tmp_path):
    """A model without rows lands a shard with zero requests and the views cope."""
    from aisim.pipeline.shards import run_shard

    spec = demo_spec(":memory:")
    stage = Staging(str(tmp_path / "stage"))
    plan = build_plan(spec, resolve_inputs(spec), "e" * 16, stage)
    desc = {k: v for k, v in plan["shards"][2].items() if k != "reads"}
    out = run_shard(dict(desc, files=[]), [])
    assert out["rows"]["requests"] == 0 and out["summary"]["requests"] == 0
    assert out["files"]["requests"] == ["shards/00002/requests-00000.parquet"]
    out["stage"] = stage
    tables = land_staged_results(empty, "e" * 16, "empty", [out])
    assert tables["requests"].num_rows == 0
    assert empty.execute("SELECT requests, requests_with_hit FROM prefix_reuse").fetchall() == [(0, 0)]
    assert empty.execute("SELECT count(*) FROM latency_percentiles").fetchone()[0] == 0


def test_pipelines_readme_names_every_table_view_and_query():
    import os

    from aisim.columns import TABLES

    readme = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pipelines", "README.md")
    with open(readme, encoding="utf-8") as fh:
        text = fh.read()
    names = list(TABLES) + [v.name.lstrip("_") for v in sql.views()] + list(sql.queries())
    missing = [n for n in names if f"`{n}`" not in text and f"`{n}(" not in text]
    assert missing == [], f"pipelines/README.md does not name {missing}"
