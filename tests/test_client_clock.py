"""Latencies on the client's clock, and the API server between the client and the engine.

The hand model: a linear time model of 10 ms a step (no per-token cost), ``max_num_batched_tokens``
64, so a prompt of 32 or 16 tokens is prefilled in one step; request ``a`` (32 tokens, 3 outputs)
sent at 0, ``b`` (16 tokens, 2 outputs) sent at 15 ms, half-way through a step.
"""

import pyarrow as pa
import pytest

from aisim.capacity import highest_rate, slo_from_dict
from aisim.config.engine import engine_config_from_dict
from aisim.deploy import deploy
from aisim.replay import replay, replay_stream
from helpers import make_trace

T = 0.01
ENGINE = {"num_gpu_blocks": 100, "block_size": 16, "max_num_seqs": 8, "max_num_batched_tokens": 64,
          "max_model_len": 256, "time_model": {"kind": "linear", "base_s": T}}
REQS = [{"id": "a", "prompt": 32, "max_tokens": 3, "at": 0.0}, {"id": "b", "prompt": 16, "max_tokens": 2, "at": 0.015}]
COLS = ("arrival_s", "picked_up_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s")


def _engine(**tm):
    return engine_config_from_dict({**ENGINE, "time_model": {**ENGINE["time_model"], **tm}})


def _rows(table):
    return {r["request_id"]: tuple(r[c] for c in COLS) for r in table.select(("request_id",) + COLS).to_pylist()}


def test_a_linear_engine_runs_engine_only_by_default_and_a_gpu_s_behind_the_server():
    assert _engine().time_model.frontend is False
    roofline = engine_config_from_dict({"num_gpu_blocks": 100, "max_model_len": 4096,
                                        "time_model": {"gpu": "H100", "model": "llama-3.1-8b"}})
    assert roofline.time_model.frontend is True
    assert roofline.replace(time_model={"gpu": "H100", "model": "llama-3.1-8b", "frontend": False}) \
        .time_model.frontend is False


def test_ttft_counts_from_the_trace_arrival_not_from_the_iteration_that_picks_it_up():
    # Engine only.  a: prefilled in [0, 10 ms) (first token 10 ms), decoded in [10, 20) and [20, 30)
    # (finish 30 ms).  b arrives at 15 ms, mid-step: the engine adds it when the next iteration starts
    # (20 ms), prefills it in [20, 30) (first token 30 ms) and decodes it in [30, 40).  Its TTFT is
    # 30 - 15 = 15 ms (not 10 ms from the pick-up), E2E 40 - 15 = 25 ms, TPOT 10 ms.
    got = _rows(replay(make_trace(REQS, "time"), _engine()).requests)
    assert got["a"] == pytest.approx((0.0, 0.0, 0.01, 0.03, 0.01, 0.01, 0.03), rel=1e-12)
    assert got["b"] == pytest.approx((0.015, 0.02, 0.03, 0.04, 0.015, 0.01, 0.025), rel=1e-12)


def test_the_same_through_a_two_replica_deployment():
    # Round robin: a and c on replica 0, b on replica 1.  Replica 0 steps at 0, 10, 20 ms with a; c
    # arrives at 15 ms and is added at 20 ms (first token 30 ms): TTFT 15 ms from its send.  b finds
    # replica 1 idle: added at its send (5 ms), first token 15 ms, TTFT 10 ms.
    reqs = [REQS[0], {"id": "b", "prompt": 16, "max_tokens": 2, "at": 0.005},
            {"id": "c", "prompt": 16, "max_tokens": 2, "at": 0.015}]
    got = _rows(deploy(make_trace(reqs, "time"), _engine(), {"replicas": 2, "router": "round_robin"}).requests)
    assert got["a"] == pytest.approx((0.0, 0.0, 0.01, 0.03, 0.01, 0.01, 0.03), rel=1e-12)
    assert got["b"] == pytest.approx((0.005, 0.005, 0.015, 0.025, 0.01, 0.01, 0.02), rel=1e-12)
    assert got["c"] == pytest.approx((0.015, 0.02, 0.03, 0.04, 0.015, 0.01, 0.025), rel=1e-12)


def test_the_api_server_s_cost_is_added_once():
    # 4 ms a request (no per-token cost).  a reaches the engine at 4 ms: prefilled in [4, 14), decoded in
    # [14, 24) and [24, 34).  b, sent at 15 ms, finds the server free and reaches the engine at 19 ms,
    # added at 24 ms: first token 34 ms, finish 44 ms.  TTFT a 14 ms (the 10 ms of engine only + 4 ms,
    # once), b 34 - 15 = 19 ms.
    got = _rows(replay(make_trace(REQS, "time"), _engine(frontend=True, frontend_per_request_s=0.004,
                                                         frontend_per_token_s=0.0)).requests)
    assert got["a"] == pytest.approx((0.0, 0.004, 0.014, 0.034, 0.014, 0.01, 0.034), rel=1e-12)
    assert got["b"] == pytest.approx((0.015, 0.024, 0.034, 0.044, 0.019, 0.01, 0.029), rel=1e-12)


