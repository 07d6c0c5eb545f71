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
    (2100, 64.0, {}, "5f50324064b3f500", "b956fde98bdab4c1", None),
    (2100, 2.0, {}, "769e1e705d2febb4", "ebcc249a344dd1f1", None),
    (2101, 64.0, {}, "3abd600151b49813", "5a6728bf8f3184e5", "40960d455fcf61d6"),
    (2101, 2.0, {}, "1c12b02c69af801e", "85eae894f8b5ac0f", "5034a8ce7e544255"),
    (2101, 6.0, {"extra": {"offload_prompt_only": True}}, "7b7d6562b75d7348", "00ef10c75aa2eeaf",
     "8d5ec13b1c53c5e1"),
    (2101, 16.0, {"pcie_gen": None}, "91ecc81cf2e6822a", "43e7f91e8e23ac2f", "52908f44611df27c"),
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
