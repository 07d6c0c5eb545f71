"""KV offload tiers in deployments whose copies are timed on the PCIe link (docs/kv-offload.md,
"Deployments"): every replica has its own tier and its own link, and each replica replays its share
exactly as a single engine with the same tier does.

Block size 16, one CPU chunk per GPU block of 100 MiB; the default step takes 10 ms.  PCIe 4.0 x16
moves 16e9 * 128/130 / 8 * 16 = 31.5e9 bytes/s: a chunk crosses in 104857600 / 31.5e9 = 3.328 ms.
"""

import pytest

from aisim.config.engine import engine_config_from_dict
from aisim.deploy import deploy
from aisim.errors import ConfigError
from aisim.replay import replay

from helpers import ipc_bytes, make_trace
from test_kv_offload import _engine, _req

CHUNK = 100 * 2**20
CHUNK_S = CHUNK / (16e9 * 128 / 130 / 8 * 16)

# Round-robin over two replicas in arrival order: A, B, C, F to replica 0; D, E, G to replica 1.
# A and D (64 tokens each, 4 blocks) are stored at once, each over its replica's own link.  B evicts
# A's blocks from replica 0's GPU; C (p + 16) loads A's 4 chunks from replica 0's tier: step 6 issues
# the load at 10.01 (the end of its forward pass), it lands at 10.01 + 4 * 3.328 ms = 10.023312, and
# the empty step 6 polls until F reaches replica 0 at 10.015 -- not until G reaches replica 1 at
# 10.012, nor until the copy lands.  Step 7 runs F and its poll at 10.025 reports the load; C runs in
# step 8 from its 64 loaded tokens (TTFT 10.035 - 10).
TRACE = [_req("A", 0, 64, "p", 64), _req("D", 0, 64, "q", 64), _req("B", 5, 159), _req("E", 7, 20),
         _req("C", 10, 80, "p", 64), _req("G", 10.012, 20), _req("F", 10.015, 20)]


def _cfg():
    return engine_config_from_dict(_engine(11, cpu_blocks=20, pcie_gen=4, kv_bytes_per_block=CHUNK))


def test_a_replica_replays_its_share_as_one_engine_with_transfers_on_the_clock():
    from aisim.decisionlog import decision_lines, log_line_json

    cfg = _cfg()
    d = deploy(make_trace(TRACE, "time"), cfg, {"replicas": 2, "router": "round_robin"}, record_decisions=True)
    rq = d.requests.to_pydict()
    assert rq["replica"] == [0, 1, 0, 1, 0, 1, 0]
    assert rq["offload_hit_tokens"] == [0, 0, 0, 0, 64, 0, 0]
    assert rq["ttft_s"][4] == pytest.approx(0.035)
    alone = replay(make_trace([TRACE[0], TRACE[2], TRACE[4], TRACE[6]], "time"), cfg, record_decisions=True)
    assert [log_line_json(x) for x in decision_lines(d.replicas[0])] == \
        [log_line_json(x) for x in decision_lines(alone)]
    zero = d.requests.column("replica").to_numpy() == 0
    mine = d.requests.filter(zero).select(alone.requests.column_names)
    assert ipc_bytes(mine.combine_chunks()) == ipc_bytes(alone.requests.combine_chunks())
    zero = d.steps.column("replica").to_numpy() == 0
    steps = d.steps.filter(zero).select(alone.steps.column_names)
    assert ipc_bytes(steps.combine_chunks()) == ipc_bytes(alone.steps.combine_chunks())
    # Step 6 issues the load, computes nothing and polls until F arrives at 10.015.
    st = alone.steps.to_pydict()
    assert st["offload_loads"][6] == 1 and st["num_reqs"][6] == 0
    assert st["clock_s"][6] == pytest.approx(10.0) and st["duration_s"][6] == pytest.approx(0.015)
    assert st["offload_completed"][7] == 1 and st["num_reqs"][8] == 1


