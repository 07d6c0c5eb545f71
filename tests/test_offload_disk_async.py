"""The disk tier under asynchronous scheduling, derived by hand (docs/kv-offload.md, "The disk tier").

vLLM 0.34.0's engine keeps a queue of two batches (v1/engine/core.py,
EngineCore.step_with_batch_queue): line N runs the schedule() of step N, then processes the output of
step N - 1 (update_from_output, whose update_connector_output reports the worker's jobs).  The tiering
manager's calls keep their places (v1/kv_offload/tiering/manager.py):

- the disk lookup, its promotions and their reads happen inside schedule() only (lookup,
  _initiate_promotion, on_schedule_end: AsyncLookupManager.flush, _flush_pending_promotions; the poll
  _maybe_process_finished_jobs at the first call): a verdict is known at the next schedule(), a read
  issued in step N is reported by the schedule() of step N + 1, as with synchronous scheduling;
- the write to disk is issued by complete_store, called from update_connector_output when a
  GPU -> CPU store is reported: the output of step N is processed in line N + 1, so the write is
  issued there and polled by the schedule() of step N + 2 (synchronous: issued in line N, polled at
  N + 1).

Block size 16; one chunk is one GPU block; 11 GPU blocks (10 usable), a CPU tier of 9 chunks and the
disk tier: the cases of tests/test_offload_disk.py.
"""

import pytest

from aisim.config.engine import engine_config_from_dict

from helpers import run_log
from test_kv_offload import _engine, _req
from test_offload_async import _off
from test_offload_disk import DISK_TOTALS, REQS


def _async_disk(**offload):
    eng = _engine(11, cpu_blocks=9, disk_tier=True, **offload)
    eng["async_scheduling"] = True
    return eng


