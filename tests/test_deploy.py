"""Deployments: replicas of the exact engine behind a router (aisim.deploy, ext/deploy.pyx).

Exactness: a replica's decisions depend only on the requests routed to it, so its decision log
must equal a single-engine replay of exactly its share, line for line.  Routing: every decision
is checked against the router's formula evaluated here, in Python, on the replicas' true state
at that instant, reconstructed from the replicas' own decision logs.
"""

import os

import numpy as np
import pyarrow as pa
import pytest

from aisim.config.deployment import ROUTERS, deployment_config, load_deployment_config, parse_deployment
from aisim.config.engine import engine_config_from_dict
from aisim.decisionlog import decision_lines, log_line_json
from aisim.deploy import deploy
from aisim.errors import ConfigError, TraceError
from aisim.replay import replay
from aisim.traces import read_oracle_trace
from aisim.traces.frame import from_frame
from aisim.traces.synth import synth_trace

from conftest import ORACLE, SPEC_ORACLE
from helpers import copy_oracle_config, oracle_engine_dict

STEP_S = 0.01  # seconds per engine step when a step-clocked oracle trace is put on the clock


def _engine(scenario, version="0.33.0", **over):
    d = oracle_engine_dict(os.path.join(ORACLE, scenario), version)
    d.update(over)
    return engine_config_from_dict(d)


def _timed(scenario):
    """An oracle trace on the clock: arrival_step x STEP_S seconds (the timed scenario as it is)."""
    t = read_oracle_trace(os.path.join(ORACLE, scenario, "trace.jsonl"), 32768)
    if (t.schema.metadata or {}).get(b"clock") == b"time":
        return t
    arrival = pa.array(t.column("arrival_step").to_numpy().astype(np.float64) * STEP_S, pa.float64())
    t = t.set_column(t.column_names.index("arrival_s"), "arrival_s", arrival)
    return t.replace_schema_metadata({**(t.schema.metadata or {}), b"clock": b"time"})


def _log(result):
    return [log_line_json(line) for line in decision_lines(result)]


def _share(trace, dep, w):
    return trace.filter(pa.array(dep.requests.column("replica").to_numpy() == w))


# ------------------------------------------------------------------ one replica is one engine


@pytest.mark.parametrize("router", ROUTERS)
def test_one_replica_is_the_single_engine(router):
    eng, trace = _engine("timed"), _timed("timed")
    single = replay(trace, eng, record_decisions=True)
    dep = deploy(trace, eng, {"replicas": 1, "router": router}, record_decisions=True)
    assert _log(dep.replicas[0]) == _log(single)
    assert dep.requests.drop_columns(["replica", "prefill_replica", "decode_replica", "routed_s", "transfer_s"]).equals(single.requests)
    assert dep.steps.drop_columns(["replica"]).equals(single.steps)
    for key in ("requests", "finished", "steps", "preemptions", "prefix_cache_stats", "clock_end_s", "ttft_s",
                "tpot_s", "e2e_s", "scheduled_tokens"):
        assert dep.summary[key] == single.summary[key], key
    assert dep.summary["replicas"][0]["requests"] == 300
    assert dep.requests.column("replica").to_pylist() == [0] * 300


# ------------------------------------------------------------------ exactness per replica

EXACT = [("timed", 2), ("timed", 4), ("full_pressure", 3), ("full_pressure_async", 2), ("full_small", 4),
         ("priority_threshold", 2), ("hybrid_swa", 3), ("hybrid_mamba", 2), ("bench_full", 3)]


@pytest.mark.parametrize("router", ["round_robin", "random", "least_loaded", "kv_aware"])
@pytest.mark.parametrize("scenario,n", EXACT)
def test_every_replica_equals_a_replay_of_its_share(scenario, n, router):
    eng, trace = _engine(scenario), _timed(scenario)
    opts = {"kind": router, "seed": 7} if router == "random" else router
    dep = deploy(trace, eng, {"replicas": n, "router": opts}, record_decisions=True)
    used = set(dep.requests.column("replica").to_pylist())
    assert len(used) >= 2  # the test means something only when requests were split
    for w in range(n):
        share = _share(trace, dep, w)
        assert dep.replicas[w].requests.num_rows == share.num_rows
        if share.num_rows:
            assert _log(dep.replicas[w]) == _log(replay(share, eng, record_decisions=True)), (scenario, router, w)


