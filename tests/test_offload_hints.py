"""A request's chunk hints against the key map alone: byte-identical replays.

The CPU tier remembers, for each chunk position of a request, the chunk it last found the position's
key in (ext/offload_lru.pxi, ``_off_hinted``); the re-rank at a request's end and its loads check
that chunk (in use, holding the key) before they ask the key map.  A chunk holds one key and a key
is in at most one chunk, so the answer must be the map's.  The reference here is the block-by-block
path: the hook ``_set_offload_hints(False)`` finds every chunk through the map.  Each comparison
replays a trace both ways on a tier that churns (a few chunks, evictions in most steps, loads in
flight while stores evict, partial hits of shared prefixes, with and without the disk tier) and
asserts the step table, the request table, the summary and the decision log identical.
"""


import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from aisim._core import scheduler
from aisim.config.engine import engine_config_from_dict
from aisim.replay import replay

from helpers import assert_same_replay, drawn_offload_case, make_trace, offload_requests
from test_offload_lru import _churn


def _both_ways(trace, eng):
    """The replay with hints and with every chunk found through the key map; asserts them identical."""
    scheduler._set_offload_hints(False)
    try:
        ref = replay(trace, eng, record_decisions=True)
    finally:
        scheduler._set_offload_hints(True)
    got = replay(trace, eng, record_decisions=True)
    assert_same_replay(got, ref)
    return got


def _engine(blocks, asynchronous=False, **offload):
    return engine_config_from_dict({
        "num_gpu_blocks": blocks, "block_size": 16, "max_model_len": 320, "max_num_seqs": 4,
        "max_num_batched_tokens": 256, "startup_check": False, "vllm_version": "0.34.0",
        "kv_cache_groups": [{"type": "full"}], "async_scheduling": asynchronous,
        "time_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 0.0001}, "kv_offload": offload})


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("offload", [
    {"cpu_blocks": 24},
    {"cpu_blocks": 40, "blocks_per_chunk": 2, "load_delay_steps": 3},
    {"cpu_blocks": 64, "disk_tier": True},
])
def test_churn_identical_both_ways(seed, asynchronous, offload):
    # A GPU pool of 30 blocks that preempts and a tier that evicts in most steps: the chunks a
    # request saw are evicted and their chunks reused for other keys before it finishes.
    # The churn trace of test_offload_lru: 160 requests, two a step, over six shared prefixes.
    got = _both_ways(make_trace(_churn(seed)), _engine(30, asynchronous, **offload))
    off = got.summary["kv_offload"]
    assert off["cpu_evicted_chunks"] > 200 and off["loads"] > 10


requests = offload_requests(max_prompt=150, max_shared=140, max_size=14)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=requests, blocks=st.integers(8, 40), cpu=st.integers(2, 16), seqs=st.integers(1, 4),
       budget=st.sampled_from([16, 48, 256]), asynchronous=st.booleans(), disk=st.booleans(),
       prompt_only=st.booleans(), per_chunk=st.sampled_from([1, 2]),
       delays=st.sampled_from([(1, 1), (3, 1), (2, 3), (0, 1)]))
def test_random_traces_identical_both_ways(reqs, blocks, cpu, seqs, budget, asynchronous, disk, prompt_only,
                                           per_chunk, delays):
    # A GPU pool that churns (8-40 blocks of 16 tokens), a CPU tier of 2-16 chunks (1 or 2 blocks each),
    # loads held in flight up to three steps while stores evict, with or without the disk tier.
    case = drawn_offload_case(reqs, blocks, seqs, budget, asynchronous, {
        "cpu_blocks": cpu, "blocks_per_chunk": per_chunk, "disk_tier": disk, "load_delay_steps": delays[0],
        "store_delay_steps": delays[1], "extra": {"offload_prompt_only": prompt_only}})
    if case is None:
        return
    trace, eng = case
    _both_ways(trace, eng)
