"""Deployments in the pipeline: a spec's engine entry names a deployment, its shard replays it.

The bundled example ``pipelines/fleet.toml`` (one engine, four replicas behind round robin,
four behind the KV-aware router) is run once on the synchronous scheduler; its landed rows are
checked against :func:`aisim.deploy.deploy` on the same trace, and the balance query against
the deployment's own summary and against counts derived by hand.
"""

import json
import os
import pickle

import duckdb
import numpy as np
import pytest

from aisim.config.deployment import load_deployment_config
from aisim.config.engine import load_engine_config
from aisim.deploy import deploy
from aisim.errors import ConfigError, ShardFailed, SpecError
from aisim.pipeline import load_spec, spec_from_dict
from aisim.pipeline.run import run_pipeline
from aisim.pipeline.runkey import resolve_inputs, run_key
from aisim.query import bind
from aisim.traces import read_trace

from test_pipeline_common import EXAMPLES, PIPELINES, demo_dict, demo_spec, dump

FLEET = os.path.join(PIPELINES, "fleet.toml")
FLEET_TRACE = os.path.join(PIPELINES, "fleet-trace.jsonl")
ENGINE = os.path.join(EXAMPLES, "engine.json")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The fleet example landed in a fresh database: (path, open read-only connection)."""
    db = str(tmp_path_factory.mktemp("fleet") / "fleet.duckdb")
    rep = run_pipeline(FLEET, scheduler="sync", database=db)
    assert rep.landed
    con = duckdb.connect(db, read_only=True)
    yield db, con
    con.close()


def _shard(con, engine):
    return con.execute("SELECT shard_id FROM shards WHERE engine = ?", [engine]).fetchone()[0]


def _fleet_dict(database, engines, **extra):
    raw = {"name": "fleet", "database": str(database),
           "sources": [{"paths": [FLEET_TRACE], "format": "mooncake", "model": "llama-3.1-8b",
                        "options": {"unit_tokens": 64}}],
           "deployments": [{"model": "llama-3.1-8b", "engines": engines}]}
    raw.update(extra)
    return raw


# ---------------------------------------------------------------------------- the spec


def test_fleet_spec_names_deployments_inline_and_by_file():
    spec = load_spec(FLEET)
    engines = {e.name: e for _, e in spec.shards()}
    assert [e.name for _, e in spec.shards()] == ["kv4", "rr4", "single"]
    assert engines["single"].deployment is None
    assert engines["rr4"].deployment.replicas == 4 and engines["rr4"].deployment.router == "round_robin"
    assert engines["rr4"].deployment_path is None
    assert engines["kv4"].deployment == load_deployment_config(os.path.join(PIPELINES, "fleet-kv.toml"))
    assert engines["kv4"].deployment_path == "fleet-kv.toml"
    # Shard tasks carry the DeploymentConfig to any worker: it pickles.
    assert pickle.loads(pickle.dumps(engines["kv4"].deployment)) == engines["kv4"].deployment
    canon = {e["name"]: e for e in spec.canonical()["deployments"][0]["engines"]}
    assert "deployment" not in canon["single"]
    # Every option the kv_aware router acts on, and none other (ROUTER_KEYS' kinds).
    assert canon["kv4"]["deployment"] == {"replicas": 4, "router": {
        "kind": "kv_aware", "overlap_weight": 1.0, "view_delay_s": 0.0}}


def test_a_spec_without_deployments_keeps_its_canonical_form(tmp_path):
    spec = demo_spec(tmp_path / "db.duckdb")
    for d in spec.canonical()["deployments"]:
        for e in d["engines"]:
            assert set(e) == {"name", "path", "config"}


def test_the_deployment_file_is_part_of_the_run_key(tmp_path):
    dep = tmp_path / "dep.toml"
    dep.write_text("[deployment]\nreplicas = 2\n")
    raw = _fleet_dict(tmp_path / "db.duckdb", {"two": {"engine": ENGINE, "deployment": str(dep)}})
    spec = spec_from_dict(raw, base_dir=str(tmp_path))
    key = run_key(spec, resolve_inputs(spec))
    dep.write_text("[deployment]\nreplicas = 2  # same settings, other bytes\n")
    assert run_key(spec, resolve_inputs(spec)) != key


@pytest.mark.parametrize("entry, error, message", [
    ({"engine": ENGINE, "deployment": {"replicas": 2}, "extra": 1}, SpecError,
     "unknown key 'deployments[0].engines.x.extra'"),
    ({"deployment": {"replicas": 2}}, SpecError, "missing required key 'deployments[0].engines.x.engine'"),
    ({"engine": 3, "deployment": {"replicas": 2}}, SpecError, "'deployments[0].engines.x.engine'"),
    ({"engine": ENGINE, "deployment": 4}, SpecError, "'deployments[0].engines.x.deployment' in spec.toml must be"),
    ({"engine": ENGINE, "deployment": "nowhere.toml"}, SpecError, "names 'nowhere.toml', which is not a file"),
    ({"engine": ENGINE, "deployment": {"replicas": 0}}, ConfigError,
     "'deployment.replicas' in spec.toml [deployments[0].engines.x] must be an integer from 1 to 64, got 0"),
    ({"engine": ENGINE, "deployment": {"replicas": 2, "prefill": {"replicas": 1}}}, ConfigError,
     "'deployment.replicas' in spec.toml [deployments[0].engines.x]: a disaggregated deployment gives"),
    ({"engine": ENGINE, "deployment": {"prefill": {"replicas": 1, "engine": "none.json"}, "decode": {"replicas": 1},
                                       "link": {"bandwidth_gb_s": 50.0}}}, SpecError,
     "'deployments[0].engines.x.deployment.prefill.engine' in spec.toml names "),
    ({"engine": ENGINE, "deployment": {"prefill": {"replicas": 0}, "decode": {"replicas": 1},
                                       "link": {"bandwidth_gb_s": 50.0}}}, ConfigError,
     "'deployment.prefill.replicas' in spec.toml [deployments[0].engines.x] must be an integer from 1 to 64, got 0"),
])
def test_bad_deployment_entries_are_named(tmp_path, entry, error, message):
    with pytest.raises(error) as err:
        spec_from_dict(_fleet_dict(tmp_path / "db.duckdb", {"x": entry}), source="spec.toml", base_dir=str(tmp_path))
    assert message in str(err.value)


def test_reject_too_long_is_for_a_single_engine(tmp_path):
    raw = _fleet_dict(tmp_path / "db.duckdb", {"x": {"engine": ENGINE, "deployment": {"replicas": 2}}},
                      replay={"reject_too_long": True})
    with pytest.raises(SpecError, match=r"'replay.reject_too_long' in spec.toml applies to a single engine's "
                                        r"replay, not to deployment 'llama-3.1-8b/x'"):
        spec_from_dict(raw, source="spec.toml", base_dir=str(tmp_path))


def test_a_deployment_replays_the_re_timed_trace(tmp_path):
    """[replay] rate_scale re-times the trace before the router sees it: arrivals halve at rate_scale 2."""
    raw = _fleet_dict(tmp_path / "db.duckdb", {"x": {"engine": ENGINE, "deployment": {"replicas": 2}}},
                      replay={"rate_scale": 2.0})
    assert run_pipeline(spec_from_dict(raw, base_dir=str(tmp_path)), scheduler="sync").landed
    trace = read_trace(FLEET_TRACE, "mooncake", unit_tokens=64)
    with duckdb.connect(str(tmp_path / "db.duckdb"), read_only=True) as con:
        got = con.execute("SELECT routed_s, replica FROM requests ORDER BY request_index").fetchall()
    arrivals = trace.column("arrival_s").to_numpy() / 2.0
    assert [g[0] for g in got] == arrivals.tolist()
    assert [g[1] for g in got] == [i % 2 for i in range(600)]  # round robin


def test_a_closed_loop_deployment(tmp_path):
    """[replay] closed_loop drives a deployment's sessions: the landed rows are deploy()'s, closed loop."""
    from aisim.traces.parquet import write_trace
    from aisim.traces.synth import synth_trace

    dep = {"replicas": 2, "router": "session_affinity"}
    write_trace(synth_trace(300, seed=5, rate=30.0, prompt="lognormal:200:0.5", output="lognormal:24:0.5", turns=3,
                            think_time_s=0.05, model="llama-3.1-8b"), tmp_path / "sessions.parquet")
    raw = _fleet_dict(tmp_path / "db.duckdb", {"x": {"engine": ENGINE, "deployment": dep}},
                      replay={"closed_loop": True, "think_time_s": 0.25})
    raw["sources"] = [{"paths": [str(tmp_path / "sessions.parquet")], "format": "parquet", "model": "llama-3.1-8b"}]
    assert run_pipeline(spec_from_dict(raw, base_dir=str(tmp_path)), scheduler="sync").landed
    trace = read_trace(str(tmp_path / "sessions.parquet"), "parquet")
    want = deploy(trace, load_engine_config(ENGINE), dep, closed_loop=True, think_time_s=0.25).requests
    with duckdb.connect(str(tmp_path / "db.duckdb"), read_only=True) as con:
        got = con.execute("SELECT routed_s, replica, arrival_s, finish_s FROM requests ORDER BY request_index"
                          ).fetchall()
    assert got == list(zip(*(want.column(c).to_pylist() for c in ("routed_s", "replica", "arrival_s", "finish_s"))))
    sent = np.array([g[0] for g in got])
    assert (sent > trace.column("arrival_s").to_numpy()).any()  # later turns wait for their previous turn


def test_check_shows_each_shard_s_deployment(tmp_path):
    from click.testing import CliRunner

    from aisim.cli import main

    r = CliRunner().invoke(main, ["pipeline", "check", FLEET, "--db", str(tmp_path / "db.duckdb"), "--format", "csv"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [
        "shard_id,model,engine,engine_path,input_files,replicas,router",
        "0,llama-3.1-8b,kv4,../examples/engine.json,1,4,kv_aware",
        "1,llama-3.1-8b,rr4,../examples/engine.json,1,4,round_robin",
        "2,llama-3.1-8b,single,../examples/engine.json,1,,"]
    r = CliRunner().invoke(main, ["pipeline", "check", FLEET, "--db", str(tmp_path / "db.duckdb")])
    assert "shard 0: llama-3.1-8b on kv4 (../examples/engine.json; 4 replicas behind the kv_aware router; " \
           "1 input file(s))" in r.stdout


# ---------------------------------------------------------------------------- the rows


def test_deployment_shard_rows_are_deploy_rows(fleet):
    """Every landed request and step of the KV-aware shard is deploy()'s on the same trace."""
    _, con = fleet
    trace = read_trace(FLEET_TRACE, "mooncake", unit_tokens=64)
    want = deploy(trace, load_engine_config(ENGINE), load_deployment_config(os.path.join(PIPELINES, "fleet-kv.toml")))
    sid = _shard(con, "kv4")
    cols = ["request_id", "replica", "routed_s", "transfer_s", "arrival_s", "first_token_s", "finish_s",
            "ttft_s", "output_tokens", "cached_tokens", "preemptions", "status"]
    got = con.execute(f"SELECT {', '.join(cols)} FROM requests WHERE shard_id = ? ORDER BY request_index",
                      [sid]).fetchall()
    exp = want.requests.select(cols).to_pylist()
    assert got == [tuple(r[c] for c in cols) for r in exp]
    cols = ["replica", "step", "clock_s", "duration_s", "num_reqs", "prefill_tokens", "decode_tokens",
            "active_blocks", "cached_blocks", "prefix_hits"]
    got = con.execute(f"SELECT {', '.join(cols)} FROM steps WHERE shard_id = ?", [sid]).fetchall()
    assert got == [tuple(r[c] for c in cols) for r in want.steps.select(cols).to_pylist()]
    shard = con.execute("SELECT replicas, router, deployment_config, requests, steps FROM shards WHERE shard_id = ?",
                        [sid]).fetchone()
    assert shard[:2] == (4, "kv_aware")
    assert json.loads(shard[2]) == want.deployment.to_dict()
    assert shard[3:] == (600, want.steps.num_rows)
    summary = json.loads(con.execute("SELECT summary_json FROM summaries WHERE shard_id = ?", [sid]).fetchone()[0])
    assert summary["load_balance"] == want.summary["load_balance"]
    reps = con.execute("SELECT replica, requests, finished, steps, busy_s, utilisation, prefix_hit_rate, "
                       "ttft_p50_s FROM replicas WHERE shard_id = ? ORDER BY replica", [sid]).fetchall()
    assert reps == [(r["replica"], r["requests"], r["finished"], r["steps"], r["busy_s"], r["utilisation"],
                     r["prefix_hit_rate"], r["ttft_s"]["p50"]) for r in want.summary["replicas"]]


