"""The CPU tier's fast paths leave every figure as it was: a lookup's scan kept while a request waits
at the queue's head, jobs holding their chunks, lazy block keys with a tier.

The pinned digests were recorded before those paths existed (the tier scanned every lookup, found
each job's chunks by key, and keyed every GPU block), on the bundled agentic sessions whose long
conversations keep a request at the waiting queue's head for thousands of steps, with tiers from
2 to 64 GiB (8 MiB chunks of one 64-token block; the smallest evicts all the time).
"""

from __future__ import annotations

import hashlib
import os

import pytest

from aisim.plan import offload_flags, plan_from_model
from aisim.replay import replay
from aisim.traces import read_trace
from aisim.traces.load import retime

WEKA = os.path.join(os.path.dirname(__file__), "data", "traces", "weka")

# The columns the digests cover (the tables may grow others).
REQUEST_COLUMNS = (
    "request_id", "arrival_s", "picked_up_s", "first_scheduled_s", "first_token_s", "finish_s", "ttft_s",
    "tpot_s", "e2e_s", "prompt_tokens", "output_tokens", "cached_tokens", "cached_tokens_all_admissions",
    "preemptions", "status", "offload_hit_tokens", "offload_loaded_tokens", "offload_loads",
    "offload_store_chunks")
STEP_COLUMNS = (
    "step", "kind", "updated_step", "clock_s", "duration_s", "num_reqs", "prefill_tokens", "decode_tokens",
    "num_new", "num_resumed", "num_preempted", "num_finished", "running", "waiting", "free_blocks_sched",
    "free_blocks", "cached_blocks", "prefix_queries", "prefix_hits", "preempted_prefix_queries",
    "preempted_prefix_hits", "offload_lookups", "offload_lookup_hits", "offload_lookups_deferred",
    "offload_loads", "offload_load_tokens", "offload_load_chunks", "offload_stores", "offload_store_chunks",
    "offload_flushed", "offload_cpu_evicted", "offload_completed", "offload_recving", "offload_remote_wait",
    "offload_cpu_used", "offload_cpu_evictable")


def _digest(table, columns) -> str:
    h = hashlib.sha256()
    for name in columns:
        h.update(name.encode())
        h.update(repr(table.column(name).to_pylist()).encode())
    return h.hexdigest()[:16]


def _events(events) -> str:
    h = hashlib.sha256()
    for k in sorted(events):
        h.update(k.encode())
        h.update(events[k].tobytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="module")
def weka():
    trace = retime(read_trace(WEKA, "agentic"), rate_scale=0.5)
    cfg, _ = plan_from_model("llama-3.1-8b", None, 1, None, gpu="H100", vllm_version="0.34.0")
    return trace, cfg.replace(async_scheduling=False, max_model_len=131072, plan_notes=[])


@pytest.mark.parametrize("blocks, gib, extra, requests, steps, events", [
    (2100, 64.0, {}, "aeb84a24591bee0c", "4d56a31f95e4e3c1", None),
    (2100, 2.0, {}, "cb8d166846bbe608", "384c1ffba779d2a2", None),
    (2101, 64.0, {}, "6e36a79a45f9c481", "677ad383f3d8da4c", "ea2a0fc9095ea600"),
    (2101, 2.0, {}, "bfddc447f3ab910a", "5439e8d4b6544598", "5db71fa6c25393b0"),
    (2101, 6.0, {"extra": {"offload_prompt_only": True}}, "2dc6dd002de07649", "09ef48da20d4608b",
     "de7b7cc4b57f4144"),
    (2101, 16.0, {"pcie_gen": None}, "0f0b4fe907a2cf88", "48ed6add927f2725", "9dc2b40951a3a217"),
])
def test_agentic_replay_with_tier_unchanged(weka, blocks, gib, extra, requests, steps, events):
    trace, cfg = weka
    section = {**offload_flags(cfg, gib), "pcie_gen": 5}
    for k, v in extra.items():
        if v is None:
            section.pop(k)  # transfers counted in steps
        else:
            section[k] = v
    res = replay(trace, cfg.replace(num_gpu_blocks=blocks, kv_offload=section), record_decisions=events is not None)
    got = (_digest(res.requests, REQUEST_COLUMNS), _digest(res.steps, STEP_COLUMNS))
    assert got == (requests, steps)
    if events is not None:
        assert _events(res.events) == events


@pytest.mark.parametrize("gib", [2.0, 64.0])
def test_lazy_keys_with_tier_change_nothing(weka, gib):
    # A tier's connector reads request hashes only: keying every GPU block gives the same replay.
    trace, cfg = weka
    cfg = cfg.replace(num_gpu_blocks=2101, kv_offload={**offload_flags(cfg, gib), "pcie_gen": 5})
    lazy = replay(trace, cfg, record_decisions=True)
    keyed = replay(trace, cfg, record_decisions=True, lazy_keys=False)
    assert _digest(lazy.requests, REQUEST_COLUMNS) == _digest(keyed.requests, REQUEST_COLUMNS)
    assert _digest(lazy.steps, STEP_COLUMNS) == _digest(keyed.steps, STEP_COLUMNS)
    assert _events(lazy.events) == _events(keyed.events)
    assert lazy.summary["kv_offload"] == keyed.summary["kv_offload"]