def test_a_prefix_read_back_from_disk_under_async_scheduling():
    # - A (64 tokens of p) at line 0: no GPU hit, chunk 0 misses the CPU tier, the disk has no verdict
    #   for its 4 chunks: RETRY (4 queries), A is skipped; the probes go out at the end of schedule().
    #   Line 1: the verdict "absent" misses (1 query), A runs 64 tokens, store job 0 (4 chunks).
    #   Line 2: A's token is in flight (skipped); the output of step 1 finishes A; the worker submits
    #   job 0 when step 2 begins and the output of step 2 reports it, processed in line 3: the store
    #   cascades (complete_store), its 4 chunks pinned (cpu_evictable 0) and written from line 3.  The
    #   schedule() of line 4 polls the write (cpu_evictable 4, 4 chunks on disk): a step later than
    #   synchronous (3).  The engine steps on through 3 and 4: a job is in flight.
    # - B (159 tokens) at line 5: RETRY (9 queries); line 6: B runs 159 tokens on every GPU block
    #   (A's cached blocks go), store job 1 of 9 chunks evicts A's 4 (cpu_evicted 4).  Job 1 is
    #   reported by the output of step 7, processed in line 8 (write of 9), polled in line 9.
    # - C (p + 16) at line 10: no GPU hit, chunk 0 not in the CPU tier: RETRY (5 queries).  Line 11:
    #   chunks 0-3 are on disk, chunk 4 absent; each promotion takes a CPU chunk, evicting one of B's
    #   (cpu_evicted 4, cpu_evictable 9 - 4 = 5); the lookup is None; one read job of 4 goes out at the
    #   end of schedule().  Line 12 polls the read (the 4 chunks evictable, then pinned by the load):
    #   C hits 64 tokens in the CPU tier (chunk 4's held "absent": 1 query), load job 2, 4 GPU blocks
    #   (free 6), C waits in WAITING_FOR_REMOTE_KVS.  The output of step 13 reports the load,
    #   processed in line 14 (after schedule() skipped C); C runs from 64 tokens in line 15
    #   (synchronous: 14) and stores chunk 4 (job 3, evicting one chunk).  Job 3 is reported by the
    #   output of step 16, processed in line 17 (write of 1), polled in line 18.  Line 19 drains the
    #   output of step 18 (no decision-log line).
    steps, summary, res = run_log(_async_disk(), REQS)
    off = _off(steps)
    assert sorted(steps) == list(range(19))
    assert off[0]["lookups"] == {"A": [0, None]} and steps[0]["sched"] == {}
    assert off[1]["lookups"] == {"A": [0, 0]} and off[1]["stores"] == {"0": ["A", 4]}
    assert "done" not in off[2] and off[3]["done"] == [0]
    assert "cpu_evictable" not in off[3] and off[4]["cpu_evictable"] == 4
    assert off[5]["lookups"] == {"B": [0, None]} and off[6]["lookups"] == {"B": [0, 0]}
    assert off[6]["stores"] == {"1": ["B", 9]} and off[6]["cpu_evicted"] == 4 and steps[6]["free_blocks"] == 0
    assert off[8]["done"] == [1] and "cpu_evictable" not in off[8] and off[9]["cpu_evictable"] == 9
    assert off[10]["lookups"] == {"C": [0, None]}
    assert off[11]["lookups"] == {"C": [0, None]} and off[11]["cpu_evicted"] == 4
    assert off[11]["cpu_used"] == 9 and off[11]["cpu_evictable"] == 5
    assert off[12]["lookups"] == {"C": [0, 64]} and off[12]["loads"] == {"2": ["C", 64, 4]}
    assert steps[12]["free_blocks"] == 6 and off[12]["remote_wait"] == ["C"]
    assert off[13]["remote_wait"] == ["C"] and "done" not in off[13] and steps[13]["sched"] == {}
    assert off[14]["done"] == [2] and off[14]["recving"] == ["C"] and steps[14]["sched"] == {}
    assert steps[15]["new"] == {"C": 64} and steps[15]["sched"] == {"C": 16}
    assert off[15]["stores"] == {"3": ["C", 1]} and off[15]["cpu_evicted"] == 1 and off[15]["cpu_evictable"] == 8
    assert off[17]["done"] == [3] and off[17]["cpu_evictable"] == 8 and off[18]["cpu_evictable"] == 9
    # The tier's totals are the synchronous replay's: the same lookups, RETRYs, read and writes.
    assert summary["kv_offload"]["disk"] == DISK_TOTALS
    assert res.requests.column("offload_hit_tokens").to_pylist() == [0, 0, 64]
    assert res.requests.column("offload_disk_read_chunks").to_pylist() == [0, 0, 4]
    # The writes issued in lines 3, 8 and 17 and on disk from the next line's poll; C's read at 11.
    col = {c: res.steps.column(c).to_pylist() for c in res.steps.column_names}
    assert col["step"] == list(range(20))
    assert col["offload_disk_queries"] == [4, 1, 0, 0, 0, 9, 1, 0, 0, 0, 5, 5, 1] + [0] * 7
    assert col["offload_disk_hits"] == col["offload_disk_read_chunks"] == [0] * 11 + [4] + [0] * 8
    assert col["offload_disk_write_chunks"] == [0, 0, 0, 4, 0, 0, 0, 0, 9] + [0] * 8 + [1, 0, 0]
    assert col["offload_disk_chunks"] == [0] * 4 + [4] * 5 + [13] * 9 + [14] * 2


def test_a_write_reported_late_keeps_its_chunks_pinned_for_the_next_store():
    # disk_write_delay_steps = 4: a write issued in line L is polled by the schedule() of line L + 4.
    # - A's write, issued in line 3, lands in line 7: A's 4 chunks stay pinned through B's store in
    #   line 6 (9 chunks, 5 free, nothing evictable: CPUOffloadingManager.prepare_store returns None,
    #   the store is dropped).  Line 7's poll frees them (cpu_evictable 4); B, in flight, is neither
    #   scheduled nor finished by the last update in line 7; its output (step 6) finishes it in line
    #   7, so line 8 offers its 9 chunks again (a finished request's store): job 1 evicts A's 4.
    # - Job 1 is reported by the output of step 9, processed in line 10: B's 9 chunks, the whole CPU
    #   tier, are pinned for their write until line 14.  C's RETRY at line 10, then in line 11 chunk 0
    #   is on disk (A's write landed in line 7) but its promotion finds no CPU chunk to evict: MISS
    #   (promote_failed 1), and C recomputes its 80 tokens at line 11.  Synchronous, B's store goes
    #   out in step 6, its write is polled by step 11's first call and C reads A's prefix back.
    steps, summary, _ = run_log(_async_disk(disk_write_delay_steps=4), REQS)
    off = _off(steps)
    assert off[3]["done"] == [0] and "cpu_evictable" not in off[6] and off[7]["cpu_evictable"] == 4
    assert "stores" not in off[6] and "stores" not in off[7]
    assert off[8]["stores"] == {"1": ["B", 9]} and off[8]["cpu_evicted"] == 4 and off[10]["done"] == [1]
    assert off[11]["lookups"] == {"C": [0, 0]} and steps[11]["new"] == {"C": 0} and steps[11]["sched"] == {"C": 80}
    assert "cpu_evictable" not in off[13] and off[14]["cpu_evictable"] == 9
    disk = summary["kv_offload"]["disk"]
    assert (disk["hits"], disk["promote_failed"], disk["promoted_chunks"], disk["written_chunks"]) == (1, 1, 0, 13)
    steps, _, _ = run_log(_engine(11, cpu_blocks=9, disk_tier=True, disk_write_delay_steps=4), REQS)
    assert steps[6]["offload"]["stores"] == {"1": ["B", 9]} and steps[14]["new"] == {"C": 64}