def test_the_server_queues_a_burst_at_its_per_token_cost():
    # Three 100-token prompts sent at once, 1 ms + 10 us x 100 = 2 ms each: the engine sees them at
    # 2, 4 and 6 ms.  The first is added at 2 ms (the idle engine jumps there) and prefilled in
    # [2, 12): the other two wait for the iteration at 12 ms.
    reqs = [{"id": f"r{i}", "prompt": 100, "max_tokens": 2, "at": 0.0} for i in range(3)]
    eng = _engine(frontend=True, frontend_per_request_s=0.001, frontend_per_token_s=1e-5)
    eng = eng.replace(max_num_batched_tokens=256)
    got = _rows(replay(make_trace(reqs, "time"), eng).requests)
    assert [got[f"r{i}"][1] for i in range(3)] == pytest.approx([0.002, 0.012, 0.012], rel=1e-12)
    assert [got[f"r{i}"][4] for i in range(3)] == pytest.approx([0.012, 0.022, 0.022], rel=1e-12)


def test_each_replica_has_its_own_server():
    # a and b, sent 1 ms apart, go to two replicas: each passes its own replica's server (4 ms), so b
    # reaches its engine at 5 ms, not behind a (8 ms): TTFT 14 ms each.
    reqs = [REQS[0], {"id": "b", "prompt": 16, "max_tokens": 2, "at": 0.001}]
    eng = _engine(frontend=True, frontend_per_request_s=0.004, frontend_per_token_s=0.0)
    got = _rows(deploy(make_trace(reqs, "time"), eng, {"replicas": 2, "router": "round_robin"}).requests)
    assert got["a"][:5] == pytest.approx((0.0, 0.004, 0.014, 0.034, 0.014), rel=1e-12)
    assert got["b"][:5] == pytest.approx((0.001, 0.005, 0.015, 0.025, 0.014), rel=1e-12)


def test_a_capped_client_sends_when_the_cap_lets_go_and_the_server_follows():
    # Cap 1, both sent at 0, server 4 ms.  a: engine at 4 ms, first token 14, finish 34 ms.  The cap
    # lets b go when the iteration that finished a ends (34 ms).  The engine runs one more iteration
    # from 34 ms (it reports a's finish; an empty batch of 10 ms in the linear model), during which b
    # reaches it (38 ms): added at 44 ms, first token 54 ms, TTFT 20 ms from its send at 34 ms.
    reqs = [dict(REQS[0], at=0.0), dict(REQS[1], at=0.0)]
    eng = _engine(frontend=True, frontend_per_request_s=0.004, frontend_per_token_s=0.0)
    got = _rows(replay(make_trace(reqs, "time"), eng, max_concurrency=1).requests)
    assert got["b"][:5] == pytest.approx((0.034, 0.044, 0.054, 0.064, 0.02), rel=1e-12)
    # Engine only, the engine adds b when the cap lets it go, before that iteration: TTFT 10 ms.
    got = _rows(replay(make_trace(reqs, "time"), _engine(), max_concurrency=1).requests)
    assert got["b"][:5] == pytest.approx((0.03, 0.03, 0.04, 0.05, 0.01), rel=1e-12)


def test_the_streamed_replay_and_a_capacity_search_pass_the_same_server():
    # The pipeline and sweeps replay in pieces (replay_stream), capacity searches whole: the server is
    # the replay's own either way, so each gives the whole replay's rows.
    reqs = [{"id": f"r{i}", "prompt": 16 + i, "max_tokens": 3, "at": 0.003 * i} for i in range(12)]
    trace = make_trace(reqs, "time")
    eng = _engine(frontend=True, frontend_per_request_s=0.004, frontend_per_token_s=1e-5)
    whole = replay(trace, eng).requests
    parts = [item[1] for item in replay_stream(trace.to_batches(max_chunksize=5), eng, timed=True,
                                               expected=trace.num_rows) if item[0] == "requests"]
    assert pa.concat_tables(parts).equals(whole)
    slo = slo_from_dict({"ttft_s": 10.0, "attainment": 1.0})
    found = highest_rate(trace, eng, slo, by="rate_scale", rel_tol=0.5)
    one = next(p for p in found.points if p.axis == 1.0)
    assert one["ttft_p99_s"] == replay(trace, eng, reject_too_long=True).summary["ttft_s"]["p99"]


