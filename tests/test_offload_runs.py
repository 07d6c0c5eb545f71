"""A store's new chunks linked into the CPU tier's LRU order as one run, against placing each by itself.

LRUCachePolicy ranks a stored chunk (request rank, -position) (vllm/v1/kv_offload/cpu/policies/lru.py);
aisim keeps the chunks in rank order in one list, a request's chunks after its rank's anchor
(ext/offload_lru.pxi).  A store's new chunks come in rising position, so each goes right after the
anchor, and ext/offload.pxi (``_off_store_new``) links them at once -- unless a chunk of the same
rank and a higher position already follows the anchor (the request stores again below its own
chunks in the tier): then each is placed by itself.  The reference here places every chunk by
itself (the hook ``_set_offload_runs(False)``); each comparison asserts the two replays identical,
and ``_offload_runs_split()`` counts the stores that could not take the run.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from aisim._core import scheduler
from aisim.config.engine import engine_config_from_dict
from aisim.replay import replay

from helpers import assert_same_replay, drawn_offload_case, make_trace, offload_requests, run_log
from test_offload_lru import _churn
from test_offload_lru import _engine as _churn_engine


def _both_ways(run):
    """``run()`` with the run's splice and with every chunk placed by itself: both results and the
    stores that could not take the run in the first."""
    split = scheduler._offload_runs_split()
    got = run()
    split = scheduler._offload_runs_split() - split
    old = scheduler._set_offload_runs(False)
    try:
        ref = run()
    finally:
        scheduler._set_offload_runs(old)
    return got, ref, split


def _trail(steps):
    """The store jobs ([step, request, chunks]) and the evictions by step."""
    stores, evicted = [], {}
    for k, s in sorted(steps.items()):
        off = s["offload"]
        stores += [[k, *job] for job in off["stores"].values()]
        if off["cpu_evicted"]:
            evicted[k] = off["cpu_evicted"]
    return stores, evicted


def test_a_request_storing_below_its_own_chunks_places_them_one_by_one():
    # 16-token blocks and chunks, 9 usable GPU blocks, a tier of 4 chunks, prompts only offloaded.
    # Step 0: w (16 tokens, the shared block "s") stores chunk 0 at rank 1; x (64 tokens) hits w's
    # block on the GPU, finds chunk 0 still being stored (not its own: not seen) and stores its
    # chunks 1-3 at rank 2 (new: one run).  Step 2: z stores its 2 chunks (one run) and evicts the
    # lowest ranks, w's chunk 0 and x's chunk 3 (rank 2, the highest position first).  x is
    # preempted in step 33 (its 7th block; w holds 4) and resumes in step 40, as w finishes in 39,
    # with all 96 computed tokens on the GPU: its lookup offers nothing, so it stores from chunk 0
    # again.  Chunks 1 and 2 are in the tier at its rank right after its anchor; new chunk 0 goes
    # past them (the one split store), new chunk 3 before them; z's chunks (fresh ranks since it
    # finished in step 3) are evicted.
    engine = {"num_gpu_blocks": 10, "block_size": 16, "max_model_len": 320, "max_num_seqs": 3,
              "max_num_batched_tokens": 256, "startup_check": False, "vllm_version": "0.34.0",
              "kv_cache_groups": [{"type": "full"}],
              "kv_offload": {"cpu_blocks": 4, "extra": {"offload_prompt_only": True}}}
    reqs = [{"id": "w", "at": 0, "prompt": 16, "max_tokens": 40, "segments": [("s", 0, 16)]},
            {"id": "x", "at": 0, "prompt": 64, "max_tokens": 40, "segments": [("s", 0, 16), ("own", 16, 48)]},
            {"id": "z", "at": 2, "prompt": 32, "max_tokens": 2}]
    got, ref, split = _both_ways(lambda: run_log(engine, reqs))
    assert split == 1
    assert got[0] == ref[0] and got[1] == ref[1]
    stores, evicted = _trail(got[0])
    assert stores == [[0, "w", 1], [0, "x", 3], [2, "z", 2], [40, "x", 2]]
    assert evicted == {2: 2, 40: 2}
    assert got[0][33]["preempted"] == ["x"] and got[0][40]["resumed"] == {"x": 96}
    assert got[0][40]["offload"]["lookups"] == {"x": [96, 0]}


@pytest.mark.parametrize("seed, offload, splits", [
    (1, {"cpu_blocks": 24}, 5),
    (2, {"cpu_blocks": 24}, 2),
    (1, {"cpu_blocks": 40, "blocks_per_chunk": 2}, 0),
])
def test_churn_identical_both_ways(seed, offload, splits):
    # The churn trace of test_offload_lru (its eviction trails pinned there): preemptions make
    # requests store again below their own chunks now and then.
    trace = make_trace(_churn(seed))
    eng = engine_config_from_dict(_churn_engine(30, **offload))
    got, ref, split = _both_ways(lambda: replay(trace, eng, record_decisions=True))
    assert_same_replay(got, ref)
    assert split == splits


requests = offload_requests(max_prompt=150, max_shared=140, max_size=14)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=requests, blocks=st.integers(8, 40), cpu=st.integers(2, 16), seqs=st.integers(1, 4),
       asynchronous=st.booleans(), disk=st.booleans(), per_chunk=st.sampled_from([1, 2]))
def test_random_traces_identical_both_ways(reqs, blocks, cpu, seqs, asynchronous, disk, per_chunk):
    # The random traces of test_offload_hints: requests sharing 0-140 tokens of one of three prefixes.
    case = drawn_offload_case(reqs, blocks, seqs, 48, asynchronous,
                              {"cpu_blocks": cpu, "blocks_per_chunk": per_chunk, "disk_tier": disk})
    if case is None:
        return
    trace, eng = case
    got, ref, _ = _both_ways(lambda: replay(trace, eng, record_decisions=True))
    assert_same_replay(got, ref)