def test_a_single_engine_shard_has_no_replica_values(fleet):
    _, con = fleet
    sid = _shard(con, "single")
    assert con.execute("SELECT replicas, router, deployment_config FROM shards WHERE shard_id = ?",
                       [sid]).fetchone() == (None, None, None)
    assert con.execute("SELECT count(*), count(replica), count(routed_s), count(transfer_s) FROM requests "
                       "WHERE shard_id = ?", [sid]).fetchone() == (600, 0, 0, 0)
    assert con.execute("SELECT count(replica) FROM steps WHERE shard_id = ?", [sid]).fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM replicas WHERE shard_id = ?", [sid]).fetchone() == (0,)


def test_round_robin_balance_by_hand(fleet):
    """600 requests dealt in turn to 4 replicas: 150 each, a quarter each, imbalance 1."""
    _, con = fleet
    text, values = bind("load_balance", {})
    rows = [r for r in con.execute(text, values).fetchall() if r[2] == "rr4"]
    assert [(r[3], r[4], r[5], r[6], r[7], r[11]) for r in rows] == [("round_robin", w, None, 150, 0.25, 1.0)
                                                                    for w in range(4)]


def test_load_balance_query_matches_the_deployment_summary(fleet):
    _, con = fleet
    sid = _shard(con, "kv4")
    summary = json.loads(con.execute("SELECT summary_json FROM summaries WHERE shard_id = ?", [sid]).fetchone()[0])
    text, values = bind("load_balance", {"run": "fleet"})
    rows = [r for r in con.execute(text, values).fetchall() if r[0] == sid]
    per = summary["replicas"]
    assert [r[4] for r in rows] == [0, 1, 2, 3]
    assert [r[5] for r in rows] == [None] * 4  # no pools: replicas of one engine
    assert [r[6] for r in rows] == [p["requests"] for p in per]
    assert sum(r[6] for r in rows) == 600
    assert [r[7] for r in rows] == [round(p["requests"] / 600, 4) for p in per]
    assert [r[9] for r in rows] == [round(p["utilisation"], 4) for p in per]
    assert {r[11] for r in rows} == {round(summary["load_balance"]["requests_max_over_mean"], 4)}
    busy = [p["busy_s"] for p in per]
    assert {r[12] for r in rows} == {round(max(busy) / np.mean(busy), 4)}
    view = con.execute("SELECT count(*) FROM replica_balance").fetchone()[0]
    assert view == 8  # two deployment shards of four replicas; the single engine has none


