"""KV offload under asynchronous scheduling (vLLM 0.33 and later turn it on), derived by hand.

The engine keeps a queue of two batches (EngineCore.step_with_batch_queue): the schedule() of step
N + 1 runs before the output of step N is processed.  The worker still runs the steps in order, so a
job issued in step N is reported by the output of step N + delay as with synchronous scheduling,
and the scheduler sees it one step later: after the schedule() of step N + delay + 1.  Block size 16,
one CPU chunk per GPU block; the cases of tests/test_kv_offload.py.
"""

import os

import pytest

from aisim.config.engine import engine_config_from_dict
from aisim.replay import replay

from conftest import DATA
from helpers import oracle_engine_dict, oracle_hash_id_trace, run_log
from test_kv_offload import _engine, _req


def _async(blocks, **offload):
    eng = _engine(blocks, **offload)
    eng["async_scheduling"] = True
    return eng


def _off(steps):
    return {k: {f: v for f, v in steps[k]["offload"].items() if v not in ({}, [], 0)} for k in steps}


def test_a_reload_from_the_cpu_tier_one_step_later():
    # 10 usable GPU blocks.  Each line N schedules step N, then processes the output of step N - 1.
    # Step 0: A (64 tokens of p) runs its prefill; its 4 chunks are offered: store job 0.  Step 1
    #   schedules nothing (A's one token is a placeholder in flight: the async guard skips A); the
    #   output of step 0 finishes A and hands job 0 to the worker, which submits it when step 1
    #   begins.  Step 2: the output of step 1 reports job 0 (done); A's finished store offers
    #   nothing new.  Line 3 only processes step 2's output (nothing left to schedule).
    # Step 5: B (159 tokens, 10 blocks) takes every GPU block, evicting A's cached ones; store job 1
    #   (9 chunks), reported by the output of step 6, processed in line 7.
    # Step 10: C (p + 16) has no GPU hit; the tier offers A's 4 chunks: load job 2, C waits in
    #   WAITING_FOR_REMOTE_KVS.  The worker reports the load in the output of step 11 (load_delay
    #   1), which line 12 processes after schedule() has skipped C again; C runs in step 13 from 64
    #   computed tokens (synchronous: step 12) and stores its fifth chunk (job 3, reported in 15).
    steps, summary, res = run_log(_async(11, cpu_blocks=20), [
        _req("A", 0, 64, "p", 64), _req("B", 5, 159), _req("C", 10, 80, "p", 64)])
    off = _off(steps)
    assert sorted(steps) == [0, 1, 2, 5, 6, 7, 10, 11, 12, 13, 14, 15]
    assert off[0] == {"lookups": {"A": [0, 0]}, "stores": {"0": ["A", 4]}, "cpu_used": 4}
    assert "done" not in off[1] and off[2]["done"] == [0] and off[2]["cpu_evictable"] == 4
    assert off[5]["stores"] == {"1": ["B", 9]} and off[7]["done"] == [1]
    assert off[10]["lookups"] == {"C": [0, 64]} and off[10]["loads"] == {"2": ["C", 64, 4]}
    assert off[10]["remote_wait"] == ["C"] and steps[10]["sched"] == {}
    assert off[11]["remote_wait"] == ["C"] and "done" not in off[11] and steps[11]["sched"] == {}
    assert off[12]["done"] == [2] and off[12]["recving"] == ["C"] and steps[12]["sched"] == {}
    assert steps[13]["new"] == {"C": 64} and steps[13]["sched"] == {"C": 16}
    assert off[13]["stores"] == {"3": ["C", 1]} and off[15]["done"] == [3]
    assert summary["kv_offload"]["completed_jobs"] == 4 and summary["kv_offload"]["load_tokens"] == 64
    assert res.requests.to_pydict()["offload_hit_tokens"] == [0, 0, 64]


