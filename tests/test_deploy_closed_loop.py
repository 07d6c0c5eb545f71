"""Closed-loop deployments: a session's next turn is sent, and routed, when its previous turn
finishes (on its decode replica when disaggregated), plus its think time."""

import numpy as np
import pyarrow as pa
import pytest

from aisim.config.engine import engine_config_from_dict
from aisim.deploy import deploy
from aisim.errors import ConfigError
from aisim.replay import replay
from aisim.traces import from_frame

from test_deploy import _log, _sessions

# 399 usable blocks of 16 tokens hold one request of 6,384 tokens (vLLM's start-up check).
ENGINE = {"num_gpu_blocks": 400, "max_model_len": 6384, "max_num_seqs": 8, "max_num_batched_tokens": 512,
          "time_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-5}}


def _eng(**over):
    return engine_config_from_dict({**ENGINE, **over})


@pytest.mark.parametrize("router", ["round_robin", "kv_aware", "least_loaded", "session_affinity"])
@pytest.mark.parametrize("think", [None, 0.2])
def test_one_replica_is_the_closed_loop_engine(router, think):
    eng, trace = _eng(), _sessions()
    single = replay(trace, eng, record_decisions=True, closed_loop=True, think_time_s=think)
    dep = deploy(trace, eng, {"replicas": 1, "router": router}, record_decisions=True, closed_loop=True,
                 think_time_s=think)
    assert _log(dep.replicas[0]) == _log(single)
    assert dep.requests.drop_columns(["replica", "prefill_replica", "decode_replica", "routed_s",
                                      "transfer_s"]).equals(single.requests)


def test_one_async_replica_is_the_closed_loop_engine():
    eng, trace = _eng(async_scheduling=True), _sessions()
    single = replay(trace, eng, record_decisions=True, closed_loop=True)
    dep = deploy(trace, eng, {"replicas": 1}, record_decisions=True, closed_loop=True)
    assert _log(dep.replicas[0]) == _log(single)


@pytest.mark.parametrize("router", ["round_robin", "kv_aware", "session_affinity"])
def test_a_closed_loop_deployment_is_the_deployment_of_its_send_times(router):
    """Re-timed to the instants its turns were sent, the open-loop deployment routes and replays alike;
    a next turn is sent at its previous turn's finish plus its think time."""
    eng, trace = _eng(), _sessions()
    closed = deploy(trace, eng, {"replicas": 3, "router": router}, closed_loop=True)
    sent = closed.requests.column("routed_s").to_numpy()
    # The send order: by time, ties in trace order (a released turn can be sent after later requests).
    order = np.lexsort((np.arange(len(sent)), sent))
    retimed = trace.set_column(trace.column_names.index("arrival_s"), "arrival_s", pa.array(sent)).take(order)
    again = deploy(retimed, eng, {"replicas": 3, "router": router})
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    assert again.requests.take(back).equals(closed.requests) and again.steps.equals(closed.steps)
    # By the links: each session's turn k + 1 is sent at turn k's finish plus the trace's gap.
    r = closed.requests.to_pydict()
    arrival = trace.column("arrival_s").to_pylist()
    by_session = {}
    for i, (sid, turn) in enumerate(zip(trace.column("session_id").to_pylist(), trace.column("turn").to_pylist())):
        by_session.setdefault(sid, []).append((turn, i))
    linked = 0
    for sid, turns in by_session.items():
        if sid is None:
            continue
        turns.sort()
        assert r["routed_s"][turns[0][1]] == arrival[turns[0][1]]
        for (_, a), (_, b) in zip(turns, turns[1:]):
            assert r["routed_s"][b] == r["finish_s"][a] + max(0.0, arrival[b] - arrival[a])
            linked += 1
    assert linked > 100


def test_a_session_waits_for_its_decode_replica():
    """P/D: the next turn is sent when the previous one finished decoding, plus 0.5 s."""
    from test_deploy_pd import _engine as pd_engine, _pd

    trace = from_frame(pa.table({"request_id": ["a", "b"], "session_id": ["s", "s"], "turn": [0, 1],
                                 "arrival_time": [0.0, 0.1], "prompt_len": [100, 100], "max_tokens": [4, 4]}))
    dep = deploy(trace, pd_engine(), _pd(), closed_loop=True, think_time_s=0.5)
    r = dep.requests.to_pydict()
    # Its prefill replica is idle by then: it arrives there at once (routed_s is the decode router's time).
    assert r["arrival_s"][1] == r["finish_s"][0] + 0.5 and r["routed_s"][1] > r["arrival_s"][1]
    assert deploy(trace, pd_engine(), _pd()).requests.column("arrival_s").to_pylist() == [0.0, 0.1]  # open loop


def test_closed_loop_refusals_are_named():
    eng, trace = _eng(), _sessions(n=20)
    with pytest.raises(ConfigError, match="think_time_s applies to closed-loop replays only"):
        deploy(trace, eng, {"replicas": 2}, think_time_s=1.0)
    with pytest.raises(ConfigError, match="max_concurrency caps an open-loop client"):
        deploy(trace, eng, {"replicas": 2}, closed_loop=True, max_concurrency=2)
    assert np.isfinite(deploy(trace, eng, {"replicas": 2}, closed_loop=True).summary["clock_end_s"])
