"""Disaggregated (prefill/decode) deployments in pipeline specs: the shard replays deploy()'s P/D
deployment, its rows and per-replica summaries land, each replica row names its pool."""

import json
import os

import duckdb
import pytest

from aisim.config.engine import load_engine_config
from aisim.deploy import deploy
from aisim.pipeline import spec_from_dict
from aisim.pipeline.run import run_pipeline
from aisim.pipeline.runkey import resolve_inputs, run_key
from aisim.query import bind
from aisim.traces import read_trace

from test_pipeline_common import EXAMPLES, PIPELINES

FLEET_TRACE = os.path.join(PIPELINES, "fleet-trace.jsonl")
ENGINE = os.path.join(EXAMPLES, "engine.json")
PD = {"prefill": {"replicas": 2, "router": "kv_aware"}, "decode": {"replicas": 3, "router": "least_loaded"},
      "link": {"bandwidth_gb_s": 25.0, "latency_s": 0.002}}


def _spec(database, engines, base_dir):
    raw = {"name": "pd", "database": str(database),
           "sources": [{"paths": [FLEET_TRACE], "format": "mooncake", "model": "llama-3.1-8b",
                        "options": {"unit_tokens": 64}}],
           "deployments": [{"model": "llama-3.1-8b", "engines": engines}]}
    return spec_from_dict(raw, source="spec.toml", base_dir=str(base_dir))


