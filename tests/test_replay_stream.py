"""A replay streamed in pieces is the whole replay, row for row and bit for bit, in bounded memory.

The core takes arrivals chunk by chunk and hands results back as they pile
up; every test compares :func:`aisim.replay.replay_stream` with
:func:`aisim.replay.replay` on the same trace (the recorded oracle
scenarios, closed loops, the priority policy, async scheduling), and checks
that the core's request slots follow the requests in flight.
"""

import json
import os

import numpy as np
import pyarrow as pa
import pytest

from aisim._core.engine import Engine
from aisim.config.engine import engine_config_from_dict
from aisim.core_input import core_config
from aisim.replay import _closed_loop, replay, replay_stream
from aisim.traces import read_trace
from aisim.traces.synth import synth_trace

from conftest import ORACLE, SPEC_ORACLE
from helpers import oracle_engine_dict


def _stream_input(trace, closed_loop=False, think=None):
    """The trace with what the stream needs beyond it, computed the whole-trace way."""
    ids = trace.column("request_id").to_pylist()
    rank = np.empty(len(ids), dtype=np.int32)
    rank[np.argsort(np.array(ids, dtype=object), kind="stable")] = np.arange(len(ids), dtype=np.int32)
    t = trace.append_column("id_rank", pa.array(rank))
    if closed_loop:
        nt, th = _closed_loop(trace, think)
        follows = np.zeros(len(ids), np.int8)
        follows[nt[nt >= 0]] = 1
        nth = np.zeros(len(ids))
        nth[nt >= 0] = th[nt[nt >= 0]]
        t = t.append_column("next_turn", pa.array(nt.astype(np.int64))).append_column("think_s", pa.array(th))
        t = t.append_column("next_think", pa.array(nth)).append_column("follows", pa.array(follows))
    return t


def _streamed(trace, eng, chunk, out_rows, closed_loop=False, think=None, stats=None):
    t = _stream_input(trace, closed_loop, think)
    timed = (trace.schema.metadata or {}).get(b"clock") == b"time"
    pieces = [t.slice(i, chunk) for i in range(0, t.num_rows, chunk)]
    requests, steps, summary = [], [], None
    for item in replay_stream(iter(pieces), eng, timed=timed, expected=t.num_rows, out_rows=out_rows,
                              stats=stats):
        if item[0] == "requests":
            requests.append(item[1])
            assert item[2].column("request_id").equals(item[1].column("request_id"))
        elif item[0] == "steps":
            steps.append(item[1])
        else:
            summary = item[1]
    return pa.concat_tables(requests), pa.concat_tables(steps), summary


def _same(whole, got):
    requests, steps, summary = got
    assert requests.equals(whole.requests)
    assert steps.equals(whole.steps)
    assert json.dumps(summary) == json.dumps(whole.summary)


@pytest.mark.parametrize("scenario", ["bench_full", "full_pressure", "full_pressure_async", "priority_threshold",
                                      "timed", "hybrid_mamba_pressure", "hybrid_swa"])
def test_oracle_scenarios_stream_to_the_same_rows(scenario):
    path = os.path.join(ORACLE, scenario)
    eng = engine_config_from_dict(oracle_engine_dict(path, "0.33.0"))
    trace = read_trace(os.path.join(path, "trace.jsonl"))
    whole = replay(trace, eng)
    for chunk, out_rows in ((7, 37), (500, 10_000)):
        _same(whole, _streamed(trace, eng, chunk, out_rows))


@pytest.mark.parametrize("scenario", sorted(os.listdir(SPEC_ORACLE)))
def test_speculative_scenarios_stream_to_the_same_rows(scenario):
    """Drafts, the acceptance rules and the trace's own ``accept`` lists survive the pieces."""
    path = os.path.join(SPEC_ORACLE, scenario)
    eng = engine_config_from_dict(oracle_engine_dict(path, "0.33.0"))
    trace = read_trace(os.path.join(path, "trace.jsonl"))
    whole = replay(trace, eng)
    assert whole.summary["spec"]["verifications"] > 0
    for chunk, out_rows in ((3, 11), (500, 10_000)):
        _same(whole, _streamed(trace, eng, chunk, out_rows))


