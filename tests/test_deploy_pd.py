"""Disaggregated prefill/decode deployments (aisim.deploy with ``prefill``, ``decode`` and ``link``).

Known answers from a linear step time (base 0.01 s + 1e-4 s a token, block size 16): a prompt of
100 tokens is one 0.02 s prefill step on its prefill replica (7 blocks), then one 0.0101 s decode
step per further token on its decode replica, from the step after its transfer lands.
"""

import os

import numpy as np
import pyarrow as pa
import pytest

from aisim.config.deployment import parse_deployment
from aisim.config.engine import engine_config_from_dict
from aisim.decisionlog import decision_lines, log_line_json
from aisim.deploy import deploy
from aisim.errors import ConfigError
from aisim.replay import replay
from aisim.traces.frame import from_frame

from conftest import ORACLE
from helpers import oracle_engine_dict

INF = float("inf")
BLOCK_BYTES = 2000  # 2 layers x 1000-byte pages


def _engine(**over):
    d = {"num_gpu_blocks": 4000, "block_size": 16,
         "kv_cache_groups": [{"type": "full", "page_size_bytes": 1000, "num_layers": 2}],
         "time_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4}}
    d.update(over)
    return engine_config_from_dict(d)


def _trace(arrivals, prompt=100, max_tokens=3, prefix=None):
    n = len(arrivals)
    cols = {"request_id": [f"r{i}" for i in range(n)], "arrival_time": list(arrivals),
            "prompt_len": [prompt] * n, "max_tokens": [max_tokens] * n}
    if prefix is not None:
        cols["prefix_group"] = [0] * n
        cols["prefix_len"] = [prefix] * n
    return from_frame(pa.table(cols))


def _pd(p=1, d=1, bandwidth=INF, latency=0.0, transfer="all", p_router="round_robin", d_router="round_robin"):
    return {"prefill": {"replicas": p, "router": p_router}, "decode": {"replicas": d, "router": d_router},
            "link": {"bandwidth_gb_s": bandwidth, "latency_s": latency, "transfer": transfer}}


def _rows(dep):
    return dep.requests.to_pylist()


def _steps(dep, replica):
    return [r for r in dep.steps.to_pylist() if r["replica"] == replica]


# ------------------------------------------------------------------ known answers


def test_instant_link_first_token_on_prefill_then_decode_next_step():
    dep = deploy(_trace([0.0]), _engine(), _pd(), record_decisions=True)
    (r,) = _rows(dep)
    prefill_end = 0.0 + (0.01 + 100 * 1e-4)          # one 100-token prefill step
    second = prefill_end + (0.01 + 1e-4)              # the decode replica's next step: one token
    third = second + (0.01 + 1e-4)
    assert (r["prefill_replica"], r["decode_replica"], r["replica"]) == (0, 1, 1)
    assert r["first_token_s"] == prefill_end
    assert r["ttft_s"] == prefill_end - 0.0
    assert r["routed_s"] == prefill_end
    assert r["transfer_s"] == 0.0
    assert r["finish_s"] == third
    assert r["output_tokens"] == 3 and r["status"] == "finished"
    assert r["tpot_s"] == (third - prefill_end) / 2
    p_steps, d_steps = _steps(dep, 0), _steps(dep, 1)
    # The prefill replica's second step only reports the finish (Scheduler.has_requests).
    assert [(s["clock_s"], s["prefill_tokens"], s["decode_tokens"]) for s in p_steps] == [(0.0, 100, 0),
                                                                                           (prefill_end, 0, 0)]
    assert [(s["clock_s"], s["decode_tokens"]) for s in d_steps] == [(prefill_end, 1), (second, 1), (third, 0)]
    # The decode replica admits it with the whole prompt computed (KV from the prefill replica).
    first = list(decision_lines(dep.replicas[1]))[1]
    assert (first["new"], first["sched"], first["arrived"]) == ({"r0": 100}, {"r0": 1}, ["r0"])
    # Blocks for prompt + first token: ceil(101 / 16) = 7.
    assert first["free_blocks"] == 3999 - 7
    assert dep.summary["requests"] == 1 and dep.summary["finished"] == 1
    assert [s["pool"] for s in dep.summary["replicas"]] == ["prefill", "decode"]


def test_transfer_time_by_hand_and_decode_waits_for_it():
    # 100 prompt tokens hold ceil(100 / 16) = 7 blocks of 2000 bytes; 1 GB/s, 1 ms latency.
    dep = deploy(_trace([0.0]), _engine(), _pd(bandwidth=1.0, latency=0.001))
    (r,) = _rows(dep)
    xfer = 7.0 * BLOCK_BYTES / 1e9 + 0.001
    assert r["transfer_s"] == xfer
    land = 0.02 + xfer
    d_steps = _steps(dep, 1)
    # The idle decode replica sleeps until the KV lands, then decodes.
    assert d_steps[0]["clock_s"] == land
    assert r["finish_s"] == land + 2 * (0.01 + 1e-4)


def test_prefill_blocks_held_until_the_transfer_lands():
    arrivals = [0.0, 0.5, 1.5]
    slow = deploy(_trace(arrivals), _engine(), _pd(latency=1.0))
    fast = deploy(_trace(arrivals), _engine(), _pd())
    usable = 3999
    # Every prefill step is followed by one that reports its finish, 0.02 s later.
    clocks = [0.0, 0.02, 0.5, 0.52, 1.5, 1.52]
    assert [s["clock_s"] for s in _steps(fast, 0)] == clocks == [s["clock_s"] for s in _steps(slow, 0)]
    # Instant link: a prefill's 7 blocks are freed when it lands, before the reporting step.
    assert [s["free_blocks"] for s in _steps(fast, 0)] == [usable - 7, usable] * 3
    # 1 s link: request 0's blocks are held until 0.02 + 1.0, request 1's until 0.52 + 1.0 (a
    # landing at a step's start counts before the step).
    assert [s["free_blocks"] for s in _steps(slow, 0)] == [usable - 7, usable - 7, usable - 14, usable - 14,
                                                         usable - 14, usable - 7]
    assert [r["transfer_s"] for r in _rows(slow)] == [1.0, 1.0, 1.0]


def test_missing_moves_only_what_the_decode_replica_lacks():
    # 112-token prompts sharing a 96-token prefix (6 blocks); 7 blocks each.  The second request
    # arrives after the first finished: the decode replica still caches the prefix.
    trace = _trace([0.0, 1.0], prompt=112, prefix=96)
    full = deploy(trace, _engine(), _pd(bandwidth=1.0, transfer="all"))
    missing = deploy(trace, _engine(), _pd(bandwidth=1.0, transfer="missing"))
    assert [r["transfer_s"] for r in _rows(full)] == [7.0 * BLOCK_BYTES / 1e9] * 2
    assert [r["transfer_s"] for r in _rows(missing)] == [7.0 * BLOCK_BYTES / 1e9, 1.0 * BLOCK_BYTES / 1e9]


def test_max_tokens_one_ends_on_the_prefill_replica():
    dep = deploy(_trace([0.0], max_tokens=1), _engine(), _pd(latency=1.0))
    (r,) = _rows(dep)
    assert (r["replica"], r["prefill_replica"], r["decode_replica"], r["transfer_s"]) == (0, 0, None, None)
    assert r["finish_s"] == 0.02 and r["output_tokens"] == 1
    assert _steps(dep, 1) == []
    assert _steps(dep, 0)[0]["free_blocks"] == 3999  # nothing to send: freed at the finish


# ------------------------------------------------------------------ exactness and determinism


def _timed_oracle(scenario):
    from aisim.traces import read_oracle_trace

    t = read_oracle_trace(os.path.join(ORACLE, scenario, "trace.jsonl"), 32768)
    arrival = pa.array(t.column("arrival_step").to_numpy().astype(np.float64) * 0.01, pa.float64())
    t = t.set_column(t.column_names.index("arrival_s"), "arrival_s", arrival)
    return t.replace_schema_metadata({**(t.schema.metadata or {}), b"clock": b"time"})


def _log_without_free(result):
    """Decision-log lines without the free-block counts: a prefill replica keeps a finished
    request's blocks until its transfer lands (here: right after the step), one engine frees them
    in the step's update."""
    out = []
    for line in decision_lines(result):
        line = dict(line)
        line.pop("free_blocks", None)
        line.pop("kv_usage", None)
        out.append(log_line_json(line))
    return out


@pytest.mark.parametrize("scenario,router", [("timed", "round_robin"), ("full_pressure", "least_loaded"),
                                             ("bench_full", "kv_aware")])
def test_every_prefill_replica_equals_a_replay_of_its_share_with_one_token(scenario, router):
    eng = engine_config_from_dict(oracle_engine_dict(os.path.join(ORACLE, scenario), "0.33.0"))
    trace = _timed_oracle(scenario) if scenario != "timed" else None
    if trace is None:
        from aisim.traces import read_oracle_trace

        trace = read_oracle_trace(os.path.join(ORACLE, "timed", "trace.jsonl"), 32768)
    dep = deploy(trace, eng, _pd(p=2, d=2, p_router=router), record_decisions=True)
    pre = dep.requests.column("prefill_replica").to_numpy()
    for w in range(2):
        share = trace.filter(pa.array(pre == w))
        col = share.column_names.index("output_tokens")
        one = share.set_column(col, share.schema.field(col),
                               pa.array(np.ones(share.num_rows, np.int64), share.schema.field(col).type))
        single = replay(one, eng, record_decisions=True)
        assert _log_without_free(dep.replicas[w]) == _log_without_free(single)
    assert dep.summary["requests"] == trace.num_rows


def test_same_inputs_same_tables():
    trace = _trace([0.0, 0.01, 0.02, 0.5, 0.51], prompt=200, max_tokens=20, prefix=64)
    cfg = _pd(p=2, d=3, bandwidth=0.5, latency=0.002, transfer="missing", p_router="kv_aware",
              d_router="least_loaded")
    a = deploy(trace, _engine(), cfg)
    b = deploy(trace, _engine(), cfg)
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
    assert a.summary == b.summary
    assert sorted(set(a.requests.column("decode_replica").to_pylist())) == [2, 3, 4]


# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize("raw,message", [
    ({"prefill": {"replicas": 1}, "decode": {"replicas": 1}}, "'deployment.link' is missing"),
    ({"prefill": {"replicas": 0}, "decode": {}, "link": {"bandwidth_gb_s": 1}},
     "'deployment.prefill.replicas' must be an integer from 1 to 64"),
    ({"prefill": {}, "decode": {"router": "nope"}, "link": {"bandwidth_gb_s": 1}},
     "'deployment.decode.router.kind' must be one of"),
    ({"prefill": {}, "decode": {}, "link": {}}, "'deployment.link.bandwidth_gb_s' is required"),
    ({"prefill": {}, "decode": {}, "link": {"bandwidth_gb_s": -1}}, "'deployment.link.bandwidth_gb_s' must be"),
    ({"prefill": {}, "decode": {}, "link": {"bandwidth_gb_s": 1, "transfer": "some"}},
     "'deployment.link.transfer' must be one of all, missing"),
    ({"prefill": {}, "decode": {}, "link": {"bandwidth_gb_s": 1, "latency_s": -0.1}},
     "'deployment.link.latency_s' must be"),
    ({"prefill": {}, "decode": {}, "link": {"bandwidth_gb_s": 1, "speed": 2}}, "unknown key 'deployment.link.speed'"),
    ({"replicas": 2, "prefill": {}, "decode": {}, "link": {"bandwidth_gb_s": 1}}, "'deployment.replicas'"),
])
def test_bad_disaggregated_deployment_names_the_key(raw, message):
    with pytest.raises(ConfigError) as e:
        parse_deployment(raw)
    assert str(e.value).startswith(message), str(e.value)