def _engine_file(tmp):
    """examples/engine.json with the geometry a timed transfer needs: Llama 3.1 8B's 32 layers of
    16-token pages, 8 KV heads of 128 dims in bf16 for K and V (65,536 bytes a layer)."""
    with open(ENGINE) as fh:
        cfg = json.load(fh)
    cfg["kv_cache_groups"] = [{"type": "full", "page_size_bytes": 65536, "num_layers": 32}]
    path = tmp / "engine.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    """A P/D shard (2 prefill replicas behind kv_aware, 3 decode behind least_loaded) landed, and
    deploy() of the same trace: (connection, DeploymentResult)."""
    tmp = tmp_path_factory.mktemp("pd")
    db = tmp / "pd.duckdb"
    engine = _engine_file(tmp)
    assert run_pipeline(_spec(db, {"pd": {"engine": engine, "deployment": PD}}, tmp), scheduler="sync").landed
    want = deploy(read_trace(FLEET_TRACE, "mooncake", unit_tokens=64), load_engine_config(engine), PD)
    con = duckdb.connect(str(db), read_only=True)
    yield con, want
    con.close()


@pytest.fixture(scope="module")
def pd_report(pd, tmp_path_factory):
    """The report of the landed P/D run (built from its own connection)."""
    from aisim.report import build_report

    con, _ = pd
    db = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()[0]
    return build_report(db)


def test_pd_shard_rows_are_deploy_rows(pd):
    con, want = pd
    cols = ["request_id", "replica", "prefill_replica", "decode_replica", "routed_s", "transfer_s", "arrival_s",
            "first_token_s", "finish_s", "ttft_s", "e2e_s", "output_tokens", "cached_tokens", "status"]
    got = con.execute(f"SELECT {', '.join(cols)} FROM requests ORDER BY request_index").fetchall()
    exp = want.requests.select(cols).to_pylist()
    assert len(got) == 600
    assert got == [tuple(r[c] for c in cols) for r in exp]
    # Every request was prefilled in pool 0-1 and decoded in pool 2-4, with a transfer time.
    assert {r[2] for r in got} == {0, 1} and {r[3] for r in got} == {2, 3, 4}
    assert all(r[5] is not None and r[5] >= 0.002 for r in got)
    cols = ["replica", "step", "clock_s", "duration_s", "num_reqs", "prefill_tokens", "decode_tokens"]
    got = con.execute(f"SELECT {', '.join(cols)} FROM steps ORDER BY clock_s, replica, step").fetchall()
    exp = sorted((tuple(r[c] for c in cols) for r in want.steps.select(cols).to_pylist()),
                 key=lambda r: (r[2], r[0], r[1]))
    assert got == exp


def test_pd_shard_and_summary(pd):
    con, want = pd
    shard = con.execute("SELECT replicas, router, deployment_config, requests FROM shards").fetchone()
    assert shard[0] == 5 and shard[1] == "kv_aware" and shard[3] == 600
    assert json.loads(shard[2]) == want.deployment.to_dict()
    assert json.loads(shard[2])["decode"]["router"]["kind"] == "least_loaded"
    row = con.execute("SELECT requests, finished, ttft_p99_s, e2e_p50_s, duration_s, summary_json FROM summaries"
                      ).fetchone()
    s = want.summary
    assert row[:5] == (s["requests"], s["finished"], s["ttft_s"]["p99"], s["e2e_s"]["p50"], s["duration_s"])
    assert json.loads(row[5])["load_balance"] == s["load_balance"]


def test_pd_replica_rows_name_their_pool(pd):
    con, want = pd
    reps = con.execute("SELECT replica, pool, requests, finished, steps, busy_s, utilisation FROM replicas "
                       "ORDER BY replica").fetchall()
    assert reps == [(r["replica"], r["pool"], r["requests"], r["finished"], r["steps"], r["busy_s"],
                     r["utilisation"]) for r in want.summary["replicas"]]
    assert [r[1] for r in reps] == ["prefill", "prefill", "decode", "decode", "decode"]
    # Each request is prefilled once and decoded once: each pool's replicas hold all 600.
    assert sum(r[2] for r in reps[:2]) == 600 and sum(r[2] for r in reps[2:]) == 600


def test_pd_balance_is_within_each_pool(pd):
    con, want = pd
    text, values = bind("load_balance", {})
    rows = con.execute(text, values).fetchall()
    per = want.summary["replicas"]
    assert [(r[4], r[5], r[6]) for r in rows] == [(p["replica"], p["pool"], p["requests"]) for p in per]
    for pool, members in (("prefill", per[:2]), ("decode", per[2:])):
        n = [p["requests"] for p in members]
        got = [r for r in rows if r[5] == pool]
        assert [r[7] for r in got] == [round(k / 600, 4) for k in n]
        assert {r[11] for r in got} == {round(max(n) / (sum(n) / len(n)), 4)}
    assert {r[3] for r in rows} == {"kv_aware"}  # the shard's router column: the prefill pool's


def test_a_pool_engine_file_is_part_of_the_run_key(tmp_path):
    eng = tmp_path / "decode.json"
    with open(ENGINE) as fh:
        text = fh.read()
    eng.write_text(text)
    pd = dict(PD, decode={"replicas": 1, "engine": "decode.json"})
    spec = _spec(tmp_path / "db.duckdb", {"pd": {"engine": ENGINE, "deployment": pd}}, tmp_path)
    assert spec.deployments[0].engines[0].deployment.decode.engine == str(eng)
    key = run_key(spec, resolve_inputs(spec))
    eng.write_text(text + "\n")
    assert run_key(spec, resolve_inputs(spec)) != key


def test_the_report_names_each_replica_s_pool(pd, pd_report):
    import re

    con, want = pd
    html, rd = pd_report
    [sd] = rd.shards
    assert [(r["replica"], r["pool"]) for r in sd.replicas] == [(0, "prefill"), (1, "prefill"), (2, "decode"),
                                                                (3, "decode"), (4, "decode")]
    table = re.search(r'<table class="summary replicas" id="replicas-0">(.*?)</table>', html, re.S).group(1)
    assert "replica 0 (prefill)" in table and "replica 4 (decode)" in table
    per = want.summary["replicas"]
    # A replica's share is within its pool: each request is prefilled once and decoded once.
    shares = [float(v) for v in re.findall(r'data-key="share" data-value="([^"]+)"', table)]
    assert shares[:5] == [p["requests"] / 600 for p in per] and shares[5] == 1.0
    for pool, router, members in (("prefill", "kv_aware", per[:2]), ("decode", "least_loaded", per[2:])):
        n = [p["requests"] for p in members]
        m = re.search(rf'<span data-pool="{pool}" data-request-imbalance="([\d.]+)"[^>]*>(\d) {pool} replicas '
                      rf'behind the {router} router', html)
        assert m.groups() == (f"{max(n) / (sum(n) / len(n)):.3f}", str(len(n)))