def test_accept_lists_and_the_hash_rule_follow_the_trace_index_not_the_slot():
    """5,000 requests through reused slots: a request's acceptance is seeded by its place in the trace,
    and its ``accept`` list moves with it when the arena is packed."""
    n = 5000
    trace = synth_trace(n, seed=3, rate=400.0, prompt="uniform:16:200", output="uniform:2:40")
    rng = np.random.default_rng(8)
    lists = [None if i % 3 else [int(x) for x in rng.integers(0, 4, 1 + i % 5)] for i in range(n)]
    trace = trace.set_column(trace.schema.get_field_index("accept"), "accept", pa.array(lists, pa.list_(pa.int32())))
    eng = engine_config_from_dict({"num_gpu_blocks": 800, "max_model_len": 1024, "max_num_seqs": 16,
                                   "speculative": {"method": "eagle", "num_speculative_tokens": 3,
                                                   "acceptance": {"permille": 600}}})
    whole = replay(trace, eng)
    stats = {}
    got = _streamed(trace, eng, 97, 500, stats=stats)
    assert stats["slots"] == 4096 and whole.summary["spec"]["accepted_tokens"] > 0
    _same(whole, got)


@pytest.mark.parametrize("cfg", [{}, {"async_scheduling": True, "policy": "priority"}])
@pytest.mark.parametrize("think", [None, 0.5])
def test_closed_loop_sessions_stream_to_the_same_rows(cfg, think):
    trace = synth_trace(400, seed=5, rate=20.0, turns=4, think_time_s=0.3, prompt="uniform:50:900",
                        output="uniform:4:60")
    eng = engine_config_from_dict({"num_gpu_blocks": 600, "max_model_len": 4096, "max_num_seqs": 32, **cfg})
    whole = replay(trace, eng, closed_loop=True, think_time_s=think)
    # A turn's next turn is often in a later chunk: the core asks for input until it has it.
    _same(whole, _streamed(trace, eng, 3, 20, closed_loop=True, think=think))
    _same(whole, _streamed(trace, eng, 64, 1000, closed_loop=True, think=think))


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_a_burst_grows_the_slots_and_keeps_the_rows(policy):
    """7,000 requests at once on 4 sequences: the waiting queue outgrows the first 4,096 slots."""
    n = 7000
    rng = np.random.default_rng(2)
    trace = synth_trace(n, seed=9, rate=1e9, prompt="uniform:16:64", output="fixed:2")
    trace = trace.set_column(trace.schema.get_field_index("priority"), "priority",
                             pa.array(rng.integers(0, 3, n).astype(np.int32)))
    eng = engine_config_from_dict({"num_gpu_blocks": 64, "max_model_len": 256, "max_num_seqs": 4,
                                   "policy": policy})
    whole = replay(trace, eng)
    stats = {}
    _same(whole, _streamed(trace, eng, 1000, 4096, stats=stats))
    assert stats["slots"] == 8192  # 4,096, doubled once the burst is in


def test_the_core_holds_the_requests_in_flight_not_the_trace():
    """60,000 requests, about 10 at a time: the slots stay at the first 4,096, and the rows are the whole replay's."""
    trace = synth_trace(60_000, seed=4, rate=50.0, prompt="uniform:32:256", output="uniform:2:12")
    eng = engine_config_from_dict({"num_gpu_blocks": 2000, "max_model_len": 1024, "max_num_seqs": 64,
                                   "time_model": {"base_s": 0.01}})
    stats = {}
    got = _streamed(trace, eng, 2048, 8192, stats=stats)
    assert stats["slots"] == 4096
    _same(replay(trace, eng), got)


def test_the_streaming_engine_refuses_misuse():
    eng = engine_config_from_dict({"num_gpu_blocks": 100, "max_model_len": 4096})
    config = core_config(eng)
    with pytest.raises(TypeError, match="timed=True or timed=False"):
        Engine(config)
    with pytest.raises(ValueError, match="whole traces only"):
        Engine(config, None, True, timed=False)
    core = Engine(config, timed=False, expected=1)
    core.end_input()
    with pytest.raises(RuntimeError, match="after end_input"):
        core.feed(object())
    with pytest.raises(RuntimeError, match="replays a whole trace"):
        core.run()
