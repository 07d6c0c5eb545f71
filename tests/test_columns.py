"""The column catalogue (aisim/columns.py) against everything that writes or reads the columns."""

import os

import duckdb
import numpy as np
import pytest

from aisim import columns, sql
from aisim.columns import REQUESTS, STEPS, SUMMARIES, TABLES

from test_sql_library import land_demo

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _replay(n, **kw):
    from aisim.config.engine import load_engine_config
    from aisim.replay import replay
    from aisim.traces import read_trace

    trace = read_trace(os.path.join(EXAMPLES, "trace.jsonl"), "oracle").slice(0, n)
    return replay(trace, load_engine_config(os.path.join(EXAMPLES, "engine.json")), **kw)


@pytest.fixture(scope="module")
def demo():
    """The demo landed in an in-memory database, and its shard tables."""
    con = duckdb.connect()
    _, tables = land_demo(con)
    yield con, tables
    con.close()


@pytest.fixture(scope="module")
def replayed():
    return _replay(200)


def test_schema_sql_is_generated_from_the_catalogue():
    text = sql.schema().sql
    assert text == columns.render_schema(columns.schema_header(text)), \
        "sql/schema.sql is stale: run python -m aisim.columns --write"


def test_generated_table_statement():
    t = columns.Table("t", (columns.Column("a_long_name", "BIGINT", "s", "first", not_null=True),
                            columns.Column("b", "VARCHAR", "", "second")), primary_key=("a_long_name",))
    assert columns.render_table(t) == (
        "CREATE TABLE IF NOT EXISTS t (\n"
        "    a_long_name  BIGINT NOT NULL,  -- first\n"
        "    b            VARCHAR,          -- second\n"
        "    PRIMARY KEY (a_long_name)\n"
        ");\n")


def test_replay_tables_have_the_catalogue_schemas(replayed):
    assert replayed.requests.schema == REQUESTS.replay_schema()
    assert replayed.steps.schema == STEPS.replay_schema()
    assert replayed.requests.column_names[:2] == ["request_id", "arrival_s"]
    assert "active_usage" not in replayed.steps.column_names
    kv = replayed.steps.column("kv_usage").to_numpy()
    active = replayed.steps.column("active_blocks").to_numpy()
    assert np.array_equal(kv, active / (replayed.engine.num_gpu_blocks - 1))


def test_shard_results_have_the_catalogue_schemas(demo):
    _, tables = demo
    for name in ("shards", "summaries", "replicas", "requests", "steps"):
        assert tables[name].schema == TABLES[name].arrow_schema(), name


def test_landed_tables_have_the_catalogue_names_types_and_order(demo):
    con, _ = demo
    for table in TABLES.values():
        got = con.execute("SELECT column_name, data_type, is_nullable FROM information_schema.columns "
                          "WHERE table_name = ? ORDER BY ordinal_position", [table.name]).fetchall()
        want = [(c.name, "TIMESTAMP WITH TIME ZONE" if c.sql == "TIMESTAMPTZ" else c.sql,
                 "NO" if c.not_null or c.name in table.primary_key else "YES") for c in table.columns]
        assert got == want, table.name


def test_summary_columns_read_existing_summary_fields(replayed):
    s = replayed.summary
    for col in SUMMARIES.columns:
        if col.summary is not None and col.summary[0] != "kv_offload":  # with a tier only (test_offload_results)
            v = s
            for key in col.summary:
                assert key in v, col.name
                v = v[key]
    for lat in columns.LATENCIES:
        assert tuple(s[lat]) == columns.LATENCY_STATS


def test_summary_row_flattens_the_summary(replayed):
    import pyarrow.compute as pc

    from aisim.pipeline.shards import _KvUsage, _steps_table, summary_row

    steps = _steps_table({"run_id": "r", "shard_id": 0}, replayed.steps)
    kv = _KvUsage(replayed.engine)
    half = steps.num_rows // 2
    kv.add(steps.slice(0, half))  # steps arrive in pieces
    kv.add(steps.slice(half))
    row = summary_row({"run_id": "r", "shard_id": 0}, replayed.summary, kv)
    assert list(row) == SUMMARIES.names
    s = replayed.summary
    assert row["ttft_p90_s"] == s["ttft_s"]["p90"] and row["prefix_hits"] == s["prefix_cache_stats"]["hits"]
    assert row["kv_usage_max"] == float(np.max(replayed.steps.column("kv_usage").to_numpy()))
    assert row["kv_usage_mean"] == pc.mean(replayed.steps.column("kv_usage")).as_py()


def test_report_columns_are_in_the_catalogue():
    from aisim.report import data

    assert set(data.STEP_COLUMNS) <= set(STEPS.names)
    assert set(data.REQUEST_COLUMNS) <= set(REQUESTS.names)
    assert data.LATENCIES == columns.LATENCIES


def test_one_name_per_quantity():
    assert "active_usage" not in STEPS.names
    assert {"kv_usage_mean", "kv_usage_max"} <= set(SUMMARIES.names)
    assert not any(n.startswith("kv_active") for n in SUMMARIES.names)
    for table in TABLES.values():
        assert len(set(table.names)) == len(table.names), table.name
        for c in table.columns:
            assert c.sql in columns.ARROW_TYPES and c.meaning, (table.name, c.name)


def test_core_columns_match_the_core_exports():
    from aisim._core import engine

    assert dict(engine.STEP_COLUMNS) == STEPS.core_columns()
    assert [n for n, _ in engine.STEP_COLUMNS] == [c.name for c in STEPS.columns if c.core]
    assert dict(engine.REQUEST_COLUMNS) == REQUESTS.core_columns()


def test_core_outputs_have_the_catalogue_dtypes(monkeypatch):
    """What the core hands the replay has the numpy dtypes the catalogue declares."""
    import aisim.replay_result as rp

    seen = {}
    real = rp.requests_table

    def spy(trace, r):
        seen.update({k: str(v.dtype) for k, v in r.items()})
        return real(trace, r)

    monkeypatch.setattr(rp, "requests_table", spy)
    _replay(50)
    assert seen == REQUESTS.core_columns()


def test_landing_refuses_results_missing_a_column(demo, tmp_path):
    from aisim.pipeline import landing
    from aisim.errors import PipelineError

    import pyarrow.parquet as pq

    con, tables = demo
    short = tables["steps"].drop_columns(["kv_usage"])
    path = str(tmp_path / "short.parquet")
    pq.write_table(short, path)
    with pytest.raises(PipelineError, match=r"cannot land steps: the results lack column\(s\) kv_usage"):
        landing.insert_parquet(con, "steps", [path])