def test_each_replica_copies_over_its_own_link():
    # A's store on replica 0 and D's on replica 1 are submitted together when step 1 begins; each
    # crosses its own link in 4 * 3.328 ms = 13.312 ms (one shared link would need twice that for one).
    d = deploy(make_trace(TRACE, "time"), _cfg(), {"replicas": 2, "router": "round_robin"})
    st = d.steps.to_pydict()
    first = {(w, s): dur for w, s, dur in zip(st["replica"], st["step"], st["duration_s"])}
    assert first[(0, 1)] == pytest.approx(4 * CHUNK_S) == pytest.approx(0.013312)
    assert first[(1, 1)] == pytest.approx(4 * CHUNK_S)
    # B's 9 chunks on replica 0: 9 * 3.328 ms.
    assert first[(0, 4)] == pytest.approx(9 * CHUNK_S) == pytest.approx(0.029952)
    assert d.summary["kv_offload"]["load_bytes"] == 4 * CHUNK


@pytest.mark.parametrize("frontend", [False, True])
def test_every_replica_is_its_share_on_a_random_trace(frontend):
    # 120 requests over five shared prefixes, a KV-aware router, tiers of 16 MiB chunks on PCIe 3.0 x4
    # (4.3 ms a chunk): every replica's rows are a single engine's replaying its share.  With the API
    # server in front (3 ms a request), a poll ends when the server hands the next request over.
    import random

    rng = random.Random(3)
    eng = _engine(60, cpu_blocks=100, pcie_gen=3, pcie_lanes=4, kv_bytes_per_block=2**24)
    eng.update(max_model_len=1024, max_num_seqs=8, time_model={
        "kind": "linear", "base_s": 0.01, "per_token_s": 1e-4, "frontend": frontend, "frontend_per_request_s": 0.003})
    cfg = engine_config_from_dict(eng)
    trace, t = [], 0.0
    for i in range(120):
        t += rng.expovariate(40)
        shared = rng.choice([64, 128, 256])
        prompt = shared + rng.randint(1, 200)
        trace.append({"id": f"r{i}", "at": t, "prompt": prompt, "max_tokens": rng.randint(1, 20),
                      "segments": [(f"p{rng.randint(1, 5)}", 0, shared), (f"own{i}", shared, prompt - shared)]})
    d = deploy(make_trace(trace, "time"), cfg, {"replicas": 3, "router": "kv_aware"})
    rep = d.requests.column("replica").to_pylist()
    assert sorted(set(rep)) == [0, 1, 2] and d.summary["kv_offload"]["loads"] > 0
    for w in range(3):
        alone = replay(make_trace([r for r, x in zip(trace, rep) if x == w], "time"), cfg)
        mine = d.requests.filter(d.requests.column("replica").to_numpy() == w).select(alone.requests.column_names)
        assert ipc_bytes(mine.combine_chunks()) == ipc_bytes(alone.requests.combine_chunks())
        steps = d.steps.filter(d.steps.column("replica").to_numpy() == w).select(alone.steps.column_names)
        assert ipc_bytes(steps.combine_chunks()) == ipc_bytes(alone.steps.combine_chunks())


# ---------------------------------------------------------------- disaggregated pools

def _pd_engine(blocks, **offload):
    # 2 layers x 1024-byte pages: 2048 bytes a block on the prefill-to-decode link.
    from test_offload_surfaces import _engine as engine

    return engine_config_from_dict(dict(engine(**offload), num_gpu_blocks=blocks))


def _pd_req(rid, at, prompt, shared=None, shared_len=0, max_tokens=1):
    return _req(rid, at, prompt, shared, shared_len, max_tokens)


