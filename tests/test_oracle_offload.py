"""Fidelity of KV offload: the recorded vLLM 0.34.0 run with its CPU OffloadingConnector replays
identically, every step line (its `offload` object in vLLM's key order included) and the summary."""

import json
import os

from aisim.config.engine import engine_config_from_dict
from aisim.decisionlog import decision_lines, log_line_json
from aisim.replay import replay

from conftest import DATA
from helpers import oracle_engine_dict, oracle_hash_id_trace

OFFLOAD_ORACLE = os.path.join(DATA, "oracle", "offload")


def _replay(name):
    d = os.path.join(OFFLOAD_ORACLE, name)
    engine = engine_config_from_dict(oracle_engine_dict(d, "0.34.0"))
    return replay(oracle_hash_id_trace(os.path.join(d, "trace.jsonl")), engine, record_decisions=True)


def _recorded(name):
    with open(os.path.join(OFFLOAD_ORACLE, name, "vllm-0.34.0.jsonl")) as fh:
        return [json.loads(line) for line in fh]


def test_offload_multiturn_matches_recorded_log():
    recorded = _recorded("offload_multiturn")
    got = list(decision_lines(_replay("offload_multiturn")))
    assert len(got) == len(recorded) == 2826
    for i, (g, e) in enumerate(zip(got[1:-1], recorded[1:-1])):
        assert log_line_json(g) == log_line_json(e), f"offload_multiturn: line {i + 2} differs"
    summary, exp = got[-1], recorded[-1]
    assert log_line_json({k: summary.get(k) for k in exp}) == log_line_json(exp)
    assert got[0]["kv_offload"]["cpu_num_chunks"] == recorded[0]["kv_offload"]["cpu_num_chunks"] == 2500


def test_offload_multiturn_numbers():
    # The scenario's row of the oracle README: 239 loads of 9,973 chunks (159,568 tokens), 491 stores
    # of 12,583 chunks, 10,083 CPU evictions, 12 preemptions, 2,824 steps.
    res = _replay("offload_multiturn")
    ko = res.summary["kv_offload"]
    assert (ko["loads"], ko["load_chunks"], ko["load_tokens"]) == (239, 9973, 159568)
    assert (ko["stores"], ko["store_chunks"], ko["cpu_evicted_chunks"]) == (491, 12583, 10083)
    assert res.summary["preemptions"] == 12 and res.summary["steps"] == 2824
    steps, reqs = res.steps, res.requests
    assert sum(steps.column("offload_load_chunks").to_pylist()) == 9973
    assert sum(steps.column("offload_store_chunks").to_pylist()) == 12583
    assert sum(reqs.column("offload_loaded_tokens").to_pylist()) == 159568
    assert sum(1 for x in reqs.column("offload_loads").to_pylist() if x > 0) == 231