def test_pool_engine_file_and_defaults(tmp_path):
    eng_file = tmp_path / "decode.toml"
    eng_file.write_text('num_gpu_blocks = 500\nblock_size = 16\nmax_model_len = 4096\n'
                        '[time_model]\nkind = "linear"\nbase_s = 0.02\n')
    dep_file = tmp_path / "dep.toml"
    dep_file.write_text('[deployment]\nprefill = { replicas = 2 }\ndecode = { replicas = 1, engine = "decode.toml" }\n'
                        'link = { bandwidth_gb_s = inf }\n')
    from aisim.config.deployment import load_deployment_config

    cfg = load_deployment_config(dep_file)
    assert cfg.disaggregated and cfg.decode.engine == str(eng_file) and cfg.prefill.engine is None
    assert cfg.link.to_dict() == {"bandwidth_gb_s": INF, "latency_s": 0.0, "transfer": "all"}
    dep = deploy(_trace([0.0]), _engine(), cfg)
    (r,) = _rows(dep)
    # The decode pool's own engine: 0.02 s a step.
    assert r["finish_s"] == 0.02 + 0.02 + 0.02


def test_finite_link_needs_block_bytes():
    eng = engine_config_from_dict({"num_gpu_blocks": 4000, "time_model": {"kind": "linear", "base_s": 0.01}})
    with pytest.raises(ConfigError, match="block bytes are unknown"):
        deploy(_trace([0.0]), eng, _pd(bandwidth=1.0))


