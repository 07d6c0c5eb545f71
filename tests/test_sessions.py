"""Multi-turn sessions: later turns reuse earlier prompts and outputs; closed-loop pacing;
a whole real trace under the roofline model."""

import os

import pytest

from aisim.config.engine import engine_config_from_dict
from aisim.replay import replay
from aisim.traces import read_trace
from aisim.traces.inspect import inspect_trace
from aisim.traces.schema import output_stream, stream_id, trace_table

from conftest import DATA


def two_turns(at2=5.0):
    # Turn 2 resends turn 1's prompt (100 tokens) and its 30 outputs, then 40 new tokens.
    t1 = [(stream_id("s", "sys"), 0, 100)]
    t2 = t1 + [(output_stream("t1"), 0, 30), (stream_id("s", "new"), 0, 40)]
    rows = {"request_id": ["t1", "t2"], "arrival_step": [None, None], "arrival_s": [0.0, at2],
            "prompt_tokens": [100, 170], "output_tokens": [30, 5], "priority": [0, 0],
            "segments": [t1, t2], "session_id": ["s", "s"], "turn": [0, 1]}
    return trace_table(rows, "time")


ENGINE = dict(num_gpu_blocks=200, max_model_len=4096, time_model={"base_s": 0.01})


def test_second_turn_hits_prompt_and_output_blocks():
    res = replay(two_turns(), engine_config_from_dict(ENGINE))
    cached = dict(zip(res.requests.column("request_id").to_pylist(),
                      res.requests.column("cached_tokens").to_pylist()))
    # Turn 1 computed 100 + 29 tokens (the last output has no KV yet): 8 full
    # blocks = 100 prompt tokens and 28 outputs, all hit by turn 2.
    assert cached == {"t1": 0, "t2": 128}


def test_closed_loop_sends_the_next_turn_after_the_finish_plus_think_time():
    res = replay(two_turns(at2=0.0), engine_config_from_dict(ENGINE), closed_loop=True, think_time_s=0.5)
    r = res.requests.to_pydict()
    finish_t1 = r["finish_s"][0]
    # Arrivals are seen at the next schedule() at or after the release time.
    assert r["arrival_s"][1] >= finish_t1 + 0.5
    assert r["arrival_s"][1] < finish_t1 + 0.5 + 0.01 + 1e-9
    # Open loop, the same trace sends turn 2 at t = 0, before turn 1 has finished.
    res = replay(two_turns(at2=0.0), engine_config_from_dict(ENGINE))
    assert res.requests.column("arrival_s").to_pylist()[1] == 0.0


def test_closed_loop_needs_seconds():
    from aisim.errors import TraceError

    t = two_turns().replace_schema_metadata({"clock": "step"})
    with pytest.raises(TraceError, match="closed-loop"):
        replay(t, engine_config_from_dict(ENGINE), closed_loop=True)


def test_mooncake_sample_under_roofline_reuses_less_than_the_ideal():
    trace = read_trace(os.path.join(DATA, "traces", "mooncake", "synthetic_trace.jsonl"), "mooncake")
    engine = engine_config_from_dict(dict(
        num_gpu_blocks=20000, block_size=16, max_model_len=200000, max_num_batched_tokens=8192, max_num_seqs=64,
        time_model={"kind": "roofline", "gpu": "H100", "model": "llama-3.1-8b"}))
    res = replay(trace, engine)
    s = res.summary
    assert s["finished"] == s["requests"] == len(trace)
    ideal = inspect_trace(trace, unit_tokens=16)["ideal_hit_ratio"]
    achieved = s["prefix_cache_stats"]["hits"] / s["prefix_cache_stats"]["queries"]
    assert 0 < achieved < ideal
    assert s["duration_s"] > 0 and s["ttft_s"]["p50"] > 0
