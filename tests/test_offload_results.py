"""KV offload in a pipeline run's results: the landed step, request and summary columns, the
``offload_tiers`` view, the ``offload`` named query, and the run report's section."""

import copy
import json
import os
import tempfile

import duckdb
import pytest

from aisim.config.engine import engine_config_from_dict
from aisim.pipeline import graph, spec_from_dict
from aisim.pipeline.run import build_plan
from aisim.pipeline.runkey import resolve_inputs, run_key
from aisim.pipeline.staging import Staging
from aisim.query import bind
from aisim.replay import replay
from aisim.traces import read_trace

from test_pipeline_common import EXAMPLES, PIPELINES, demo_dict
from test_sql_library import land_staged_results

# A synchronous Llama-3.1-8B engine on one H100 (the offload replay runs synchronous scheduling).
BASE = {"block_size": 16, "enable_chunked_prefill": True, "enable_prefix_caching": True,
        "kv_cache_groups": [{"type": "full"}], "long_prefill_token_threshold": 0, "max_model_len": 8192,
        "max_num_batched_tokens": 2048, "max_num_seqs": 128, "model": "llama-3.1-8b", "num_gpu_blocks": 2048,
        "async_scheduling": False, "time_model": {"gpu": "H100", "kind": "roofline", "tp": 1}}
# A pool that churns (600 blocks for 2,000 requests of up to 8,192 tokens) with and without a CPU tier.
SMALL = dict(BASE, num_gpu_blocks=600)
TIER = dict(SMALL, kv_offload={"cpu_blocks": 4000, "kv_bytes_per_block": 2097152})


def land_engines(con, name, engines):
    """The demo spec's first source replayed on ``engines`` (name -> engine dict) and landed in
    ``con`` as run ``name``; returns the run key."""
    raw = demo_dict(":memory:", name=name)
    raw["sources"] = raw["sources"][:1]
    raw["deployments"] = [{"model": "llama-3.1-8b", "engines": copy.deepcopy(engines)}]
    spec = spec_from_dict(raw, source="test-spec.toml", base_dir=PIPELINES)
    with tempfile.TemporaryDirectory(prefix="aisim-stage-") as tmp:
        inputs = resolve_inputs(spec)
        key = run_key(spec, inputs)
        stage = Staging(tmp)
        results, _, _ = graph.execute(build_plan(spec, inputs, key, stage), scheduler="sync")
        for r in results:
            r["stage"] = stage
        land_staged_results(con, key, name, results)
    return key


def _run(con):
    return land_engines(con, "tiers", {"small": SMALL, "tier": TIER})


@pytest.fixture(scope="module")
def landed():
    con = duckdb.connect()
    key = _run(con)
    yield con, key
    con.close()


@pytest.fixture(scope="module")
def direct():
    trace = read_trace(os.path.join(EXAMPLES, "trace.jsonl"), "oracle", max_model_len=8192)
    return replay(trace, engine_config_from_dict(TIER))


def test_the_landed_columns_are_the_replays(landed, direct):
    con, key = landed
    s = direct.summary["kv_offload"]
    row = con.execute("SELECT offload_cpu_chunks, offload_loads, offload_load_tokens, offload_store_chunks, "
                      "offload_cpu_evicted, offload_hits, prefix_hit_tokens_at_admission FROM summaries "
                      "JOIN shards USING (run_id, shard_id) WHERE engine = 'tier'").fetchone()
    assert row == (4000, s["loads"], s["load_tokens"], s["store_chunks"], s["cpu_evicted_chunks"],
                   s["connector_prefix_cache_stats"]["hits"], direct.summary["prefix_hit_tokens_at_admission"])
    assert s["loads"] > 0 and s["cpu_evicted_chunks"] > 0  # the tier is used, and churns too
    got = con.execute("SELECT sum(r.offload_hit_tokens), sum(r.offload_store_chunks), count(r.offload_loads) "
                      "FROM requests r JOIN shards USING (run_id, shard_id) WHERE engine = 'tier'").fetchone()
    rq = direct.requests
    assert got == (sum(rq.column("offload_hit_tokens").to_pylist()), sum(rq.column("offload_store_chunks").to_pylist()),
                   rq.num_rows)
    steps = con.execute("SELECT sum(s.offload_load_chunks), max(s.offload_cpu_used) FROM steps s "
                        "JOIN shards USING (run_id, shard_id) WHERE engine = 'tier'").fetchone()
    assert steps == (s["load_chunks"], max(direct.steps.column("offload_cpu_used").to_pylist()))
    # The shard without a tier: NULL columns, zero totals.
    none = con.execute("SELECT count(r.offload_loads), min(sm.offload_cpu_chunks) FROM requests r JOIN summaries sm "
                       "USING (run_id, shard_id) JOIN shards USING (run_id, shard_id) WHERE engine = 'small'").fetchone()
    assert none == (0, 0)