def test_cli_replays_a_disaggregated_deployment(tmp_path):
    import json
    import shutil

    import pyarrow.parquet as pq

    from test_deploy import _cli

    src = os.path.join(ORACLE, "timed")
    shutil.copy(os.path.join(src, "config.json"), tmp_path / "engine.json")
    shutil.copy(os.path.join(src, "trace.jsonl"), tmp_path / "trace.jsonl")
    (tmp_path / "dep.toml").write_text('[deployment]\nprefill = { replicas = 2, router = "kv_aware" }\n'
                                       'decode = { replicas = 1 }\nlink = { bandwidth_gb_s = inf, latency_s = 0.001 }\n')
    out, log = tmp_path / "out", tmp_path / "log.jsonl"
    r = _cli("replay", "--engine", str(tmp_path / "engine.json"), "--trace", str(tmp_path / "trace.jsonl"),
             "--deployment", str(tmp_path / "dep.toml"), "--out", str(out), "--decision-log", str(log))
    assert r.exit_code == 0, r.output
    assert "2 prefill replicas, router kv_aware; 1 decode replicas, router round_robin" in r.output
    requests = pq.read_table(out / "requests.parquet")
    assert requests.num_rows == 300
    assert set(requests.column("prefill_replica").to_pylist()) == {0, 1}
    assert set(requests.column("decode_replica").to_pylist()) == {2}
    assert set(requests.column("transfer_s").to_pylist()) == {0.001}
    summary = json.loads((out / "summary.json").read_text())
    assert [s["pool"] for s in summary["replicas"]] == ["prefill", "prefill", "decode"]
    assert all((tmp_path / f"log.replica{w}.jsonl").exists() for w in range(3))
