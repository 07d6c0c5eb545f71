"""KV offload tiers in deployments whose copies are timed on the PCIe link (docs/kv-offload.md,
"Deployments"): every replica has its own tier and its own link, and each replica replays its share
exactly as a single engine with the same tier does.

Block size 16, one CPU chunk per GPU block of 100 MiB; the default step takes 10 ms.  PCIe 4.0 x16
moves 16e9 * 128/130 / 8 * 16 = 31.5e9 bytes/s: a chunk crosses in 104857600 / 31.5e9 = 3.328 ms.
"""

import pytest

from aisim.config.engine import engine_config_from_dict
from aisim.deploy import deploy
from aisim.replay import replay

from helpers import ipc_bytes, make_trace
from test_kv_offload import _engine, _req

CHUNK = 100 * 2**20
CHUNK_S = CHUNK / (16e9 * 128 / 130 / 8 * 16)

# Round-robin over two replicas in arrival order: A, B, C, F to replica 0; D, E, G to replica 1.
# A and D (64 tokens each, 4 blocks) are stored at once, each over its replica's own link.  B evicts
# A's blocks from replica 0's GPU; C (p + 16) loads A's 4 chunks from replica 0's tier: step 6 issues
# the load at 10.01 (the end of its forward pass), it lands at 10.01 + 4 * 3.328 ms = 10.023312, and
# the empty step 6 polls until F reaches replica 0 at 10.015 -- not until G reaches replica 1 at
# 10.012, nor until the copy lands.  Step 7 runs F and its poll at 10.025 reports the load; C runs in
# step 8 from its 64 loaded tokens (TTFT 10.035 - 10).
TRACE = [_req("A", 0, 64, "p", 64), _req("D", 0, 64, "q", 64), _req("B", 5, 159), _req("E", 7, 20),
         _req("C", 10, 80, "p", 64), _req("G", 10.012, 20), _req("F", 10.015, 20)]


def _cfg():
    return engine_config_from_dict(_engine(11, cpu_blocks=20, pcie_gen=4, kv_bytes_per_block=CHUNK))


def test_a_replica_replays_its_share_as_one_engine_with_transfers_on_the_clock():
    cfg = _cfg()
    d = deploy(make_trace(TRACE, "time"), cfg, {"replicas": 2, "router": "round_robin"})
    rq = d.requests.to_pydict()
    assert rq["replica"] == [0, 1, 0, 1, 0, 1, 0]
    assert rq["offload_hit_tokens"] == [0, 0, 0, 0, 64, 0, 0]
    assert rq["ttft_s"][4] == pytest.approx(0.035)
    alone = replay(make_trace([TRACE[0], TRACE[2], TRACE[4], TRACE[6]], "time"), cfg)
    zero = d.requests.column("replica").to_numpy() == 0
    mine = d.requests.filter(zero).select(alone.requests.column_names)
    assert ipc_bytes(mine.combine_chunks()) == ipc_bytes(alone.requests.combine_chunks())
    zero = d.steps.column("replica").to_numpy() == 0
    steps = d.steps.filter(zero).select(alone.steps.column_names)
    assert ipc_bytes(steps.combine_chunks()) == ipc_bytes(alone.steps.combine_chunks())
    # Step 6 issues the load, computes nothing and polls until F arrives at 10.015.
    st = alone.steps.to_pydict()
    assert st["offload_loads"][6] == 1 and st["num_reqs"][6] == 0
    assert st["clock_s"][6] == pytest.approx(10.0) and st["duration_s"][6] == pytest.approx(0.015)
    assert st["offload_completed"][7] == 1 and st["num_reqs"][8] == 1


def test_each_replica_copies_over_its_own_link():
    # A's store on replica 0 and D's on replica 1 are submitted together when step 1 begins; each
    # crosses its own link in 4 * 3.328 ms = 13.312 ms (one shared link would need twice that for one).
    d = deploy(make_trace(TRACE, "time"), _cfg(), {"replicas": 2, "router": "round_robin"})
    st = d.steps.to_pydict()
    first = {(w, s): dur for w, s, dur in zip(st["replica"], st["step"], st["duration_s"])}
    assert first[(0, 1)] == pytest.approx(4 * CHUNK_S) == pytest.approx(0.013312)
    assert first[(1, 1)] == pytest.approx(4 * CHUNK_S)
    # B's 9 chunks on replica 0: 9 * 3.328 ms.
    assert first[(0, 4)] == pytest.approx(9 * CHUNK_S) == pytest.approx(0.029952)
    assert d.summary["kv_offload"]["load_bytes"] == 4 * CHUNK
