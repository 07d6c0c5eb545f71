"""KV offload behind the GPU cache, on small cases derived by hand (docs/kv-offload.md).

Block size 16 everywhere; one CPU chunk is one GPU block.  ``p``, ``p1``, ``p2`` are shared token
streams; the rest of a prompt is the request's own.
"""

import hashlib
import json
import os

import pytest

from aisim.config.engine import engine_config_from_dict
from aisim.decisionlog import decision_lines, log_line_json
from aisim.errors import ConfigError
from aisim.replay import replay

from conftest import DATA
from helpers import ipc_bytes, oracle_engine_dict, oracle_hash_id_trace, run_log


def _engine(blocks, **offload):
    eng = {"num_gpu_blocks": blocks, "block_size": 16, "max_model_len": 320, "max_num_seqs": 4,
           "max_num_batched_tokens": 256, "startup_check": False, "vllm_version": "0.34.0",
           "kv_cache_groups": [{"type": "full"}]}
    if offload:
        eng["kv_offload"] = offload
    return eng


def _req(rid, at, prompt, shared=None, shared_len=0, max_tokens=1):
    segs = [(shared, 0, shared_len)] if shared else []
    if prompt > shared_len:
        segs.append(("own-" + rid, shared_len, prompt - shared_len))
    return {"id": rid, "at": at, "prompt": prompt, "max_tokens": max_tokens, "segments": segs}


def test_prefix_evicted_from_gpu_is_reloaded_from_cpu():
    # A (64 tokens of p) is stored to the CPU tier in step 0 (job 0, 4 chunks, reported by step 1).
    # B (159 tokens, 10 blocks) needs every GPU block and evicts A's cached ones; it stores 9 chunks.  C (p + 16 of its
    # own) has no GPU hit; the tier offers A's 4 chunks: load job 2 in step 10, reported by step 11,
    # C runs in step 12 from 64 computed tokens and stores its fifth chunk (job 3).
    steps, summary, res = run_log(_engine(11, cpu_blocks=20), [
        _req("A", 0, 64, "p", 64), _req("B", 5, 159), _req("C", 10, 80, "p", 64)])
    assert sorted(steps) == [0, 1, 5, 6, 10, 11, 12, 13]
    off = {k: steps[k]["offload"] for k in steps}
    assert off[0]["stores"] == {"0": ["A", 4]} and off[0]["done"] == []
    assert off[1]["done"] == [0] and off[1]["cpu_evictable"] == 4
    assert off[5]["stores"] == {"1": ["B", 9]} and off[5]["cpu_used"] == 13
    assert off[10]["lookups"] == {"C": [0, 64]}
    assert off[10]["loads"] == {"2": ["C", 64, 4]} and off[10]["remote_wait"] == ["C"]
    assert steps[10]["sched"] == {} and steps[10]["waiting"] == 1 and steps[10]["free_blocks"] == 6
    assert off[11]["lookups"] == {} and off[11]["done"] == [2] and off[11]["recving"] == ["C"]
    assert steps[12]["new"] == {"C": 64} and steps[12]["sched"] == {"C": 16}
    assert off[12]["stores"] == {"3": ["C", 1]} and off[13]["done"] == [3]
    assert summary["connector_prefix_cache_stats"] == {"requests": 3, "queries": 303, "hits": 64,
                                                       "preempted_requests": 0, "preempted_queries": 0,
                                                       "preempted_hits": 0}
    rq = res.requests.to_pydict()
    assert rq["offload_hit_tokens"] == [0, 0, 64] and rq["cached_tokens"] == [0, 0, 0]
    assert rq["offload_store_chunks"] == [4, 9, 1]


