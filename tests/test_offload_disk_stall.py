"""A waiting request whose disk hits the CPU tier cannot hold together never runs, in vLLM 0.34.0 too
(docs/kv-offload.md, "The disk tier"): each promotion of its lookup evicts one of its own ready hits,
the least recently used chunks of a full tier (LRUCachePolicy.evict protects only the promoted key;
a request's chunks keep the rank it took at its first access).  The replay's stall error names that
state and the remedy.

Hand-built case: block size 16, one chunk a block, 11 GPU blocks (10 usable), 32 batched tokens a
step, the disk tier.  A (96 tokens of p) stores 6 chunks, 2 a step, all written to disk; C (159
tokens of its own) takes every GPU block and fills the CPU tier with its chunks; B (p + 16 of its
own) finds p on disk only.
"""

import pytest

from aisim.errors import ReplayError

from helpers import run_log
from test_kv_offload import _engine, _req
from test_offload_lru import _churn
from test_offload_lru import _engine as _churn_engine

REQS = [_req("A", 0, 96, "p", 96), _req("C", 10, 159), _req("B", 20, 112, "p", 96)]
LIVELOCK = ("requests cannot be scheduled: each step a waiting request's disk hits are read back into the "
            "full CPU tier, whose least recently used chunks are that request's own hits, so each read "
            "evicts a hit the last one brought and its lookup waits for ever (vLLM 0.34.0 does the same: "
            "its LRU policy ranks a waiting request's chunks below every finished request's; "
            "docs/kv-offload.md, \"The disk tier\"); give `kv_offload` a larger CPU tier (`cpu_blocks` or "
            "`size_gib`)")


def _small(cpu_blocks):
    eng = _engine(11, cpu_blocks=cpu_blocks, disk_tier=True)
    eng["max_num_batched_tokens"] = 32
    return eng


def test_a_tier_as_large_as_the_hits_reads_them_back_at_once():
    # 6 chunks.  B: step 20 RETRY (its 7 chunks probed); step 21 p's 6 chunks are on disk, each
    # promotion evicts one of C's chunks (cpu_evicted 6) and answers HIT_PENDING, chunk 6 is absent
    # (MISS): one read job of 6 chunks.  Step 22 hits all 6 in the CPU tier: load job 8 of 96 tokens;
    # reported by step 23, B runs from 96 tokens in step 24.
    steps, summary, res = run_log(_small(6), REQS)
    off = {k: steps[k]["offload"] for k in steps}
    assert off[20]["lookups"] == {"B": [0, None]}
    assert off[21]["lookups"] == {"B": [0, None]} and off[21]["cpu_evicted"] == 6
    assert off[21]["cpu_evictable"] == 0
    assert off[22]["lookups"] == {"B": [0, 96]} and off[22]["loads"] == {"8": ["B", 96, 6]}
    assert off[23]["done"] == [8] and steps[24]["new"] == {"B": 96} and steps[24]["sched"] == {"B": 16}
    disk = summary["kv_offload"]["disk"]
    assert (disk["hits"], disk["promotions"], disk["promoted_chunks"], disk["promote_failed"]) == (6, 1, 6, 0)
    assert res.requests.column("offload_hit_tokens").to_pylist() == [0, 0, 96]
    assert res.requests.column("offload_disk_read_chunks").to_pylist() == [0, 0, 6]


def test_a_tier_smaller_than_the_hits_never_lets_the_request_run():
    # 5 chunks.  Step 21 promotes chunks 0-4 (evicting C's 5); chunk 5 finds every chunk being
    # written (MISS), the lookup is None.  Step 22: chunks 0-4 are ready, hits of B ranked under B's
    # rank, older than any other; chunk 5's promotion evicts chunk 4 (the tail goes first), so the
    # lookup finds a hit being written and is None again.  Each step after reads back what the last
    # one evicted and evicts what it read; nothing else runs, as in vLLM, until the stall error.
    with pytest.raises(ReplayError) as err:
        run_log(_small(5), REQS)
    assert str(err.value) == "replay stalled at engine step 100019: 0 running and 1 waiting " + LIVELOCK


@pytest.mark.parametrize("seed, cpu_blocks, async_scheduling, step", [
    (1, 24, False, 101361), (1, 40, True, 101469), (2, 40, True, 101523)])
def test_the_churn_trace_stalls_on_a_small_tier(seed, cpu_blocks, async_scheduling, step):
    # The churn trace of tests/test_offload_lru.py with the disk tier: a request preempted with 6 hit
    # chunks comes back after every other request has finished and evicts its own hits, 4 read back a
    # step (synchronous scheduling, seed 1, 24 chunks).
    eng = _churn_engine(30, cpu_blocks=cpu_blocks, disk_tier=True)
    eng["async_scheduling"] = async_scheduling
    with pytest.raises(ReplayError) as err:
        run_log(eng, _churn(seed))
    assert str(err.value) == f"replay stalled at engine step {step}: 0 running and 1 waiting " + LIVELOCK


def test_the_churn_trace_completes_on_a_larger_tier():
    eng = _churn_engine(30, cpu_blocks=64, disk_tier=True)
    eng["async_scheduling"] = True
    _, summary, res = run_log(eng, _churn(1))
    assert res.requests.num_rows == 160 and summary["kv_offload"]["disk"]["promote_failed"] == 0