def test_disk_reads_and_writes_on_the_clock_under_async_scheduling():
    # PCIe 4.0 x16, chunks of 100 MiB, the drive's 6.9 GB/s read and 4.1 GB/s write; every step
    # computes 10 ms; line N + 1 starts when the forward pass of step N ends.  The output of step N
    # is processed then: a write it cascades starts at that instant (the end of step N).
    # - A's store (4 chunks, 13.3 ms on the link) is submitted when step 2 begins, lands in step 3
    #   and is reported by its output, processed in line 4: the write of 4 chunks starts as line 4
    #   does, and the empty line 4 (after the empty step 3) lasts until it lands, 4 * chunk / 4.1e9.
    # - B's store (9 chunks, 29.95 ms) is submitted when step 7 begins; the empty line 8 lasts until
    #   it lands (29.95 - 10 ms); its output, processed in line 9, starts the write of 9 chunks:
    #   line 9 lasts 9 * chunk / 4.1e9.
    # - C's read of 4 chunks goes out as line 11's schedule() ends: line 11 lasts 4 * chunk / 6.9e9.
    #   Its load, issued in line 12, starts when the output of step 12 is processed (line 13) and
    #   lasts 13.3 ms: line 13 lasts that (synchronous: step 12 lasts 10 + 13.3 ms).
    # - C's store of 1 chunk lands in step 16; line 17 starts its write: 1 * chunk / 4.1e9.
    chunk = 100 * 2**20
    pcie = 16e9 * 128 / 130 / 8 * 16
    steps, summary, res = run_log(_async_disk(pcie_gen=4, kv_bytes_per_block=chunk), REQS)
    dur = dict(zip(res.steps.column("step").to_pylist(), res.steps.column("duration_s").to_pylist()))
    assert steps[4]["offload"]["done"] == [0] and dur[4] == pytest.approx(4 * chunk / 4.1e9)
    assert steps[5]["offload"]["cpu_evictable"] == 4
    assert dur[8] == pytest.approx(9 * chunk / pcie - 0.01)
    assert steps[9]["offload"]["done"] == [1] and dur[9] == pytest.approx(9 * chunk / 4.1e9)
    assert steps[11]["offload"]["lookups"] == {"C": [0, None]} and dur[11] == pytest.approx(4 * chunk / 6.9e9)
    assert steps[12]["offload"]["loads"] == {"2": ["C", 64, 4]} and dur[12] == pytest.approx(0.01)
    assert dur[13] == pytest.approx(4 * chunk / pcie) and steps[14]["offload"]["done"] == [2]
    assert steps[15]["new"] == {"C": 64}
    assert steps[17]["offload"]["done"] == [3] and dur[17] == pytest.approx(chunk / 4.1e9)
    disk = summary["kv_offload"]["disk"]
    assert disk["read_bytes"] == 4 * chunk and disk["write_bytes"] == 14 * chunk


def test_the_disk_tier_replays_under_async_scheduling():
    # The engine and `aisim plan` from a probe that ran the fs tier with async scheduling keep the tier.
    from aisim.plan import plan_from_probe

    from test_offload_disk import _ktc
    from test_offload_surfaces import _probe

    assert engine_config_from_dict(_async_disk()).kv_offload.disk_tier is True
    ktc = _ktc(secondary_tiers=[{"type": "fs", "root_dir": "/mnt/kv"}])
    cfg, notes = plan_from_probe(_probe(kv_transfer_config=ktc, async_scheduling=True))
    assert cfg.async_scheduling and cfg.kv_offload.disk_tier is True
    assert any("512 chunks, a disk tier behind it (TieringOffloadingSpec, fs)" in n for n in notes)
