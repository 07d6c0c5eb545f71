"""The measured_runs table and the sim_vs_real query, on a tiny database with rows checked by hand."""

import json
import os

import duckdb
import pytest

from aisim.calibrate.benchserve import read_bench_serve
from aisim.calibrate.measured import land_measured
from aisim.columns import TABLES
from aisim.errors import PipelineError
from aisim.query import bind

from benchserve_points import HERE, truth_engine

FILES = [os.path.join(HERE, f) for f in ("poisson-4rps-512x128.json", "cap1-128x200.json")]


def _insert(con, table, values):
    """A row of ``table`` with ``values``; every other NOT NULL column a filler of its type."""
    fill = {"VARCHAR": "x", "DOUBLE": 0.0, "INTEGER": 0, "BIGINT": 0, "TIMESTAMPTZ": None, "BOOLEAN": False}
    row = {c.name: values.get(c.name, fill[c.sql] if c.not_null else None) for c in TABLES[table].columns}
    con.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))


def _sim(con, run_id, seq, gpu, rate, cap, ttft, tpot, e2e, tok_s):
    spec = {"replay": {k: v for k, v in (("poisson_rate", rate), ("max_concurrency", cap)) if v is not None}}
    _insert(con, "runs", {"run_id": run_id, "run_seq": seq, "name": run_id, "spec": json.dumps(spec)})
    engine = {"model": "qwen3-8b", "time_model": {"kind": "roofline", "gpu": gpu, "tp": 1}}
    _insert(con, "shards", {"run_id": run_id, "shard_id": 0, "model": "qwen3-8b", "engine": "e",
                            "engine_config": json.dumps(engine)})
    _insert(con, "summaries", {"run_id": run_id, "shard_id": 0, "ttft_mean_s": ttft, "tpot_mean_s": tpot,
                               "e2e_mean_s": e2e, "throughput_tok_s": tok_s})


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "m.duckdb")
    runs = [r for f in FILES for r in read_bench_serve(f)]
    assert land_measured(path, runs, truth_engine(), "cal") == 2
    return path, runs


def test_measured_rows_are_the_files(db):
    path, runs = db
    con = duckdb.connect(path)
    rows = con.execute("SELECT source, run_index, model, gpu, tp, request_rate, max_concurrency, num_prompts, "
                       "ttft_mean_s, throughput_tok_s, calibration FROM measured_runs ORDER BY source").fetchall()
    # The cap-1 burst (rate inf: NULL), then the Poisson run at 4 req/s; latencies in seconds.
    cap1, poisson = runs[1], runs[0]
    assert rows == [
        (FILES[1], 0, "qwen3-8b", "H100", 1, None, 1, 2, cap1.metrics["ttft"] / 1e3, cap1.metrics["throughput"], "cal"),
        (FILES[0], 0, "qwen3-8b", "H100", 1, 4.0, None, 60, poisson.metrics["ttft"] / 1e3,
         poisson.metrics["throughput"], "cal"),
    ]
    # The database is an aisim run database: the pipeline's tables are there for later runs.
    assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_landing_again_replaces_a_files_rows(db):
    path, runs = db
    land_measured(path, runs[:1], truth_engine(), "again")
    con = duckdb.connect(path)
    assert con.execute("SELECT calibration, count(*) FROM measured_runs GROUP BY ALL ORDER BY 1").fetchall() == [
        ("again", 1), ("cal", 1)]


def test_a_failed_landing_leaves_the_database_as_it_was(db, tmp_path):
    path, runs = db
    con = duckdb.connect(path)
    con.execute("CREATE TABLE keep (x INTEGER)")
    con.execute("DROP TABLE measured_runs")
    con.execute("CREATE TABLE measured_runs (source VARCHAR)")  # another shape: the insert fails
    con.close()
    with pytest.raises(PipelineError, match="cannot land measured runs"):
        land_measured(path, runs, truth_engine())
    con = duckdb.connect(path)
    assert con.execute("SELECT count(*) FROM measured_runs").fetchone() == (0,)


def test_sim_vs_real_joins_by_model_gpu_rate_and_cap(db):
    path, runs = db
    poisson = runs[0].metrics
    con = duckdb.connect(path)
    # A shard at the Poisson run's rate, no cap, on its GPU: each simulated value set to measured x (1 + e)
    # with e = +10 % TTFT, -20 % TPOT, +5 % E2E, -50 % throughput; the errors come back as those.
    _sim(con, "match", 1, "H100", 4.0, None, 1.1 * poisson["ttft"] / 1e3, 0.8 * poisson["tpot"] / 1e3,
         1.05 * poisson["e2el"] / 1e3, 0.5 * poisson["throughput"])
    # Not matches: another GPU; the same GPU under a cap; another rate.
    _sim(con, "a100", 2, "A100-80GB", 4.0, None, 1.0, 1.0, 1.0, 1.0)
    _sim(con, "capped", 3, "H100", 4.0, 8, 1.0, 1.0, 1.0, 1.0)
    _sim(con, "faster", 4, "H100", 5.0, None, 1.0, 1.0, 1.0, 1.0)
    text, values = bind("sim_vs_real", {})
    got = con.execute(text, values).fetchall()
    cols = [d[0] for d in con.description]
    got = [dict(zip(cols, r)) for r in got]
    assert [(g["source"], g["run_name"]) for g in got] == [(FILES[0], "match"), (FILES[1], None)]
    m = got[0]
    assert (m["ttft_error"], m["tpot_error"], m["e2e_error"], m["throughput_error"]) == (0.1, -0.2, 0.05, -0.5)
    assert m["measured_ttft_ms"] == round(poisson["ttft"], 2) and m["request_rate"] == 4.0
    assert got[1]["ttft_error"] is None and got[1]["max_concurrency"] == 1
    # Only the shards of one run.
    text, values = bind("sim_vs_real", {"run": "faster"})
    assert [r[7] for r in con.execute(text, values).fetchall()] == [None, None]