SPEC = [("spec_full_k3", "0.32.0", "kv_aware"), ("spec_full_k3", "0.33.0", "least_loaded"),
        ("spec_priority_k2", "0.33.0", "round_robin"), ("spec_mtp_k1_async", "0.32.0", "kv_aware"),
        ("spec_mamba_k2", "0.33.0", "least_loaded")]


@pytest.mark.parametrize("scenario,version,router", SPEC)
def test_speculative_replicas_equal_their_shares(scenario, version, router):
    # Each request's own `accept` list travels with it to its replica.
    d = oracle_engine_dict(os.path.join(SPEC_ORACLE, scenario), version)
    eng = engine_config_from_dict(d)
    t = read_oracle_trace(os.path.join(SPEC_ORACLE, scenario, "trace.jsonl"), 32768)
    arrival = pa.array(t.column("arrival_step").to_numpy().astype(np.float64) * STEP_S, pa.float64())
    t = t.set_column(t.column_names.index("arrival_s"), "arrival_s", arrival)
    trace = t.replace_schema_metadata({**(t.schema.metadata or {}), b"clock": b"time"})
    dep = deploy(trace, eng, {"replicas": 2, "router": router}, record_decisions=True)
    for w in range(2):
        share = _share(trace, dep, w)
        assert share.num_rows > 0
        assert _log(dep.replicas[w]) == _log(replay(share, eng, record_decisions=True)), (scenario, w)
    assert dep.summary["spec"]["draft_tokens"] > 0


def test_kv_aware_refuses_eagle_lookahead_keys():
    d = oracle_engine_dict(os.path.join(SPEC_ORACLE, "spec_full_k3"), "0.33.0")
    eng = engine_config_from_dict(d)
    with pytest.raises(ConfigError, match="EAGLE lookahead"):
        deploy(_timed("timed"), eng, {"replicas": 2, "router": "kv_aware"})


def _sessions(n=240, turns=4, rate=40.0):
    return synth_trace(n, seed=3, rate=rate, prompt="lognormal:200:0.5", output="lognormal:24:0.5",
                       turns=turns, think_time_s=0.05, prefix_groups=3, prefix_len=64, prefix_fraction=0.5)