def test_a_prefill_pool_keeps_its_own_tier():
    # One prefill replica with a 20-block tier (step clock), one decode replica of 40 blocks without one;
    # a link of 0.2 MB/s.  A (64 tokens of p, 3 outputs) runs in prefill step 0; its 4 blocks stay held
    # until its transfer lands, 4 * 2048 / 2e5 = 40.96 ms later (0.05096), while its 4 chunks are stored.
    # B (159 tokens, 10 blocks) arrives at 0.02 and waits: 6 blocks are free until A's land; steps at
    # 0.02 .. 0.05 schedule nothing, B runs in the step at 0.06 (TTFT 50 ms) and evicts p from the GPU.
    # C (p + 16) misses on the GPU and loads p's 64 tokens from the prefill replica's tier (issued at
    # 0.10, reported at 0.11, run at 0.12: TTFT 30 ms); its 5 blocks cross in 51.2 ms and it decodes
    # its two other tokens on the decode replica (E2E 0.13 + 0.0512 + 0.02 - 0.10).
    trace = [_pd_req("A", 0, 64, "p", 64, 3), _pd_req("B", 0.02, 159), _pd_req("C", 0.1, 80, "p", 64, 3)]
    d = deploy(make_trace(trace, "time"), _pd_engine(11, cpu_blocks=20),
               {"prefill": {"replicas": 1}, "decode": {"replicas": 1, "engine": _pd_engine(40)},
                "link": {"bandwidth_gb_s": 0.0002}})
    rq = d.requests.to_pydict()
    assert rq["transfer_s"][0] == pytest.approx(4 * 2048 / 2e5) and rq["transfer_s"][2] == pytest.approx(5 * 2048 / 2e5)
    assert rq["ttft_s"] == pytest.approx([0.01, 0.05, 0.03])
    assert rq["e2e_s"][2] == pytest.approx(0.13 + 0.0512 + 0.02 - 0.1)
    assert rq["offload_hit_tokens"] == [0, 0, 64] and rq["offload_store_chunks"] == [4, 9, 1]
    st = d.steps.to_pydict()
    assert st["waiting"][:7] == [0, 0, 1, 1, 1, 1, 0] and st["free_blocks"][:7] == [6, 6, 6, 6, 6, 6, 10]
    # The decode replica has no tier: its offload columns are null, its summary has no kv_offload.
    assert st["offload_loads"] == [0] * 8 + [1] + [0] * 3 + [None] * 6
    assert ["kv_offload" in r for r in d.summary["replicas"]] == [True, False]
    off = d.summary["kv_offload"]
    assert (off["cpu_chunks"], off["loads"], off["load_tokens"], off["store_chunks"]) == (20, 1, 64, 14)


def test_a_decode_pool_with_a_tier_is_refused():
    trace = make_trace([_pd_req("A", 0, 64)], "time")
    link = {"bandwidth_gb_s": 1.0}
    with pytest.raises(ConfigError, match=r"prefill replicas only \(vLLM's MultiConnector of NixlConnector and "
                                          r"OffloadingConnector\).*'deployment.decode.engine'"):
        deploy(trace, _pd_engine(11, cpu_blocks=20), {"prefill": {"replicas": 1}, "decode": {"replicas": 1},
                                                       "link": link})
    with pytest.raises(ConfigError, match="remove the decode pool engine's 'kv_offload' section"):
        deploy(trace, _pd_engine(11), {"prefill": {"replicas": 1},
                                       "decode": {"replicas": 1, "engine": _pd_engine(40, cpu_blocks=20)},
                                       "link": link})


