"""Sweeps over deployments: replicas, routers and the prefill/decode split as knobs, GPUs counted
over every replica, goodput over the whole deployment."""

import json

import duckdb
import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.config.deployment import load_deployment_config
from aisim.config.engine import engine_config_from_dict, load_engine_config
from aisim.deploy import deploy
from aisim.errors import SweepError
from aisim.sweep import load_sweep, run_sweep
from aisim.traces import read_trace

# Two requests of 100 prompt tokens and 10 output tokens, both arriving at 0 s.  One request at a
# time per engine (max_num_seqs 1); a step takes 10 ms plus 0.1 ms per scheduled token: a prefill
# 20 ms, a decode 10.1 ms.
TRACE = [{"request_id": f"r{i}", "prompt_len": 100, "max_tokens": 10, "arrival_time": 0.0} for i in range(2)]
BASE = {"num_gpu_blocks": 400, "block_size": 16, "max_model_len": 1024, "max_num_batched_tokens": 2048,
        "max_num_seqs": 1, "time_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4}}
PREFILL_S = 0.01 + 100 * 1e-4
DECODE_S = 0.01 + 1e-4


def _toml(v) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if v == float("inf"):
        return "inf"
    return json.dumps(v)


def _write(tmp_path, grid, slo, deployment=None, extra=""):
    (tmp_path / "trace.jsonl").write_text("\n".join(json.dumps(t) for t in TRACE) + "\n")
    (tmp_path / "base.json").write_text(json.dumps(BASE))
    dep = f"deployment = {_toml(deployment)}\n" if deployment is not None else ""
    grid_toml = "\n".join(f"{k} = {_toml(v)}" for k, v in grid.items())
    slo_toml = "\n".join(f"{k} = {v}" for k, v in slo.items())
    (tmp_path / "sweep.toml").write_text(
        'name = "s"\ndatabase = "s.duckdb"\nmodel = "m"\nbase = "base.json"\nbest = "best.toml"\n' + dep + extra +
        '[trace]\npaths = ["trace.jsonl"]\nformat = "oracle"\n'
        f"[grid]\n{grid_toml}\n[slo]\n{slo_toml}\n")
    return str(tmp_path / "sweep.toml")


def test_two_replicas_meet_the_ttft_slo_that_one_misses(tmp_path):
    # One replica: r0 prefills (first token at 20 ms) and decodes 9 tokens (done at 20 + 9 x 10.1
    # = 110.9 ms); only then r1 prefills: first token at 130.9 ms, over the 50 ms SLO; its last
    # token at 221.8 ms, the last response: the run lasts 221.8 ms from the first send (vllm bench
    # serve's duration; the engine's closing empty step does not count).  Goodput 1 / 0.2218.  Two
    # replicas behind round robin: one request each, both first tokens at 20 ms, both done at
    # 110.9 ms: goodput 2 / 0.1109.  Three replicas: the same goodput (the third is idle) on 3 GPUs,
    # so two replicas rank first.
    path = _write(tmp_path, {"replicas": [1, 2, 3]}, {"ttft_s": 0.05})
    result = run_sweep(load_sweep(path), scheduler="sync")
    one_done = PREFILL_S + 9 * DECODE_S
    by = {c.knobs["replicas"]: c for c in result.candidates}
    assert [c.knobs for c in result.ranked] == [{"replicas": 2}, {"replicas": 3}, {"replicas": 1}]
    assert [by[n].gpus for n in (1, 2, 3)] == [1, 2, 3]
    assert [by[n].slo_attainment for n in (1, 2, 3)] == [0.5, 1.0, 1.0]
    assert by[1].goodput_req_s == pytest.approx(1 / (2 * one_done), rel=1e-12)
    assert by[2].goodput_req_s == pytest.approx(2 / one_done, rel=1e-12)
    assert by[3].goodput_req_s == by[2].goodput_req_s
    # p99 of TTFTs 20 ms and 130.9 ms, interpolated as numpy does.
    assert by[1].ttft_p99_s == pytest.approx(PREFILL_S + 0.99 * one_done, rel=1e-12)
    assert by[2].ttft_p99_s == pytest.approx(PREFILL_S, rel=1e-12)
    # The best deployment is written beside the best engine, and loads back.
    dep = load_deployment_config(tmp_path / "best-deployment.toml")
    assert (dep.replicas, dep.router) == (2, "round_robin")
    assert load_engine_config(tmp_path / "best.toml").max_num_seqs == 1
    with duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT candidate, knobs, rank, gpus, deployment FROM sweep_candidates "
                           "ORDER BY candidate").fetchall()
        shards = con.execute("SELECT engine, replicas, router FROM shards ORDER BY engine").fetchall()
    assert [(r[0], json.loads(r[1]), r[2], r[3]) for r in rows] == [
        ("c000", {"replicas": 1}, 3, 1), ("c001", {"replicas": 2}, 1, 2), ("c002", {"replicas": 3}, 2, 3)]
    assert json.loads(rows[1][4])["replicas"] == 2
    assert shards == [("c000", 1, "round_robin"), ("c001", 2, "round_robin"), ("c002", 3, "round_robin")]


