"""Shared chunk positions found through the dense key array, against the key map alone.

A chunk position whose key other requests of the trace share is found through its dense id, the
trace's prefix node of the run its last hash block ends in and the block's offset there
(ext/offload_map.pxi, ``_off_dense_fill``), instead of the CPU tier's key map; ids name keys one
to one, so the answers must be the map's.  The reference is the hook ``_offload_dense(False)``
(every shared chunk through the map); each comparison asserts the step table, the request table,
the summary and the decision log identical, and ``_offload_dense_stored()`` counts the chunks
stored under an id.
"""

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from aisim._core import scheduler
from aisim.config.engine import engine_config_from_dict
from aisim.replay import replay

from helpers import assert_same_replay, drawn_offload_case, make_trace, offload_requests
from test_offload_hints import _engine
from test_offload_lru import _churn
from test_offload_private import R0, R1, R2
from test_offload_private import _engine as _small_engine


def _both_ways(trace, eng):
    """The replay with the dense key array and with every shared chunk in the key map; asserts them
    identical and returns the first with the chunks it stored under a dense id."""
    old = scheduler._offload_dense(False)
    try:
        before = scheduler._offload_dense_stored()
        ref = replay(trace, eng, record_decisions=True)
        assert scheduler._offload_dense_stored() == before
    finally:
        scheduler._offload_dense(old)
    before = scheduler._offload_dense_stored()
    got = replay(trace, eng, record_decisions=True)
    dense = scheduler._offload_dense_stored() - before
    assert_same_replay(got, ref)
    return got, dense


def test_shared_chunks_stored_by_dense_id_and_found_by_the_sharer():
    # test_offload_private's first replay: r1 shares its first 32 tokens (chunks 0 and 1, in one
    # node) with r2, the rest of r1 and all of r0 are private.  r1's store in step 0 puts chunks 0
    # and 1 under their dense ids (2 chunks), its chunks 2-3 and r0's four out of both maps; r2 in
    # step 200 finds chunks 0-1 by the same ids and stores only its private chunk 2.
    eng = engine_config_from_dict(_small_engine(16))
    got, dense = _both_ways(make_trace([{**R0, "at": 0}, {**R1, "at": 0}, R2]), eng)
    assert dense == 2
    off = got.summary["kv_offload"]
    assert (off["stores"], off["store_chunks"], off["loads"], off["load_tokens"]) == (3, 9, 1, 48)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("offload", [
    {"cpu_blocks": 24},
    {"cpu_blocks": 40, "blocks_per_chunk": 2, "load_delay_steps": 3},
])
def test_churn_identical_both_ways(seed, asynchronous, offload):
    # The churn trace of test_offload_lru (160 requests over six shared prefixes) on a GPU pool
    # that preempts and a tier that evicts in most steps: dense chunks evicted, their chunks
    # reused for private and map keys and the reverse.
    got, dense = _both_ways(make_trace(_churn(seed)), _engine(30, asynchronous, **offload))
    off = got.summary["kv_offload"]
    assert off["cpu_evicted_chunks"] > 200 and off["loads"] > 10 and dense > 100


def test_no_dense_ids_with_a_disk_tier():
    # The disk tier's jobs find chunks by key: every shared chunk stays in the key map.
    got, dense = _both_ways(make_trace(_churn(1)), _engine(30, False, cpu_blocks=64, disk_tier=True))
    assert dense == 0 and got.summary["kv_offload"]["cpu_evicted_chunks"] > 0


requests = offload_requests(max_prompt=150, max_shared=140, max_size=14)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=requests, blocks=st.integers(8, 40), cpu=st.integers(2, 16), seqs=st.integers(1, 4),
       budget=st.sampled_from([16, 48, 256]), asynchronous=st.booleans(), prompt_only=st.booleans(),
       per_chunk=st.sampled_from([1, 2]), delays=st.sampled_from([(1, 1), (3, 1), (2, 3), (0, 1)]))
def test_random_traces_identical_both_ways(reqs, blocks, cpu, seqs, budget, asynchronous, prompt_only,
                                           per_chunk, delays):
    # test_offload_hints' drawn cases without the disk tier (it keeps every key in the map).
    case = drawn_offload_case(reqs, blocks, seqs, budget, asynchronous, {
        "cpu_blocks": cpu, "blocks_per_chunk": per_chunk, "load_delay_steps": delays[0],
        "store_delay_steps": delays[1], "extra": {"offload_prompt_only": prompt_only}})
    if case is None:
        return
    trace, eng = case
    _both_ways(trace, eng)