@pytest.mark.parametrize("fallback", ["kv_aware", "least_loaded"])
@pytest.mark.parametrize("slack", [0, 2, 16])
def test_session_affinity_replicas_equal_their_shares(fallback, slack):
    eng = engine_config_from_dict({"num_gpu_blocks": 400, "max_model_len": 6384,
                                   "max_num_seqs": 8, "max_num_batched_tokens": 512,
                                   "time_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-5}})
    trace = _sessions()
    dep = deploy(trace, eng, {"replicas": 3, "router": {"kind": "session_affinity", "fallback": fallback,
                                                        "slack": slack}}, record_decisions=True)
    for w in range(3):
        share = _share(trace, dep, w)
        assert _log(dep.replicas[w]) == _log(replay(share, eng, record_decisions=True))


def test_same_inputs_same_bytes():
    eng, trace = _engine("full_pressure"), _timed("full_pressure")
    runs = [deploy(trace, eng, {"replicas": 3, "router": {"kind": "random", "seed": 11}}) for _ in range(2)]
    assert runs[0].requests.equals(runs[1].requests)
    assert runs[0].steps.equals(runs[1].steps)
    other = deploy(trace, eng, {"replicas": 3, "router": {"kind": "random", "seed": 12}})
    assert other.requests.column("replica").to_pylist() != runs[0].requests.column("replica").to_pylist()


# ------------------------------------------------------------------ every decision by the formula


def _truth(trace, dep, eng):
    """Per request, the start of the iteration that finished it and of the one that produced its
    first token, read off its replica's steps and decision events: from the first arrival after
    that start on, it no longer counts as outstanding (or its booked prefill no longer counts)."""
    from aisim.decisionlog import EV_FINISHED

    n = trace.num_rows
    route = dep.requests.column("replica").to_numpy()
    arrival = trace.column("arrival_s").to_numpy()
    finish_start = np.full(n, np.inf)
    first_start = np.full(n, np.inf)
    for w, rep in enumerate(dep.replicas):
        gidx = np.flatnonzero(route == w)
        clocks = rep.steps.column("clock_s").to_numpy()
        ev = rep.events
        fin = ev["kind"] == EV_FINISHED
        finish_start[gidx[ev["req"][fin]]] = clocks[ev["line"][fin]]
        ends = clocks + rep.steps.column("duration_s").to_numpy()
        ft = rep.requests.column("first_token_s").to_numpy(zero_copy_only=False)
        for k, g in enumerate(gidx):
            if not np.isnan(ft[k]):  # the iteration that produced it ends then
                first_start[g] = clocks[np.flatnonzero(np.isclose(ends, ft[k], rtol=0, atol=1e-12))[0]]
    return route, arrival, finish_start, first_start


def _keys(trace, B):
    """Each request's full prompt blocks as token identities: a block of a shared prefix stream is
    (stream, block), any other block is the request's own."""
    out = []
    for i, segs in enumerate(trace.column("segments").to_pylist()):
        n_blocks = trace.column("prompt_tokens")[i].as_py() // B
        s0 = segs[0]
        out.append([(s0["stream"], s0["first"], j) if s0["length"] >= (j + 1) * B else ("own", i, j)
                    for j in range(n_blocks)])
    return out


@pytest.mark.parametrize("delay", [0.0, 0.05])
@pytest.mark.parametrize("router", ["least_loaded", "least_loaded_tokens", "kv_aware", "kv_aware_weight"])
@pytest.mark.parametrize("scenario,n", [("timed", 3), ("full_pressure", 2), ("bench_full", 4)])
def test_every_decision_follows_the_formula(scenario, n, router, delay):
    eng, trace = _engine(scenario), _timed(scenario)
    opts = {"least_loaded": {"kind": "least_loaded"}, "least_loaded_tokens": {"kind": "least_loaded", "by": "tokens"},
            "kv_aware": {"kind": "kv_aware"}, "kv_aware_weight": {"kind": "kv_aware", "overlap_weight": 2.5}}[router]
    opts = {**opts, "view_delay_s": delay}
    dep = deploy(trace, eng, {"replicas": n, "router": opts}, record_decisions=True, record_routing=True)
    r = dep.routing
    route, arrival, finish_start, first_start = _truth(trace, dep, eng)
    prompt = trace.column("prompt_tokens").to_numpy().astype(np.int64)
    out_tok = trace.column("output_tokens").to_numpy().astype(np.int64)
    B = eng.block_size
    keys = _keys(trace, B)
    booked = np.zeros(len(route), dtype=np.int64)
    kv = opts["kind"] == "kv_aware"
    if kv and delay == 0:  # the index agrees with every replica's own cache
        assert np.array_equal(r["overlap_blocks"], r["overlap_blocks_true"])
    if kv:
        assert r["overlap_blocks"].sum() > 0
    for i in range(len(route)):
        # The router sees what iterations that started before t - view_delay_s reported.
        t = arrival[i] - delay if delay else arrival[i]
        alive = [j for j in range(i) if finish_start[j] >= t]
        load = np.zeros(n, dtype=np.int64)
        toks = np.zeros(n, dtype=np.int64)
        for j in alive:
            load[route[j]] += 1
            toks[route[j]] += prompt[j] + out_tok[j]
        assert list(r["outstanding_requests"][i]) == list(load)
        assert list(r["outstanding_tokens"][i]) == list(toks)
        if not kv:
            metric = toks if opts.get("by") == "tokens" else load
            assert route[i] == int(np.argmin(metric))  # argmin: the lowest index among ties
            continue
        overlap = r["overlap_blocks"][i].astype(np.int64)
        pf = np.zeros(n, dtype=np.int64)
        active = [set() for _ in range(n)]
        for j in alive:
            if first_start[j] >= t:
                pf[route[j]] += booked[j]
            active[route[j]].update(keys[j])
        new_tok = np.maximum(prompt[i] - overlap * B, 0)
        dec = np.array([len(active[w]) + len(set(keys[i]) - active[w]) for w in range(n)])
        cost = opts.get("overlap_weight", 1.0) * (pf + new_tok) / B + dec
        assert list(r["prefill_tokens"][i]) == list(pf + new_tok)
        assert list(r["decode_blocks"][i]) == list(dec)
        assert np.allclose(r["cost"][i], cost, rtol=0, atol=1e-9)
        assert route[i] == int(np.argmin(cost))
        booked[i] = new_tok[route[i]]


def test_round_robin_and_random_by_formula():
    eng, trace = _engine("timed"), _timed("timed")
    rr = deploy(trace, eng, {"replicas": 3, "router": "round_robin"})
    assert rr.requests.column("replica").to_pylist() == [i % 3 for i in range(300)]
    rnd = deploy(trace, eng, {"replicas": 3, "router": {"kind": "random", "seed": 5}})
    mask = (1 << 64) - 1
    state, want = 5, []
    for _ in range(300):  # splitmix64, then the high 32 bits scaled to [0, 3)
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        want.append(((z >> 32) * 3) >> 32)
    assert rnd.requests.column("replica").to_pylist() == want


@pytest.mark.parametrize("slack", [0, 3])
def test_session_affinity_by_formula(slack):
    eng = engine_config_from_dict({"num_gpu_blocks": 400, "max_model_len": 6384,
                                   "max_num_seqs": 8, "max_num_batched_tokens": 512,
                                   "time_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-5}})
    trace = _sessions()
    dep = deploy(trace, eng, {"replicas": 3, "router": {"kind": "session_affinity", "fallback": "least_loaded",
                                                        "slack": slack}},
                 record_decisions=True, record_routing=True)
    route = dep.requests.column("replica").to_numpy()
    load = dep.routing["outstanding_requests"]
    sticky, fell_back = {}, 0
    for i, s in enumerate(trace.column("session_id").to_pylist()):
        least = int(np.argmin(load[i]))
        if s in sticky and load[i][sticky[s]] <= load[i].min() + slack:
            assert route[i] == sticky[s]
        else:
            fell_back += s in sticky
            assert route[i] == least
        sticky[s] = route[i]
    if slack == 0:
        assert fell_back > 0


# ------------------------------------------------------------------ known answers


def _groups_trace(k, per_group, prefix=256, own=48, gap=0.5):
    """k disjoint prefix groups; request i is in group (i // 2) % k (so round robin splits every
    group over replicas); requests far apart in time (each done before the next arrives)."""
    from aisim.traces.frame import from_frame

    n = k * per_group
    return from_frame(pa.table({
        "request_id": [f"r{i:04d}" for i in range(n)], "arrival_time": [i * gap for i in range(n)],
        "prompt_len": [prefix + own] * n, "max_tokens": [4] * n,
        "prefix_group": [(i // 2) % k for i in range(n)], "prefix_len": [prefix] * n,
        "session_id": [f"s{(i // 2) % k}" for i in range(n)]}))


@pytest.mark.parametrize("router", ["kv_aware", "session_affinity"])
def test_prefix_groups_one_per_replica(router):
    k, per = 4, 6
    eng = engine_config_from_dict({"num_gpu_blocks": 4000, "time_model": {"kind": "linear", "base_s": 0.01}})
    trace = _groups_trace(k, per)
    dep = deploy(trace, eng, {"replicas": k, "router": router})
    rr = deploy(trace, eng, {"replicas": k, "router": "round_robin"})
    # One group per replica: every request after its group's first hits the whole 256-token
    # prefix (16 blocks; its own 48 tokens never hit).
    assert dep.summary["prefix_hit_tokens_at_admission"] == k * (per - 1) * 256
    # Round robin sends each group to two replicas (request pairs alternate): two misses a group.
    assert rr.summary["prefix_hit_tokens_at_admission"] == k * (per - 2) * 256
    assert dep.summary["prefix_hit_rate"] > rr.summary["prefix_hit_rate"]


def test_a_replica_runs_more_requests_than_its_share():
    # Replicas size their batches by an even share of the trace (here 2 of 16 requests); a KV-aware
    # router keeps sending a prefix's requests to the replicas caching it, which then run more at
    # once and grow them.
    eng = engine_config_from_dict({"num_gpu_blocks": 4000, "block_size": 16, "max_num_seqs": 32,
                                   "time_model": {"kind": "linear", "base_s": 0.01}})
    n, reps = 16, 8
    trace = from_frame(pa.table({
        "request_id": [f"r{i:02d}" for i in range(n)], "arrival_time": [0.02 * i for i in range(n)],
        "prompt_len": [160] * n, "max_tokens": [200] * n, "prefix_group": [0] * n, "prefix_len": [128] * n}))
    dep = deploy(trace, eng, {"replicas": reps, "router": "kv_aware"}, record_decisions=True)
    assert np.bincount(dep.requests.column("replica").to_numpy(), minlength=reps).tolist() == [5, 5, 5, 1, 0, 0, 0, 0]
    assert max(dep.replicas[0].steps.column("running").to_numpy()) == 5
    for w in range(4):
        assert _log(dep.replicas[w]) == _log(replay(_share(trace, dep, w), eng, record_decisions=True))


def test_view_delay_hides_the_caches():
    eng = engine_config_from_dict({"num_gpu_blocks": 4000, "time_model": {"kind": "linear", "base_s": 0.01}})
    trace = _groups_trace(3, 5)
    blind = deploy(trace, eng, {"replicas": 3, "router": {"kind": "kv_aware", "view_delay_s": 1000.0}},
                   record_routing=True)
    assert blind.routing["overlap_blocks"].sum() == 0
    assert blind.routing["overlap_blocks_true"].sum() > 0
    late = deploy(trace, eng, {"replicas": 3, "router": {"kind": "kv_aware", "view_delay_s": 0.6}},
                  record_routing=True)
    # Requests 0.5 s apart: a cache filled by the iteration at t is seen from t + 0.6 on, i.e.
    # by the second request after the one that filled it, not the next.
    seen = late.routing["overlap_blocks"]
    truth = late.routing["overlap_blocks_true"]
    assert (seen <= truth).all() and (seen < truth).any() and seen.sum() > 0


# ------------------------------------------------------------------ refusals and configuration


def test_step_clocked_trace_is_refused_naming_it():
    eng = _engine("full_small")
    trace = read_oracle_trace(os.path.join(ORACLE, "full_small", "trace.jsonl"), 32768)
    with pytest.raises(TraceError, match=r"^full_small/trace.jsonl: arrivals are engine steps \(arrival_step\)"):
        deploy(trace, eng, {"replicas": 2}, name="full_small/trace.jsonl")


@pytest.mark.parametrize("raw,message", [
    ({"replicas": 0}, "'deployment.replicas' must be an integer from 1 to 64, got 0"),
    ({"replicas": 65}, "'deployment.replicas' must be an integer from 1 to 64, got 65"),
    ({"replica": 2}, "unknown key 'deployment.replica'; known keys: replicas, router, prefill, decode, link"),
    ({"router": "fastest"}, "'deployment.router.kind' must be one of round_robin, random, least_loaded, "
                            "kv_aware, session_affinity, got 'fastest'"),
    ({"router": {"kind": "kv_aware", "weight": 1}}, "unknown key 'deployment.router.weight'"),
    ({"router": {"kind": "least_loaded", "by": "bytes"}}, "'deployment.router.by' must be requests or tokens"),
    ({"router": {"kind": "session_affinity", "slack": -1}}, "'deployment.router.slack' must be an integer >= 0"),
    ({"router": {"kind": "kv_aware", "view_delay_s": -0.1}}, "'deployment.router.view_delay_s' must be"),
    ({"prefill": {"replicas": 1}}, "'deployment.decode' is missing"),
])
def test_bad_deployment_names_the_key(raw, message):
    with pytest.raises(ConfigError) as e:
        parse_deployment(raw)
    assert str(e.value).startswith(message)


def test_deployment_file(tmp_path):
    p = tmp_path / "dep.toml"
    p.write_text('[deployment]\nreplicas = 3\nrouter = { kind = "kv_aware", overlap_weight = 0.5 }\n')
    d = load_deployment_config(p)
    assert d.replicas == 3 and d.router == "kv_aware" and d.options["overlap_weight"] == 0.5
    assert d.options["view_delay_s"] == 0.0 and d.options["slack"] == 16
    p.write_text('replicas = 3\n')
    with pytest.raises(ConfigError, match="a deployment file holds one mapping, 'deployment'"):
        load_deployment_config(p)
    p.write_text('[deployment]\nreplicas = "3"\n')
    with pytest.raises(ConfigError, match=r"'deployment.replicas' in .*dep.toml must be an integer"):
        load_deployment_config(p)
    assert deployment_config(2, "random").to_dict()["router"]["kind"] == "random"


def test_every_router_row_has_its_own_core_code():
    # aisim/config/routers.py: each row names a RouterKind of ext/deploy.pxd, each kind is used once.
    from aisim._core.constants import ROUTER_KINDS
    from aisim.config.routers import ROUTER_TABLE, router_code

    assert sorted(r.core for r in ROUTER_TABLE) == sorted(ROUTER_KINDS)
    assert sorted(router_code(r.name) for r in ROUTER_TABLE) == sorted(ROUTER_KINDS.values())


# ------------------------------------------------------------------ the command line


def _cli(*args):
    from click.testing import CliRunner

    from aisim.cli import main

    return CliRunner().invoke(main, list(args))


def test_cli_replays_a_deployment_with_one_log_per_replica(tmp_path):
    import json
    import shutil

    import pyarrow.parquet as pq

    src = os.path.join(ORACLE, "timed")
    copy_oracle_config(src, tmp_path / "engine.json")
    shutil.copy(os.path.join(src, "trace.jsonl"), tmp_path / "trace.jsonl")
    (tmp_path / "dep.json").write_text('{"deployment": {"replicas": 3, "router": "kv_aware"}}')
    out, log = tmp_path / "out", tmp_path / "log.jsonl"
    r = _cli("replay", "--engine", str(tmp_path / "engine.json"), "--trace", str(tmp_path / "trace.jsonl"),
             "--deployment", str(tmp_path / "dep.json"), "--out", str(out), "--decision-log", str(log))
    assert r.exit_code == 0, r.output
    assert "3 replicas, router kv_aware" in r.output
    requests = pq.read_table(out / "requests.parquet")
    assert requests.num_rows == 300 and requests.column_names[:5] == ["replica", "prefill_replica", "decode_replica", "routed_s", "transfer_s"]
    summary = json.loads((out / "summary.json").read_text())
    assert [s["replica"] for s in summary["replicas"]] == [0, 1, 2]
    assert summary["deployment"]["router"]["kind"] == "kv_aware"
    eng = engine_config_from_dict(json.loads((tmp_path / "engine.json").read_text()))
    dep = deploy(_timed("timed"), eng, {"replicas": 3, "router": "kv_aware"}, record_decisions=True)
    for w in range(3):
        lines = (tmp_path / f"log.replica{w}.jsonl").read_text().splitlines()
        assert lines == _log(dep.replicas[w])
    assert not log.exists()


def test_cli_refuses_a_step_clocked_trace_and_writes_nothing(tmp_path):
    import shutil

    src = os.path.join(ORACLE, "full_small")
    copy_oracle_config(src, tmp_path / "engine.json")
    shutil.copy(os.path.join(src, "trace.jsonl"), tmp_path / "trace.jsonl")
    (tmp_path / "dep.json").write_text('{"deployment": {"replicas": 2}}')
    r = _cli("replay", "--engine", str(tmp_path / "engine.json"), "--trace", str(tmp_path / "trace.jsonl"),
             "--deployment", str(tmp_path / "dep.json"), "--out", str(tmp_path / "out"))
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1].endswith(
        f"{tmp_path / 'trace.jsonl'}: arrivals are engine steps (arrival_step); a deployment needs arrivals in "
        "seconds (arrival_s), the one clock its replicas share")
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
    (tmp_path / "dep.json").write_text('{"deployment": {"replicas": 2, "router": {"kind": "kv_aware", "wait": 1}}}')
    r = _cli("replay", "--engine", str(tmp_path / "engine.json"), "--trace", str(tmp_path / "trace.jsonl"),
             "--deployment", str(tmp_path / "dep.json"))
    assert r.exit_code == 2 and "unknown key 'deployment.router.wait' in" in r.output


def test_deployment_tables_are_rendered_from_the_catalogue():
    from aisim.config.readme import render_deployment_tables

    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "deployments.md"), encoding="utf-8") as fh:
        readme = fh.read()
    assert render_deployment_tables() in readme