def test_offload_tiers_view_and_query(landed, direct):
    con, key = landed
    rows = con.execute("SELECT engine, cpu_chunks, gpu_hit_rate, cpu_hit_rate, load_tokens, ttft_p99_s "
                       "FROM offload_tiers ORDER BY engine").fetchall()
    s = direct.summary
    cs = s["kv_offload"]["connector_prefix_cache_stats"]
    assert [r[0] for r in rows] == ["small", "tier"]
    assert rows[0][1] == 0 and rows[0][3] is None
    assert rows[1][1:] == (4000, pytest.approx(s["prefix_hit_rate"]), pytest.approx(cs["hits"] / cs["queries"]),
                           s["kv_offload"]["load_tokens"], pytest.approx(s["ttft_s"]["p99"]))
    text, values = bind("offload", {"run": key})
    out = con.execute(text, values)
    names = [d[0] for d in out.description]
    got = [dict(zip(names, r)) for r in out.fetchall()]
    assert [g["engine"] for g in got] == ["small", "tier"]
    assert got[1]["ttft_p50_without_s"] == got[0]["ttft_p50_s"]
    assert got[1]["ttft_p99_ratio"] == pytest.approx(round(got[1]["ttft_p99_s"] / got[0]["ttft_p99_s"], 4), abs=1e-3)


def test_summary_columns_read_the_tiers_summary(direct):
    from aisim.columns import SUMMARIES

    for col in SUMMARIES.columns:
        if col.summary is not None and col.summary[0] == "kv_offload":
            v = direct.summary
            for key in col.summary:
                assert key in v, col.name
                v = v[key]


def test_the_report_has_a_tier_section(landed, direct, tmp_path):
    from aisim.report.data import load_run
    from aisim.report.html import render
    from aisim.report.offload import has_tier, offload_panel, tier_rates

    con, key = landed
    db = tmp_path / "tiers.duckdb"
    con.execute(f"ATTACH '{db}' AS f")
    con.execute("COPY FROM DATABASE memory TO f")
    con.execute("DETACH f")
    rd = load_run(str(db), key)
    tier = next(sd for sd in rd.shards if sd.shard["engine"] == "tier")
    small = next(sd for sd in rd.shards if sd.shard["engine"] == "small")
    assert has_tier(tier) and not has_tier(small) and offload_panel(small, 100) == ""
    rates = tier_rates(tier)
    rq = direct.requests
    prompt = sum(rq.column("prompt_tokens").to_pylist())
    assert rates["cpu_hit_rate"] == sum(rq.column("offload_hit_tokens").to_pylist()) / prompt
    assert rates["gpu_hit_rate"] == sum(rq.column("cached_tokens").to_pylist()) / prompt
    html = render(rd)
    assert html.count("<h3>KV offload</h3>") == 1 and 'id="cmp-offload-ttft"' in html
    assert 'data-key="offload_cpu_hit_rate"' in html and 'id="off-used-' in html


def test_a_deployment_shard_lands_every_replicas_tier(tmp_path):
    from aisim.deploy import deploy
    from aisim.pipeline import run_pipeline

    from test_pipeline_deploy import FLEET_TRACE, _fleet_dict

    eng = tmp_path / "tier.json"
    eng.write_text(json.dumps(dict(BASE, num_gpu_blocks=1200, kv_offload={"cpu_blocks": 3000})))
    raw = _fleet_dict(tmp_path / "db.duckdb", {"two": {"engine": str(eng), "deployment": {"replicas": 2}}})
    rep = run_pipeline(spec_from_dict(raw, source="spec.toml", base_dir=str(tmp_path)), scheduler="sync")
    assert rep.landed
    con = duckdb.connect(str(tmp_path / "db.duckdb"), read_only=True)
    trace = read_trace(FLEET_TRACE, "mooncake", unit_tokens=64)
    d = deploy(trace, engine_config_from_dict(json.loads(eng.read_text())), {"replicas": 2})
    per = con.execute("SELECT replica, offload_cpu_chunks, offload_loads, offload_load_tokens, offload_store_chunks "
                      "FROM replicas ORDER BY replica").fetchall()
    assert per == [(w, 3000, s["kv_offload"]["loads"], s["kv_offload"]["load_tokens"], s["kv_offload"]["store_chunks"])
                   for w, s in enumerate(d.summary["replicas"])]
    assert all(r[2] > 0 for r in per)  # both tiers are used
    total = con.execute("SELECT offload_cpu_chunks, offload_loads FROM summaries").fetchone()
    assert total == (6000, d.summary["kv_offload"]["loads"])
    got = con.execute("SELECT replica, sum(offload_hit_tokens) FROM requests GROUP BY replica ORDER BY replica")
    want = {}
    for w, h in zip(d.requests.column("replica").to_pylist(), d.requests.column("offload_hit_tokens").to_pylist()):
        want[w] = want.get(w, 0) + h
    assert got.fetchall() == sorted(want.items())
    con.close()
