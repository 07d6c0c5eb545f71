"""A lookup with the disk tier answered from the request's last scan: byte-identical replays.

A request held at the waiting queue's head asks the connector again every step.  With the disk tier
a request's lookup scan (ext/offload_disk.pxi, ``disk_scan``; up to eight requests' at once) is kept
when every chunk it read was a CPU hit, up to the end or up to one key whose held disk verdict is
"absent": asking again then changes nothing but the disk tier's query counters, which are replayed.
The kept scans are dropped when a chunk one of them found is evicted, pinned, completed or read from
disk, or the key where one stopped is stored or written to disk.  The reference is a fresh scan at
every lookup: the hook ``_set_offload_disk_memo(False)``.
"""


import pytest

from aisim._core import scheduler
from aisim.replay import replay

from helpers import assert_same_replay, make_trace, run_log
from test_kv_offload import _engine
from test_offload_disk import REQS
from test_offload_hints import _engine as _churn_engine
from test_offload_lru import _churn


def _fresh_scans(fn):
    scheduler._set_offload_disk_memo(False)
    try:
        return fn()
    finally:
        scheduler._set_offload_disk_memo(True)


def test_held_lookup_counts_its_disk_query_every_step():
    # REQS of test_offload_disk (A, B, then C sharing A's 64 tokens) with reads from disk reported
    # three steps after they are issued.  Steps 0-8 are as there.  C:
    # - step 10: no GPU hit, chunks 0-4 miss the CPU tier and answer RETRY (5 queries);
    # - step 11: chunks 0-3 are on disk and promoted (4 of B's chunks evicted, HIT_PENDING), chunk 4
    #   is absent (MISS): 5 queries, the lookup is None, the read job goes out;
    # - steps 12 and 13: chunks 0-3 are CPU hits being written, chunk 4's held verdict "absent"
    #   stops the scan: 1 query each, None.  Step 12's scan is kept and step 13 answers from it;
    # - step 14: the poll reports the read (the kept scan is dropped: its chunks are ready), chunks
    #   0-3 hit, chunk 4 absent: 1 query, 64 tokens, load job 2.
    # Queries: A 4 + 1, B 9 + 1, C 5 + 5 + 1 + 1 + 1 = 28; RETRY 4 + 9 + 5.
    eng = _engine(11, cpu_blocks=9, disk_tier=True, disk_read_delay_steps=3)
    for steps, summary, res in (run_log(eng, REQS), _fresh_scans(lambda: run_log(eng, REQS))):
        off = {k: steps[k]["offload"] for k in steps}
        assert [off[k]["lookups"] for k in (10, 11, 12, 13)] == [{"C": [0, None]}] * 4
        assert off[14]["lookups"] == {"C": [0, 64]} and off[14]["loads"] == {"2": ["C", 64, 4]}
        disk = summary["kv_offload"]["disk"]
        assert (disk["queries"], disk["retries"], disk["hits"], disk["promoted_chunks"]) == (28, 18, 4, 4)
        col = res.steps.column("offload_disk_queries").to_pylist()
        assert col == [4, 1, 0, 0, 9, 1, 0, 0, 5, 5, 1, 1, 1, 0, 0, 0, 0]
        assert res.requests.column("offload_hit_tokens").to_pylist() == [0, 0, 64]


def _both_ways(trace, eng):
    ref = _fresh_scans(lambda: replay(trace, eng, record_decisions=True))
    got = replay(trace, eng, record_decisions=True)
    assert_same_replay(got, ref)
    return got


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("offload", [
    {"cpu_blocks": 64, "disk_tier": True},
    {"cpu_blocks": 24, "disk_tier": True, "disk_read_delay_steps": 3},
    {"cpu_blocks": 40, "blocks_per_chunk": 2, "disk_tier": True, "disk_read_delay_steps": 2,
     "disk_write_delay_steps": 3, "load_delay_steps": 2},
])
def test_churn_identical_with_fresh_scans(seed, asynchronous, offload):
    # The churn trace of test_offload_lru (160 requests, two a step, six shared prefixes) on a GPU
    # pool of 30 blocks that preempts and a CPU tier that evicts in most steps, reads from disk held
    # in flight for some steps while other requests' lookups wait.
    got = _both_ways(make_trace(_churn(seed)), _churn_engine(30, asynchronous, **offload))
    off = got.summary["kv_offload"]
    assert off["cpu_evicted_chunks"] > 100 and off["disk"]["promoted_chunks"] > 10