def test_kv_cache_timeline_names_the_replica(fleet):
    _, con = fleet
    rows = con.execute("SELECT engine, count(DISTINCT replica), count(*) FROM kv_cache_timeline GROUP BY engine "
                       "ORDER BY engine").fetchall()
    steps = dict(con.execute("SELECT engine, count(*) FROM steps JOIN shards USING (run_id, shard_id) "
                             "GROUP BY engine").fetchall())
    assert rows == [("kv4", 4, steps["kv4"]), ("rr4", 4, steps["rr4"]), ("single", 0, steps["single"])]


# ---------------------------------------------------------------------------- refusals


def test_a_stepped_trace_cannot_feed_a_deployment(tmp_path):
    raw = demo_dict(tmp_path / "db.duckdb")
    raw["sources"] = raw["sources"][1:]  # the Qwen sample: arrivals by engine step
    raw["deployments"] = raw["deployments"][1:]
    raw["deployments"][0]["engines"] = {"fleet": {"engine": os.path.join(EXAMPLES, "qwen3-next-80b.json"),
                                                  "deployment": {"replicas": 2}}}
    spec = spec_from_dict(raw, source="spec.toml", base_dir=PIPELINES)
    with pytest.raises(ShardFailed) as err:
        run_pipeline(spec, scheduler="sync")
    msg = str(err.value)
    assert "shard 0 (model 'qwen3-next-80b', engine 'fleet') failed" in msg
    assert "qwen3-next-trace.jsonl: arrivals are engine steps (arrival_step); a deployment needs arrivals in " \
           "seconds" in msg
    assert not os.path.exists(tmp_path / "db.duckdb")