def test_load_waits_behind_the_inflight_cap():
    # A1 (p1) and A2 (p2) are stored in step 0 (jobs 0, 1); B evicts both from the GPU (job 2).  In
    # step 10 C1 starts its load (job 3); C2 is offered p2 too, but max_num_inflight_kv_loads = 1 stops
    # the waiting pass at it, in step 10 and again in step 11.  In step 12 C1 runs and leaves the parked
    # queue, so C2's load (job 4) starts in the same pass, before C1's store (job 5).
    steps, _, _ = run_log(_engine(11, cpu_blocks=30, max_num_inflight_kv_loads=1), [
        _req("A1", 0, 32, "p1", 32), _req("A2", 0, 32, "p2", 32), _req("B", 5, 159),
        _req("C1", 10, 48, "p1", 32), _req("C2", 10, 48, "p2", 32)])
    off = {k: steps[k]["offload"] for k in steps}
    assert off[0]["stores"] == {"0": ["A1", 2], "1": ["A2", 2]}
    assert off[10]["lookups"] == {"C1": [0, 32], "C2": [0, 32]} and list(off[10]["loads"]) == ["3"]
    assert off[11]["lookups"] == {"C2": [0, 32]} and off[11]["loads"] == {} and off[11]["recving"] == ["C1"]
    assert steps[12]["new"] == {"C1": 32}
    assert off[12]["loads"] == {"4": ["C2", 32, 2]} and off[12]["stores"] == {"5": ["C1", 1]}
    assert off[13]["recving"] == ["C2"] and steps[14]["new"] == {"C2": 32}
    # Without the cap both loads start in step 10 and both requests run in step 12.
    steps, _, _ = run_log(_engine(11, cpu_blocks=30), [
        _req("A1", 0, 32, "p1", 32), _req("A2", 0, 32, "p2", 32), _req("B", 5, 159),
        _req("C1", 10, 48, "p1", 32), _req("C2", 10, 48, "p2", 32)])
    assert list(steps[10]["offload"]["loads"]) == ["3", "4"] and steps[12]["new"] == {"C1": 32, "C2": 32}


def test_cpu_tier_evicts_the_tail_of_the_least_recent_request():
    # A tier of 6 chunks, 6 usable GPU blocks.  A's 4 chunks (p) are stored in step 0; when A finishes
    # they get fresh ranks tail first (LRUCachePolicy.on_request_finished).  B's 4 chunks in step 5
    # need 2 more: A's chunks 3 and 2 go.  On the GPU, B's blocks took A's blocks of chunks 3 and 2
    # too (freed tail first), so C (p + 16) hits 32 tokens locally and the tier offers nothing past
    # them.  C's store offers its chunks 0-4: 0 and 1 are in the tier (protected), 2-4 are new and
    # evict B's chunks 3, 2, 1 (B finished after A: its ranks are newer than A's, but A's are protected).
    steps, summary, _ = run_log(_engine(7, cpu_blocks=6), [
        _req("A", 0, 64, "p", 64), _req("B", 5, 64), _req("C", 10, 80, "p", 64)])
    assert steps[5]["offload"]["stores"] == {"1": ["B", 4]} and steps[5]["offload"]["cpu_evicted"] == 2
    assert steps[5]["offload"]["cpu_used"] == 6 and steps[6]["offload"]["cpu_evictable"] == 6
    assert steps[10]["offload"]["lookups"] == {"C": [32, 0]} and steps[10]["offload"]["loads"] == {}
    assert steps[10]["new"] == {"C": 32} and steps[10]["sched"] == {"C": 48}
    assert steps[10]["offload"]["stores"] == {"2": ["C", 3]} and steps[10]["offload"]["cpu_evicted"] == 3
    assert summary["kv_offload"]["cpu_evicted_chunks"] == 5
    # A request with B's prompt finds B's head block on the GPU, and nothing past it in the tier.
    steps, _, _ = run_log(_engine(7, cpu_blocks=6), [
        _req("A", 0, 64, "p", 64), _req("B", 5, 64, "q", 64), _req("C", 10, 80, "p", 64),
        _req("D", 20, 80, "q", 64)])
    assert steps[20]["offload"]["lookups"] == {"D": [16, 0]}


def test_a_tier_of_gib_counts_chunks_as_vllm_does():
    # 0.0095367431640625 GiB = 10,240,000 bytes over chunks of 128 bytes rounded up to a 4096-byte page.
    cfg = engine_config_from_dict(_engine(11, size_gib=0.0095367431640625, kv_bytes_per_block=128))
    assert cfg.kv_offload.num_chunks(16) == 2500 and cfg.kv_offload.chunk_bytes(16) == 4096