def test_engine_only_gives_the_engine_s_own_times():
    # The switch off, the engine sees each request at its send: picked_up_s and the first-token and
    # finish times are those of a replay of the same arrivals with no server at all.
    on = _engine(frontend=True)
    off = _engine(frontend=False, frontend_per_request_s=0.5)
    trace = make_trace(REQS, "time")
    assert _rows(replay(trace, off).requests) == _rows(replay(trace, _engine()).requests)
    assert _rows(replay(trace, on).requests) != _rows(replay(trace, off).requests)


def test_the_replay_command_s_engine_only_switch(tmp_path):
    # The hand case of test_the_api_server_s_cost_is_added_once through `aisim replay`: mean TTFT
    # (14 + 19) / 2 = 16.5 ms with the server, (10 + 15) / 2 = 12.5 ms with --engine-only.
    import json

    from click.testing import CliRunner

    from aisim.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"request_id": r["id"], "prompt_len": r["prompt"], "max_tokens": r["max_tokens"],
                                         "arrival_time": r["at"]}) + "\n" for r in REQS))
    engine = tmp_path / "e.json"
    engine.write_text(json.dumps({**ENGINE, "time_model": {**ENGINE["time_model"], "frontend": True,
                                                           "frontend_per_request_s": 0.004,
                                                           "frontend_per_token_s": 0.0}}))
    means = []
    for extra in ([], ["--engine-only"]):
        r = CliRunner().invoke(main, ["replay", "--engine", str(engine), "--trace", str(trace), "--format", "json",
                                      *extra])
        assert r.exit_code == 0, r.output
        means.append(json.loads(r.stdout)["ttft_s"]["mean"])
    assert means == pytest.approx([0.0165, 0.0125], rel=1e-12)


@pytest.mark.parametrize("cap", [None, 2])
def test_one_replica_and_the_streamed_replay_are_the_engine_behind_its_server(cap):
    # A deployment of one replica runs the engine behind the same server (one queue, the same sends,
    # under the client's cap too), and the streamed replay does: the same request rows.
    reqs = [{"id": f"r{i}", "prompt": 16 + 3 * i, "max_tokens": 2 + i % 4, "at": 0.004 * i} for i in range(16)]
    trace = make_trace(reqs, "time")
    eng = _engine(frontend=True, frontend_per_request_s=0.003, frontend_per_token_s=2e-5)
    whole = replay(trace, eng, max_concurrency=cap).requests
    one = deploy(trace, eng, {"replicas": 1, "router": "round_robin"}, max_concurrency=cap).requests
    assert one.select(whole.column_names).equals(whole)
    parts = [item[1] for item in replay_stream(trace.to_batches(max_chunksize=3), eng, timed=True,
                                               expected=trace.num_rows, max_concurrency=cap)
             if item[0] == "requests"]
    assert pa.concat_tables(parts).equals(whole)
    sent = whole.column("arrival_s").to_numpy()
    assert (whole.column("picked_up_s").to_numpy() > sent).all()  # 3 ms and more behind each send


@pytest.mark.parametrize("asy", [False, True])
def test_a_closed_loop_turn_is_sent_at_its_release_and_passes_the_server(asy):
    # Sessions whose next turn is sent 0.2 s after the previous one finishes: its arrival_s is that
    # send, and it reaches the engine at least the server's 5 ms later; one replica is the engine.
    from test_deploy import _sessions

    trace = _sessions()
    eng = engine_config_from_dict({"num_gpu_blocks": 400, "max_model_len": 6384,
                                   "max_num_seqs": 8, "max_num_batched_tokens": 512,
                                   "async_scheduling": asy,
                                   "time_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-5,
                                                  "frontend": True, "frontend_per_request_s": 0.005,
                                                  "frontend_per_token_s": 0.0}})
    single = replay(trace, eng, closed_loop=True, think_time_s=0.2)
    dep = deploy(trace, eng, {"replicas": 1}, closed_loop=True, think_time_s=0.2)
    assert dep.requests.select(single.requests.column_names).equals(single.requests)
    r = single.requests.to_pydict()
    row = {rid: i for i, rid in enumerate(r["request_id"])}
    turns = {}
    for rid, sid, turn in zip(trace.column("request_id").to_pylist(), trace.column("session_id").to_pylist(),
                              trace.column("turn").to_pylist()):
        if sid is not None:
            turns.setdefault(sid, []).append((turn, rid))
    follow = 0
    for seq in turns.values():
        seq.sort()
        for (_, a), (_, b) in zip(seq, seq[1:]):
            assert r["arrival_s"][row[b]] == pytest.approx(r["finish_s"][row[a]] + 0.2, rel=1e-12)
            follow += 1
    assert follow > 0
    assert all(p >= a + 0.005 - 1e-12 for a, p in zip(r["arrival_s"], r["picked_up_s"]))