def test_a_trace_too_large_for_a_deployment_is_refused(tmp_path, monkeypatch):
    from aisim.pipeline import shards

    monkeypatch.setattr(shards, "MAX_DEPLOYMENT_REQUESTS", 599)
    raw = _fleet_dict(tmp_path / "db.duckdb", {"x": {"engine": ENGINE, "deployment": {"replicas": 2}}})
    with pytest.raises(ShardFailed, match=r"engine 'x'\) failed: a deployment replays at most 599 requests "
                                          r"\(it holds the whole trace; deployments do not stream yet\); "
                                          r"this shard has 600"):
        run_pipeline(spec_from_dict(raw, base_dir=str(tmp_path)), scheduler="sync")


# ---------------------------------------------------------------------------- landing


def test_deployments_land_with_keep_parquet(fleet, tmp_path):
    """requests and steps kept as Parquet: the replica columns are in their views, replicas stays a table."""
    db, _ = fleet
    raw = _fleet_dict(tmp_path / "kept.duckdb", {"rr4": {"engine": ENGINE, "deployment": {"replicas": 4}}},
                      landing={"keep_parquet": True})
    rep = run_pipeline(spec_from_dict(raw, base_dir=str(tmp_path)), scheduler="sync")
    assert rep.landed and rep.rows["replicas"] == 4
    kept = dump(str(tmp_path / "kept.duckdb"))
    con = duckdb.connect(db, read_only=True)
    try:
        sid = _shard(con, "rr4")
        full = con.execute("SELECT replica, count(*) FROM requests WHERE shard_id = ? GROUP BY ALL ORDER BY 1",
                           [sid]).fetchall()
    finally:
        con.close()
    with duckdb.connect(str(tmp_path / "kept.duckdb"), read_only=True) as k:
        assert k.execute("SELECT table_type FROM information_schema.tables WHERE table_name = 'replicas'"
                         ).fetchone() == ("BASE TABLE",)
        assert k.execute("SELECT replica, count(*) FROM requests GROUP BY ALL ORDER BY 1").fetchall() == full
    assert len(kept["replicas"]) == 4