def test_routers_and_their_options_are_knobs(tmp_path):
    # A router option its router does not act on refuses the candidate, naming it.
    grid = {"replicas": [2], "router": ["round_robin", {"kind": "round_robin", "seed": 3},
                                       {"kind": "least_loaded", "by": "tokens"}]}
    path = _write(tmp_path, grid, {"ttft_s": 0.05}, deployment={"replicas": 4, "router": "kv_aware"})
    result = run_sweep(load_sweep(path), scheduler="sync")
    c0, c1, c2 = result.candidates
    assert c1.refused and "the round_robin router does not act on 'seed'" in c1.reason
    assert "candidate c001" in c1.reason
    # Round robin and least loaded both put one request on each replica: a tie, broken by grid order.
    assert [c.name for c in result.ranked] == ["c000", "c002"]
    assert c2.deployment.router == "least_loaded" and c2.deployment.options["by"] == "tokens"
    assert c0.slo_attainment == c2.slo_attainment == 1.0
    r = CliRunner().invoke(main, ["sweep", path, "--scheduler", "sync", "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["ranked"][1]["knobs"] == {"replicas": 2, "router": {"kind": "least_loaded", "by": "tokens"}}
    assert doc["ranked"][1]["deployment"]["router"]["kind"] == "least_loaded"
    assert doc["refused"][0]["candidate"] == "c001"
    r = CliRunner().invoke(main, ["sweep", path, "--scheduler", "sync"], env={"COLUMNS": "60"})
    assert r.exit_code == 0, r.output
    # The table folds a long knob over lines rather than cut it.
    assert "…" not in r.stdout
    assert "least_loaded" in r.stdout.replace("\n", "").replace("│", "").replace(" ", "")


PD = {"prefill": {"replicas": 1}, "decode": {"replicas": 1}, "link": {"bandwidth_gb_s": float("inf")}}


def test_prefill_decode_split(tmp_path):
    # One prefill replica prefills r0 (first token at 20 ms), then r1 (40 ms, over the 30 ms SLO);
    # two prefill replicas give both their first token at 20 ms.  A pool of no replicas is refused.
    path = _write(tmp_path, {"prefill_replicas": [0, 1, 2], "decode_replicas": [1]}, {"ttft_s": 0.03},
                  deployment=PD)
    result = run_sweep(load_sweep(path), scheduler="sync")
    c0, c1, c2 = result.candidates
    assert c0.refused and "'deployment.prefill.replicas'" in c0.reason and "got 0" in c0.reason
    assert [c.name for c in result.ranked] == ["c002", "c001"]
    assert (c1.gpus, c2.gpus) == (2, 3)
    assert (c1.slo_attainment, c2.slo_attainment) == (0.5, 1.0)
    assert c1.ttft_p99_s == pytest.approx(PREFILL_S + 0.99 * PREFILL_S, rel=1e-12)
    # Goodput is the deployment's: deploy() of the same trace, its SLO-meeting requests per second.
    trace = read_trace(str(tmp_path / "trace.jsonl"), "oracle")
    for c, met in ((c1, 1), (c2, 2)):
        want = deploy(trace, engine_config_from_dict(BASE), c.deployment)
        assert c.goodput_req_s == met / want.summary["duration_s"]
        assert c.ttft_p99_s == want.summary["ttft_s"]["p99"]
    dep = load_deployment_config(tmp_path / "best-deployment.toml")
    assert (dep.prefill.replicas, dep.decode.replicas, dep.link.bandwidth_gb_s) == (2, 1, float("inf"))
    with duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True) as con:
        pools = con.execute("SELECT pool, count(*) FROM replicas JOIN shards USING (run_id, shard_id) "
                            "WHERE engine = 'c002' GROUP BY pool ORDER BY pool").fetchall()
    assert pools == [("decode", 1), ("prefill", 2)]


@pytest.mark.parametrize("grid, deployment, extra, message", [
    ({"prefill_replicas": [1]}, None, "", "'grid.prefill_replicas' in {} varies a pool of a disaggregated"),
    ({"prefill_router": ["kv_aware"]}, {"replicas": 2}, "", "'grid.prefill_router' in {} varies a pool"),
    ({"replicas": [1, 2]}, PD, "", "'grid.replicas' in {}: the base deployment is disaggregated; vary "
                                   "prefill_replicas, decode_replicas"),
    ({"replicas": [1], "max_model_len": [512]}, None, "", "'grid.max_model_len' in {}: a deployment refuses"),
    ({"max_num_seqs": [1]}, "nowhere.toml", "", "'deployment' in {} names 'nowhere.toml', which is not a file"),
    ({"max_num_seqs": [1]}, {"replicas": 2, "speed": 1}, "", "unknown key 'deployment.speed'"),
    ({"max_num_seqs": [1]}, None, 'best_deployment = "d.toml"\n', "'best_deployment' in {} needs a deployment"),
])
def test_bad_deployment_sweeps_are_named(tmp_path, grid, deployment, extra, message):
    path = _write(tmp_path, grid, {"ttft_s": 1.0}, deployment=deployment, extra=extra)
    with pytest.raises(SweepError) as err:
        load_sweep(path)
    assert message.format(path) in str(err.value)


def test_the_fleet_sweep_example(tmp_path):
    """pipelines/fleet-sweep.toml: replicas x router on the fleet trace."""
    import os

    from test_pipeline_common import PIPELINES

    spec = load_sweep(os.path.join(PIPELINES, "fleet-sweep.toml"))
    spec.database = str(tmp_path / "fleet-sweep.duckdb")
    spec.best, spec.best_deployment = str(tmp_path / "best.toml"), str(tmp_path / "best-deployment.toml")
    result = run_sweep(spec, scheduler="sync")
    cands = result.candidates
    assert [(c.knobs["replicas"], c.gpus) for c in cands] == [(1, 1), (1, 1), (2, 2), (2, 2), (4, 4), (4, 4)]
    trace = read_trace(spec.trace["paths"][0], "mooncake", unit_tokens=64)
    for c in cands:  # each candidate's p99 TTFT is its deployment's, replayed directly
        want = deploy(trace, c.engine, c.deployment)
        assert c.ttft_p99_s == want.summary["ttft_s"]["p99"], c.name
    # One replica cannot keep the TTFT within 0.5 s (either router: with one replica they agree);
    # two and four replicas meet the SLO for every request.
    assert cands[0].goodput_req_s == cands[1].goodput_req_s and cands[0].slo_attainment < 0.5
    assert [c.slo_attainment for c in cands[2:]] == [1.0] * 4
    assert [c.name for c in result.ranked][-2:] == ["c000", "c001"]
    assert load_deployment_config(spec.best_deployment) == result.best.deployment