def test_a_store_waits_for_the_token_in_flight():
    # Without offload_prompt_only, A's generated tokens are stored too (prompt 20, 14 tokens out).
    # Chunk 1 covers positions 16..31.  _build_store_jobs offers min(num_computed_tokens + scheduled,
    # num_tokens) tokens.  Synchronous, step k >= 1 computes position 19 + k with 20 + k tokens known:
    # chunk 1 is stored in step 12 (job 1).  Asynchronous, the schedule() of step k counts the
    # placeholder in num_computed_tokens but knows only 19 + k tokens (the output of step k - 1 is
    # still in flight): chunk 1 goes in step 13, and is reported in line 15 instead of 13.
    for asy, store_step, done_step in ((False, 12, 13), (True, 13, 15)):
        eng = _engine(11, cpu_blocks=20, extra={"offload_prompt_only": False})
        eng["async_scheduling"] = asy
        steps, _, _ = run_log(eng, [_req("A", 0, 20, max_tokens=14)])
        stores = {k: steps[k]["offload"]["stores"] for k in steps if steps[k]["offload"]["stores"]}
        done = {k: steps[k]["offload"]["done"] for k in steps if steps[k]["offload"]["done"]}
        assert stores == {0: {"0": ["A", 1]}, store_step: {"1": ["A", 1]}}
        assert done == {1 + asy: [0], done_step: [1]}


def test_transfers_on_the_pcie_clock_under_async_scheduling():
    # tests/test_kv_offload.py's PCIe 4.0 x16 case: C's load of 4 chunks of 100 MiB lasts 13.3 ms.
    # Step 10 issues it; the worker submits it when step 10's forward pass ends.  Line 11 schedules
    # an empty step 11 and processes step 10's output (the copy is submitted): neither step computed
    # anything, so step 11 lasts until the copy lands.  Step 11's output reports it (line 12) and C
    # runs in step 13.
    chunk = 100 * 2**20
    steps, _, res = run_log(_async(11, cpu_blocks=20, pcie_gen=4, kv_bytes_per_block=chunk), [
        _req("A", 0, 64, "p", 64), _req("B", 5, 159), _req("C", 10, 80, "p", 64)])
    load_s = 4 * chunk / (16e9 * 128 / 130 / 8 * 16)
    dur = dict(zip(res.steps.column("step").to_pylist(), res.steps.column("duration_s").to_pylist()))
    assert steps[10]["offload"]["loads"] == {"2": ["C", 64, 4]}
    assert steps[12]["offload"]["recving"] == ["C"] and steps[13]["new"] == {"C": 64}
    assert dur[10] == pytest.approx(0.01) and dur[11] == pytest.approx(load_s)
    # A's store (4 chunks), submitted when step 1 begins (t = 10 ms), lands at 23.3 ms: step 1's
    # poll (ends at 20 ms) misses it, step 2's (ends at 30 ms) reports it, in line 3.
    assert steps[3]["offload"]["done"] == [0] and dur[1] == pytest.approx(0.01)


def test_a_tier_that_serves_nothing_changes_nothing():
    # The offload_multiturn trace, asynchronous, with a GPU pool that never evicts: every prefix is
    # found on the GPU, so no lookup offers a chunk (the tier holds only chunks computed on the GPU)
    # and no preemption flushes a store.  The stores run beside the steps: the step and request
    # tables, their offload columns aside, are those of the same replay without the tier.
    d = os.path.join(DATA, "oracle", "offload", "offload_multiturn")
    trace = oracle_hash_id_trace(os.path.join(d, "trace.jsonl"))
    out = []
    for tier in (True, False):
        raw = oracle_engine_dict(d, "0.34.0")
        raw.update(async_scheduling=True, num_gpu_blocks=20000)
        if not tier:
            raw.pop("kv_offload")
        out.append(replay(trace, engine_config_from_dict(raw)))
    with_tier, without = out
    assert with_tier.summary["kv_offload"]["lookups"] == 424
    assert with_tier.summary["kv_offload"]["lookups_with_hit"] == 0
    assert with_tier.summary["kv_offload"]["store_chunks"] == 12856
    for name in ("steps", "requests"):
        a, b = getattr(with_tier, name), getattr(without, name)
        assert a.num_rows == b.num_rows
        for col in b.column_names:
            assert a.column(col).equals(b.column(col)), (name, col)


def _fence_trace():
    # B and C continue A's and B's prompts: their prefixes are A's and B's GPU blocks.
    return [_req("A", 0, 64, "p", 64), _req("B", 1, 80, "p", 64),
            {"id": "C", "at": 2, "prompt": 96, "max_tokens": 1,
             "segments": [("p", 0, 64), ("own-B", 64, 16), ("own-C", 80, 16)]}]