def test_a_disaggregated_folder_with_a_prefill_tier_reports_and_compares(tmp_path):
    # The folder of a disaggregated deployment renders (its pools' routers read from its summary), with
    # the prefill tier's panel; `aisim compare` against the same deployment without the tier shows it.
    import json

    from click.testing import CliRunner

    from aisim.cli import main
    from aisim.deploy import write_deployment

    trace = [_pd_req("A", 0, 64, "p", 64, 3), _pd_req("B", 0.02, 159), _pd_req("C", 0.1, 80, "p", 64, 3)]
    for name, off in (("tier", {"cpu_blocks": 20}), ("none", {})):
        d = deploy(make_trace(trace, "time"), _pd_engine(11, **off),
                   {"prefill": {"replicas": 1}, "decode": {"replicas": 1, "engine": _pd_engine(40)},
                    "link": {"bandwidth_gb_s": 0.0002}})
        write_deployment(d, str(tmp_path / name))
    r = CliRunner().invoke(main, ["report", "--replay", str(tmp_path / "tier"), "--out", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    assert "KV offload" in (tmp_path / "r.html").read_text()
    r = CliRunner().invoke(main, ["compare", str(tmp_path / "none"), str(tmp_path / "tier"), "--format", "json"])
    assert r.exit_code == 0, r.output
    m = {x["metric"]: x for x in json.loads(r.stdout)["metrics"]}
    assert (m["offload_hits"]["a"], m["offload_hits"]["b"], m["offload_store_chunks"]["delta"]) == (0, 64, 14)
    assert m["offload_hit_rate"]["b"] == pytest.approx(64 / 303)


def test_a_pipeline_lands_a_prefill_tier(tmp_path):
    # The fleet trace through two prefill replicas with 16 GiB tiers on PCIe 5.0 and one decode replica
    # without: the landed totals are the deployment's own, the decode replica's step rows have NULL
    # offload columns and its replicas row 0.
    import json

    import duckdb

    from aisim.config.engine import load_engine_config
    from aisim.pipeline import spec_from_dict
    from aisim.pipeline.run import run_pipeline
    from aisim.traces import read_trace

    from test_pipeline_deploy import ENGINE, FLEET_TRACE, _fleet_dict

    with open(ENGINE, encoding="utf-8") as fh:
        eng = json.load(fh)
    eng.update(async_scheduling=False, num_gpu_blocks=300, max_model_len=8192)
    (tmp_path / "decode.json").write_text(json.dumps(eng))
    eng["kv_offload"] = {"size_gib": 16, "kv_bytes_per_block": 32 * 262144, "pcie_gen": 5}
    (tmp_path / "prefill.json").write_text(json.dumps(eng))
    dep = {"prefill": {"replicas": 2, "router": "kv_aware"}, "link": {"bandwidth_gb_s": 50},
           "decode": {"replicas": 1, "engine": str(tmp_path / "decode.json")}}
    db = str(tmp_path / "db.duckdb")
    raw = _fleet_dict(db, {"pd": {"engine": str(tmp_path / "prefill.json"), "deployment": dep}})
    assert run_pipeline(spec_from_dict(raw, base_dir=str(tmp_path)), scheduler="sync", database=db).landed
    trace = read_trace(FLEET_TRACE, "mooncake", unit_tokens=64)
    d = deploy(trace, load_engine_config(str(tmp_path / "prefill.json")), dep)
    off = d.summary["kv_offload"]
    con = duckdb.connect(db, read_only=True)
    got = con.execute("SELECT offload_cpu_chunks, offload_hits, offload_loads, offload_store_chunks FROM summaries"
                      ).fetchone()
    assert got == (off["cpu_chunks"], off["connector_prefix_cache_stats"]["hits"], off["loads"], off["store_chunks"])
    assert off["cpu_chunks"] == 2 * 2048 and off["loads"] > 0  # 16 GiB of 8 MiB chunks a replica
    rows = con.execute("SELECT replica, count(*), count(offload_loads) FROM steps GROUP BY 1 ORDER BY 1").fetchall()
    n_decode = int((d.steps.column("replica").to_numpy() == 2).sum())
    assert rows[2] == (2, n_decode, 0) and all(r[1] == r[2] for r in rows[:2])
    assert con.execute("SELECT pool, offload_cpu_chunks FROM replicas ORDER BY replica").fetchall() == [
        ("prefill", 2048), ("prefill", 2048), ("decode", 0)]
    con.close()