@pytest.mark.parametrize("offload, message", [
    ({}, "exactly one of 'cpu_blocks' and 'size_gib'"),
    ({"cpu_blocks": 4, "size_gib": 1.0}, "exactly one of"),
    ({"size_gib": 1.0}, "needs 'kv_offload.kv_bytes_per_block'"),
    ({"cpu_blocks": 0}, "'kv_offload.cpu_blocks' in engine.json must be at least 1"),
    ({"cpu_blocks": 4, "block_size": 24}, "must be a multiple of 'block_size'"),
    ({"cpu_blocks": 4, "eviction_policy": "arc"}, "'arc' is not modelled"),
    ({"cpu_blocks": 4, "extra": {"store_threshold": 2}}, "store_threshold'"),
    ({"cpu_blocks": 4, "extra": {"cpu_bytes": 1}}, "unknown key 'kv_offload.extra.cpu_bytes'"),
    ({"cpu_blocks": 4, "store_delay_steps": 0}, "'kv_offload.store_delay_steps' in engine.json must be at least 1"),
    ({"cpu_blocks": 4, "tiers": 2}, "unknown key 'kv_offload.tiers'"),
])
def test_bad_offload_sections_are_refused(offload, message):
    eng = _engine(11)
    eng["kv_offload"] = offload
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        engine_config_from_dict(eng, "engine.json")


def test_offload_needs_the_engine_it_models():
    eng = _engine(11, cpu_blocks=4)
    eng["policy"] = "priority"
    with pytest.raises(ConfigError, match="this engine has the priority policy"):
        engine_config_from_dict(eng)


# The offload_multiturn trace without `kv_offload`, replayed by aisim before KV offload existed:
# its step and request tables (Arrow IPC), every decision-log line but the header, and the summary.
TIERS_OFF_DIGEST = "746d8c38610ed39c3adaff6bcba2514c0fef31492a942e705383002e3d3aa363"


def test_tiers_off_give_todays_bytes():
    d = os.path.join(DATA, "oracle", "offload", "offload_multiturn")
    raw = oracle_engine_dict(d, "0.34.0")
    raw.pop("kv_offload")
    res = replay(oracle_hash_id_trace(os.path.join(d, "trace.jsonl")), engine_config_from_dict(raw),
                 record_decisions=True)
    h = hashlib.sha256()
    h.update(ipc_bytes(res.steps))
    h.update(ipc_bytes(res.requests))
    for line in decision_lines(res):
        if line["type"] != "header":
            h.update(log_line_json(line).encode())
    h.update(json.dumps(res.summary, sort_keys=True, default=str).encode())
    assert h.hexdigest() == TIERS_OFF_DIGEST
    assert "offload_loads" not in res.steps.column_names and "kv_offload" not in res.summary


def test_transfers_on_the_pcie_clock():
    # The first case with transfers priced by the link: PCIe 4.0 x16 moves 16e9 * 128/130 / 8 * 16 =
    # 31.5e9 bytes/s; a chunk is 100 MiB, so C's load of 4 chunks lasts 4 * 104857600 / 31.5e9 = 13.3 ms.
    # Step 10 issues it and computes nothing: the idle engine waits until it lands (step 10 lasts
    # 10 + 13.3 ms), step 11's poll reports it and C runs in step 12.  A's store (4 chunks), submitted
    # when step 1 begins, makes the empty step 1 last 13.3 ms and is reported by step 2.
    chunk = 100 * 2**20
    steps, _, res = run_log(_engine(11, cpu_blocks=20, pcie_gen=4, kv_bytes_per_block=chunk), [
        _req("A", 0, 64, "p", 64), _req("B", 5, 159), _req("C", 10, 80, "p", 64)])
    rate = 16e9 * 128 / 130 / 8 * 16
    load_s = 4 * chunk / rate
    assert steps[1]["offload"]["done"] == [] and steps[2]["offload"]["done"] == [0]
    assert steps[10]["offload"]["loads"] == {"2": ["C", 64, 4]}
    assert steps[11]["offload"]["done"] == [2] and steps[11]["offload"]["recving"] == ["C"]
    assert steps[12]["new"] == {"C": 64}
    dur = dict(zip(res.steps.column("step").to_pylist(), res.steps.column("duration_s").to_pylist()))
    assert dur[1] == pytest.approx(load_s) and dur[10] == pytest.approx(0.01 + load_s)
    assert dur[11] == pytest.approx(0.01)
    assert res.summary["kv_offload"]["load_bytes"] == 4 * chunk


def test_a_single_request_keeps_its_offload_columns():
    # One request, one row: its columns are the core's own copies, not views of rows the core reuses.
    # A's 64 prompt tokens are four 16-token chunks, stored once (offload_prompt_only); nothing loads.
    _, summary, res = run_log(_engine(11, cpu_blocks=20), [_req("A", 0, 64, "p", 64)])
    rq = res.requests
    assert rq.column("offload_store_chunks").to_pylist() == [4]
    assert rq.column("offload_loads").to_pylist() == [0] and rq.column("offload_hit_tokens").to_pylist() == [0]
    assert summary["kv_offload"]["store_chunks"] == 4