def test_a_finished_request_store_is_flushed_when_its_blocks_are_handed_out():
    # Stores take 3 steps (store_delay_steps).  request_finished answers delay_free_blocks = False:
    # A's blocks go back to the pool when it finishes (output of step 0), and its store job 0, still
    # in flight, has its source blocks watched.  Step 1 hands them to B (its prefix hit: a new
    # request's whole block table is in the scheduler output), so job 0 is flushed in step 1 and
    # reported by step 1's output instead of step 3's.  B stores its fifth chunk (job 1), finishes,
    # and C's prefix takes B's blocks in step 2: job 1 is flushed there.  C's store (job 2) has
    # nobody to take its blocks and lands by the timing rule, in step 2 + 3 = 5.
    steps, summary, _ = run_log(_engine(11, cpu_blocks=20, store_delay_steps=3), _fence_trace())
    off = _off(steps)
    assert off[1]["lookups"] == {"B": [64, 0]} and steps[1]["new"] == {"B": 64}
    assert off[1]["flush"] == [0] and off[1]["done"] == [0] and off[1]["stores"] == {"1": ["B", 1]}
    assert off[2]["flush"] == [1] and off[2]["done"] == [1] and off[2]["stores"] == {"2": ["C", 1]}
    assert sorted(steps) == [0, 1, 2, 3, 4, 5] and off[5]["done"] == [2] and "flush" not in off[5]
    assert summary["kv_offload"]["flushed_jobs"] == 2


def test_the_fence_one_step_later_under_async_scheduling():
    # Asynchronous, A's output (it finishes) is processed after the schedule() of step 1: B takes
    # A's blocks while A still runs, so nothing is watched yet.  Line 1 then finishes A and watches
    # job 0.  Step 2 hands A's blocks out again, in C's table: job 0 is flushed in step 2 and
    # reported by its output (line 3).  B finishes only after step 2's schedule(): its job 1 is
    # never flushed and lands by the rule (issued in step 1, reported by step 4's output, line 5);
    # job 2 by step 5's (line 6).
    steps, summary, _ = run_log(_async(11, cpu_blocks=20, store_delay_steps=3), _fence_trace())
    off = _off(steps)
    assert steps[1]["new"] == {"B": 64} and "flush" not in off[1] and off[1]["stores"] == {"1": ["B", 1]}
    assert steps[2]["new"] == {"C": 80} and off[2]["flush"] == [0] and "done" not in off[2]
    assert off[3]["done"] == [0] and off[5]["done"] == [1] and off[6]["done"] == [2]
    assert summary["kv_offload"]["flushed_jobs"] == 1


def test_a_victim_in_the_step_in_flight_is_not_preempted():
    # With a KV connector that may load into freed blocks (the OffloadingConnector runs as kv_both,
    # a consumer) and asynchronous scheduling, vLLM defers freeing a request's blocks until the step
    # it was last scheduled in is processed (Scheduler.defer_block_free), and the running pass does
    # not preempt a request whose blocks it could not free at once.  A (64 tokens) and B (80) fill
    # 9 of the 10 GPU blocks in step 0.  Step 1: A's first decode takes the last block; B's needs
    # one more, and the victim (B itself, the tail of running) is in step 0, still in flight: B is
    # neither scheduled nor preempted.  Step 2: step 0's output is processed, B is not in step 1:
    # B preempts itself, and its store job 1 (issued in step 0, not yet reported when step 2 is
    # scheduled) is flushed; step 1's output reports jobs 0 and 1 in line 2.
    steps, _, _ = run_log(_async(11, cpu_blocks=20), [_req("A", 0, 64, max_tokens=20),
                                                    _req("B", 0, 80, max_tokens=20)])
    assert steps[0]["sched"] == {"A": 64, "B": 80} and steps[0]["free_blocks"] == 1
    assert steps[1]["sched"] == {"A": 1} and steps[1]["preempted"] == [] and steps[1]["free_blocks"] == 0
    assert steps[2]["sched"] == {"A": 1} and steps[2]["preempted"] == ["B"]
    assert steps[2]["offload"]["flush"] == [1] and steps[2]["offload"]["done"] == [0, 1]
    # Without the tier the engine has no connector and frees at once: B goes in step 1.
    eng = _async(11)
    steps, _, _ = run_log(eng, [_req("A", 0, 64, max_tokens=20), _req("B", 0, 80, max_tokens=20)])
    assert steps[1]["sched"] == {"A": 1} and steps[1]["preempted"] == ["B"]
