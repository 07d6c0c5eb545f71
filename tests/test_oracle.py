"""Fidelity: every oracle scenario replays identical to the real vLLM log.

The logs in tests/data/oracle/ were recorded from vLLM's own Scheduler /
AsyncScheduler (see its README).  Every step line is compared as the JSON
text the decision log writes, so the order of the entries inside ``sched``,
``new`` and ``resumed`` (vLLM's scheduling order) must match too.
"""

import json
import os

import pytest

from aisim.config.engine import engine_config_from_dict
from aisim.config.versions import SUPPORTED_VLLM_VERSIONS
from aisim.decisionlog import decision_lines, log_line_json
from aisim.replay import replay
from aisim.traces import read_oracle_trace

from conftest import ORACLE, SPEC_ORACLE
from helpers import oracle_engine_dict

SCENARIOS = ["full_small", "full_nocache", "full_nochunk", "full_pressure", "full_pressure_async",
             "priority_threshold", "timed", "bench_full",
             # grouped (hybrid) KV caches
             "hybrid_swa", "hybrid_mamba", "hybrid_mamba_fine", "hybrid_mamba_pressure"]
# Speculative decoding (EAGLE rules: 0.31/0.32 block drop, 0.33 lookahead hashes).
SPEC_SCENARIOS = ["spec_full_k3", "spec_priority_k2", "spec_mtp_k1_async", "spec_mamba_k2"]
# Scenarios with a setting only some releases have: recorded for those alone.
SINCE = {"cache_aware_window": "0.34.0"}
VERSIONS = list(SUPPORTED_VLLM_VERSIONS)
CASES = [(s, v) for s in SCENARIOS + list(SINCE) + SPEC_SCENARIOS for v in VERSIONS
         if s not in SINCE or VERSIONS.index(v) >= VERSIONS.index(SINCE[s])]


def _dir(scenario):
    return os.path.join(SPEC_ORACLE if scenario in SPEC_SCENARIOS else ORACLE, scenario)


def _replay(scenario, version):
    engine = engine_config_from_dict(oracle_engine_dict(_dir(scenario), version))
    trace = read_oracle_trace(os.path.join(_dir(scenario), "trace.jsonl"), engine.max_model_len)
    return replay(trace, engine, record_decisions=True)


def _recorded(scenario, version):
    with open(os.path.join(_dir(scenario), f"vllm-{version}.jsonl")) as fh:
        return [json.loads(line) for line in fh]


@pytest.mark.parametrize("scenario,version", CASES)
def test_scenario_matches_recorded_log(scenario, version):
    recorded = _recorded(scenario, version)
    expected = recorded[1:]
    got_all = list(decision_lines(_replay(scenario, version)))
    got = got_all[1:]
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got[:-1], expected[:-1])):
        assert log_line_json(g) == log_line_json(e), f"{scenario} vLLM {version}: line {i + 2} differs"
    summary, exp_summary = got[-1], expected[-1]
    assert log_line_json({k: summary.get(k) for k in exp_summary}) == log_line_json(exp_summary)
    if "speculative" in recorded[0]:
        # What the scheduler derived, key for key and in the recorded order.
        assert json.dumps(got_all[0]["speculative"]) == json.dumps(recorded[0]["speculative"])
    else:
        assert got_all[0]["speculative"] is None and "spec" not in got[0] and "spec" not in summary


def test_async_log_has_drain_line():
    # The async engine processes the last in-flight batch in an iteration
    # that schedules nothing (EngineCore.step_with_batch_queue).
    lines = list(decision_lines(_replay("full_pressure_async", "0.32.0")))
    assert lines[-2]["type"] == "drain"
    assert lines[-2]["updated_step"] == lines[-3]["step"]


def _step(scenario, version, step):
    return next(line for line in decision_lines(_replay(scenario, version))
                if line.get("type") == "step" and line["step"] == step)


def test_0_33_running_pass_goes_on_after_a_self_preemption():
    # priority_threshold, step 223: r57 (priority 1, the latest arrival of
    # its priority) fails to allocate and preempts itself.  0.32.0 stops the
    # running pass there; 0.33.0 goes on and schedules r59 (priority 0), whose
    # decode needs no new block (Scheduler.schedule, running loop).
    before, after = _step("priority_threshold", "0.32.0", 223), _step("priority_threshold", "0.33.0", 223)
    assert before["preempted"] == after["preempted"] == ["r57"]
    assert "r59" not in before["sched"] and len(before["sched"]) == 9
    assert list(after["sched"])[-1] == "r59" and after["sched"]["r59"] == 1 and len(after["sched"]) == 10
    assert before["free_blocks"] == after["free_blocks"] == 11


def test_0_33_leaves_a_mamba_tail_keyed_at_its_length_alone():
    # hybrid_mamba_pressure, step 2700: resumed r220 hits its own Mamba block
    # keyed at 448 tokens and caches up to round_down(504, 64) = 448.  0.32.0
    # keys it again, marking it cached this step, so r221 (same prefix group,
    # 448 tokens hit) must wait; 0.33.0 returns early and admits r221 with the
    # 192 tokens up to its align boundary ((662 - 1) // 64) * 64 = 640
    # (MambaManager._cache_partial_tail_block).
    before = _step("hybrid_mamba_pressure", "0.32.0", 2700)
    after = _step("hybrid_mamba_pressure", "0.33.0", 2700)
    assert before["new"] == {} and "r221" not in before["sched"]
    assert after["new"] == {"r221": 448} and after["sched"]["r221"] == 192
    assert before["sched"]["r220"] == after["sched"]["r220"] == 56
