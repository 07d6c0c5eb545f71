"""Macro-steps: a quiet stretch of decoding replayed in one move gives byte-identical outputs.

Every comparison replays the same trace with ``macro_steps`` on and off and asserts the step
table, the request table, the summary and the decision log are identical, and (where the
workload has quiet stretches) that stretches were actually taken, so that the comparison
cannot pass by macro-steps never running.  The oracle tests (tests/test_oracle.py) replay with
macro-steps on, the default: those outputs equal the real vLLM logs.
"""

import json
import os

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings

from aisim._core.engine import Engine
from aisim.config.engine import engine_config_from_dict
from aisim.config.versions import SUPPORTED_VLLM_VERSIONS
from aisim.core_input import CoreTrace, core_config
from aisim.decisionlog import decision_lines, log_line_json
from aisim.deploy import deploy
from aisim.replay import _whole_arrays, replay, replay_stream
from aisim.traces import read_oracle_trace, read_trace
from aisim.traces.synth import synth_trace

from conftest import ORACLE, SPEC_ORACLE
from helpers import drawn_rows, ipc_bytes, make_trace, oracle_engine_dict

SCENARIOS = sorted(os.listdir(ORACLE))
SPEC_SCENARIOS = sorted(os.listdir(SPEC_ORACLE))
TRACES = os.path.join(os.path.dirname(__file__), "data", "traces")


def _log(result):
    return [log_line_json(line) for line in decision_lines(result)]


def _same_both_ways(trace, eng, **kw):
    on = replay(trace, eng, record_decisions=True, macro_steps=True, **kw)
    off = replay(trace, eng, record_decisions=True, macro_steps=False, **kw)
    assert ipc_bytes(on.steps) == ipc_bytes(off.steps)
    assert ipc_bytes(on.requests) == ipc_bytes(off.requests)
    assert json.dumps(on.summary) == json.dumps(off.summary)
    assert _log(on) == _log(off)
    assert all(on.gaps[k].tobytes() == off.gaps[k].tobytes() for k in ("gap_s", "count"))
    return on


def _macro_counts(trace, eng, **kw):
    """Stretches and the steps they covered, from the core itself."""
    timed = (trace.schema.metadata or {}).get(b"clock") == b"time"
    core = Engine(core_config(eng), CoreTrace(**_whole_arrays(trace, eng, timed)), macro_steps=True, **kw)
    core.run()
    return core.macro_counts


# max_model_len: what the pool's usable blocks hold when it is small (vLLM's start-up check).
def _engine(**kw):
    base = dict(num_gpu_blocks=200, block_size=4, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=256,
                kv_cache_groups=[{"type": "full"}])
    base.update(kw)
    return engine_config_from_dict(base)


# ------------------------------------------------------------------ by hand

def test_one_request_by_hand():
    # Prompt 4, 10 outputs, blocks of 4, 10 ms steps.  Step 0 prefills (1 block) and samples the
    # first output; steps 1..9 decode at 4..12 computed tokens; step 9 samples the 10th output and
    # finishes.  Steps 1..9 are one stretch (it ends with the finishing step).  A block is
    # taken when the new token starts one (steps 1 and 5: 4 and 8 computed; step 9: 12).  Step 10
    # schedules nothing: it reports the finished request (Scheduler.has_requests).
    eng = _engine(num_gpu_blocks=20, max_model_len=76, time_model={"kind": "linear", "base_s": 0.01})
    trace = make_trace([dict(id="a", prompt=4, max_tokens=10, at=0)])
    res = _same_both_ways(trace, eng)
    steps = res.steps.to_pydict()
    usable = 19  # the null block is not usable
    assert steps["free_blocks_sched"] == [usable - 1, usable - 2, usable - 2, usable - 2, usable - 2,
                                          usable - 3, usable - 3, usable - 3, usable - 3, usable - 4, usable]
    assert steps["free_blocks"][-2] == usable  # the finish frees every block (cached ones count as free)
    assert steps["decode_tokens"] == [0] + [1] * 9 + [0]
    assert steps["clock_s"] == pytest.approx([0.01 * k for k in range(11)])
    assert _macro_counts(trace, eng) == {"stretches": 1, "steps": 9}


def test_a_stretch_ends_with_the_step_that_admits():
    # b arrives at step 5 while a decodes alone (a: prefill at step 0, finish at step 11).  With
    # max_num_seqs 2 the waiting pass of step 5 admits b: that step ends as any other and the
    # stretch with it (steps 1..5).  Steps 6..7 are one more, ending with b's finish at 7; then a
    # alone runs steps 8..11, ending with its finish.
    trace = make_trace([dict(id="a", prompt=4, max_tokens=12, at=0), dict(id="b", prompt=4, max_tokens=3, at=5)])
    two = _engine(max_num_seqs=2)
    _same_both_ways(trace, two)
    assert _macro_counts(trace, two) == {"stretches": 3, "steps": 5 + 2 + 4}
    # With max_num_seqs 1, b arrives inside the stretch and waits (the waiting pass stops at
    # the full running list): steps 1..11 are one stretch.  b is admitted at step 12 (a single
    # step: it prefills) and decodes at 13..14, its finish.
    one = _engine(max_num_seqs=1)
    _same_both_ways(trace, one)
    assert _macro_counts(trace, one) == {"stretches": 2, "steps": 11 + 2}


def test_a_request_blocked_by_the_kv_cache_waits_inside_a_stretch():
    # 13 usable blocks of 4 tokens: a (prompt 20: 5 blocks, growing to 8 by its finish) runs; b
    # (prompt 32 + its first token: 9 blocks) cannot be admitted until a finishes.  Every step
    # from 1 to a's finish at 11 tries and fails to admit b (a lookup and a refused allocation),
    # inside one stretch.
    eng = _engine(num_gpu_blocks=14, max_model_len=52, enable_prefix_caching=False)
    trace = make_trace([dict(id="a", prompt=20, max_tokens=12, at=0), dict(id="b", prompt=32, max_tokens=2, at=1)])
    res = _same_both_ways(trace, eng)
    steps = res.steps.to_pydict()
    assert steps["waiting"][1:11] == [1] * 10 and steps["num_new"][1:12] == [0] * 11
    assert _macro_counts(trace, eng) == {"stretches": 1, "steps": 11}


def test_an_asynchronous_engine_by_hand():
    # The same request, asynchronous scheduling: step 0 schedules the prefill (nothing to process
    # yet), step 1 the first decode while the prefill's output is processed.  From step 2 on, every
    # step schedules one token while the previous one is in flight; at step 10 the request's last
    # token is in flight (the async guard skips it) and its output finishes it.  Steps 2..9 are
    # one stretch.
    eng = _engine(num_gpu_blocks=20, max_model_len=76, time_model={"kind": "linear", "base_s": 0.01},
                  async_scheduling=True)
    trace = make_trace([dict(id="a", prompt=4, max_tokens=10, at=0)])
    res = _same_both_ways(trace, eng)
    assert res.steps.column("updated_step").to_pylist()[:4] == [-1, 0, 1, 2]
    assert _macro_counts(trace, eng) == {"stretches": 1, "steps": 8}


def test_mamba_state_in_align_mode_by_hand():
    # Full attention + Mamba state in align mode, blocks of 8; prompt 8, 20 outputs.  Step 0 prefills
    # (a block each); steps 1..19 decode at 8..26 computed tokens, step 19 finishing.  A decode that
    # starts a block takes one in each group (steps 1, 9, 17: 8, 16, 24 computed); the next step
    # retires the state block left behind (MambaManager: one running state; steps 2, 10, 18).  Steps
    # 1..19 are one stretch, its KV calls at residues 0, 1, 2 and 7 of 8 only.
    groups = [{"type": "full", "prefix_cacheable": True, "page_size_bytes": 1},
              {"type": "mamba", "prefix_cacheable": True, "page_size_bytes": 1, "prefill_checkpoint_blocks": 0}]
    eng = _engine(num_gpu_blocks=20, block_size=8, kv_cache_groups=groups, cache_extra={"prefix_match_unit": 8},
                  vllm_version="0.32.0", max_model_len=64,
                  time_model={"kind": "linear", "base_s": 0.01})
    assert eng.resolved_mamba_cache_mode == "align"
    trace = make_trace([dict(id="a", prompt=8, max_tokens=20, at=0)])
    res = _same_both_ways(trace, eng)
    assert res.steps.column("free_blocks_sched").to_pylist() == (
        [17, 15] + [16] * 7 + [14, 15] + [15] * 6 + [13, 14, 14, 19])
    assert _macro_counts(trace, eng) == {"stretches": 1, "steps": 19}
    # Asynchronous: step k schedules token 7 + k while token 6 + k is in flight, so the blocks are
    # taken at the same steps and the state left behind is retired one step later (3, 11, 19: once
    # the tokens processed cross the block); step 20 has the last token in flight (the async guard
    # skips it), step 21 frees everything.  Steps 2..19 are one stretch.
    asy = eng.replace(async_scheduling=True)
    res = _same_both_ways(trace, asy)
    assert res.steps.column("free_blocks_sched").to_pylist() == (
        [17, 15, 15] + [16] * 6 + [14, 14] + [15] * 6 + [13, 13, 14, 14, 19, 19])
    assert _macro_counts(trace, asy) == {"stretches": 1, "steps": 18}


def test_switched_off_no_stretch_is_taken():
    trace = make_trace([dict(id="a", prompt=4, max_tokens=10, at=0)])
    timed = False
    core = Engine(core_config(_engine()), CoreTrace(**_whole_arrays(trace, _engine(), timed)), macro_steps=False)
    core.run()
    assert core.macro_counts == {"stretches": 0, "steps": 0}


# ------------------------------------------------------------------ recorded scenarios

@pytest.mark.parametrize("version", SUPPORTED_VLLM_VERSIONS)
@pytest.mark.parametrize("scenario", SCENARIOS + SPEC_SCENARIOS)
def test_oracle_scenarios_identical_both_ways(scenario, version):
    path = os.path.join(SPEC_ORACLE if scenario in SPEC_SCENARIOS else ORACLE, scenario)
    if not os.path.exists(os.path.join(path, f"vllm-{version}.jsonl")):
        pytest.skip(f"no {version} recording")
    eng = engine_config_from_dict(oracle_engine_dict(path, version))
    trace = read_oracle_trace(os.path.join(path, "trace.jsonl"), eng.max_model_len)
    _same_both_ways(trace, eng)


def test_quiet_stretches_are_taken_in_the_recorded_scenarios():
    # No drafts: macro-steps apply (full attention, sliding window, Mamba state in align mode; sync or async).
    taken = {}
    for scenario in ("bench_full", "full_small", "full_nocache", "hybrid_swa", "timed", "full_pressure_async",
                     "hybrid_mamba", "hybrid_mamba_fine", "hybrid_mamba_pressure"):
        path = os.path.join(ORACLE, scenario)
        eng = engine_config_from_dict(oracle_engine_dict(path, "0.32.0"))
        trace = read_oracle_trace(os.path.join(path, "trace.jsonl"), eng.max_model_len)
        taken[scenario] = _macro_counts(trace, eng)["steps"]
    assert all(n > 0 for n in taken.values()), taken
    # Never with drafts.
    for scenario in ("spec_full_k3", "spec_mtp_k1_async"):
        path = os.path.join(SPEC_ORACLE, scenario)
        eng = engine_config_from_dict(oracle_engine_dict(path, "0.32.0"))
        trace = read_oracle_trace(os.path.join(path, "trace.jsonl"), eng.max_model_len)
        assert _macro_counts(trace, eng)["steps"] == 0


# ------------------------------------------------------------------ public traces

@pytest.mark.parametrize("path", ["mooncake/synthetic_trace.jsonl", "azure2023/AzureLLMInferenceTrace_code_head500.csv",
                                  "weka/trace_0165.json"])
def test_sample_traces_identical_both_ways(path):
    trace = read_trace(os.path.join(TRACES, path))
    for eng in (_engine(num_gpu_blocks=4000, block_size=16, max_num_seqs=32, max_num_batched_tokens=2048,
                        max_model_len=32768, time_model={"kind": "linear", "base_s": 0.02, "per_token_s": 1e-5}),
                _engine(num_gpu_blocks=1100, block_size=16, max_num_seqs=64, max_num_batched_tokens=1024,
                        max_model_len=16384, time_model={"kind": "linear", "base_s": 0.02, "per_token_s": 1e-5})):
        _same_both_ways(trace, eng, reject_too_long=True)


def test_roofline_steps_identical_both_ways():
    eng = _engine(num_gpu_blocks=400, block_size=16, max_num_seqs=8, max_num_batched_tokens=512,
                  max_model_len=4096, model="llama-3.1-8b", time_model={"kind": "roofline", "gpu": "H100", "tp": 1})
    rows = [dict(id=f"r{i}", prompt=100 + 37 * i, max_tokens=40 + 11 * i, at=0.05 * i) for i in range(20)]
    trace = make_trace(rows, clock="time")
    _same_both_ways(trace, eng)
    assert _macro_counts(trace, eng)["steps"] > 0


def test_streamed_replay_identical_both_ways():
    path = os.path.join(ORACLE, "bench_full")
    eng = engine_config_from_dict(oracle_engine_dict(path, "0.33.0"))
    trace = read_trace(os.path.join(path, "trace.jsonl"))
    whole = replay(trace, eng, macro_steps=False)
    ids = trace.column("request_id").to_pylist()
    rank = sorted(range(len(ids)), key=lambda i: ids[i])
    ranks = [0] * len(ids)
    for r, i in enumerate(rank):
        ranks[i] = r
    t = trace.append_column("id_rank", pa.array(ranks, pa.int32()))
    # out_rows 37: the engine hands rows over in the middle of stretches.
    pieces = [t.slice(i, 50) for i in range(0, t.num_rows, 50)]
    items = list(replay_stream(iter(pieces), eng, timed=False, expected=t.num_rows, out_rows=37))
    steps = [item[1] for item in items if item[0] == "steps"]
    assert ipc_bytes(pa.concat_tables(steps).combine_chunks()) == ipc_bytes(whole.steps.combine_chunks())
    # The gaps between outputs, handed over in pieces too: the same inter-token latencies.
    assert items[-1][1]["itl_s"] == whole.summary["itl_s"] and whole.summary["itl_s"]["p99"] > 0


# ------------------------------------------------------------------ deployments

def _deploy_both_ways(trace, eng, deployment, monkeypatch, **kw):
    """A deployment with macro-steps on and off: the same bytes; the stretches its replicas took."""
    import aisim._core.deploy as core_deploy

    taken = []

    class Counted(core_deploy.Deployment):
        def run(self):
            out = super().run()
            taken.append(self.macro_counts["steps"])
            return out

    monkeypatch.setattr(core_deploy, "Deployment", Counted)
    on = deploy(trace, eng, deployment, record_decisions=True, record_routing=True, macro_steps=True, **kw)
    off = deploy(trace, eng, deployment, record_decisions=True, record_routing=True, macro_steps=False, **kw)
    assert on.routing.keys() == off.routing.keys()
    assert all(np.asarray(on.routing[k]).tobytes() == np.asarray(off.routing[k]).tobytes() for k in on.routing)
    assert ipc_bytes(on.requests) == ipc_bytes(off.requests)
    assert ipc_bytes(on.steps) == ipc_bytes(off.steps)
    assert [_log(r) for r in on.replicas] == [_log(r) for r in off.replicas]
    assert all(on.gaps[k].tobytes() == off.gaps[k].tobytes() for k in ("gap_s", "count"))
    assert json.dumps(on.summary) == json.dumps(off.summary)
    assert taken[1] == 0
    return taken[0]


# 399 usable blocks of 16 tokens hold one request of 6,384 tokens (vLLM's start-up check).
DEPLOY_ENGINE = dict(num_gpu_blocks=400, max_model_len=6384, max_num_seqs=8, max_num_batched_tokens=512,
                     time_model={"kind": "linear", "base_s": 0.01, "per_token_s": 1e-5})


@pytest.mark.parametrize("router", ["round_robin", "least_loaded", {"kind": "least_loaded", "by": "tokens"},
                                    {"kind": "random", "seed": 5}, "kv_aware",
                                    {"kind": "session_affinity", "fallback": "least_loaded"},
                                    {"kind": "least_loaded", "view_delay_s": 0.05},
                                    {"kind": "kv_aware", "view_delay_s": 0.05}])
@pytest.mark.parametrize("load", [{}, {"max_concurrency": 6}, {"closed_loop": True}])
def test_deployments_identical_both_ways(router, load, monkeypatch):
    eng = engine_config_from_dict(DEPLOY_ENGINE)
    trace = synth_trace(240, seed=3, rate=40.0, prompt="lognormal:200:0.5", output="lognormal:60:0.5", turns=4,
                        think_time_s=0.05, prefix_groups=3, prefix_len=64, prefix_fraction=0.5)
    steps = _deploy_both_ways(trace, eng, {"replicas": 3, "router": router}, monkeypatch, **load)
    delayed_keys = isinstance(router, dict) and router["kind"] == "kv_aware"
    # Stretches run on every replica unless the router reads the replicas' block keys late.
    assert (steps == 0) if delayed_keys else (steps > 0)


@pytest.mark.parametrize("router", ["round_robin", "kv_aware", {"kind": "least_loaded", "view_delay_s": 0.05}])
def test_deployments_with_mamba_state_identical_both_ways(router, monkeypatch):
    groups = [{"type": "full", "prefix_cacheable": True, "page_size_bytes": 1},
              {"type": "mamba", "prefix_cacheable": True, "page_size_bytes": 1, "prefill_checkpoint_blocks": 0}]
    eng = engine_config_from_dict(dict(DEPLOY_ENGINE, block_size=32, kv_cache_groups=groups, vllm_version="0.32.0",
                                       max_model_len=2048,
                                       cache_extra={"prefix_match_unit": 16}))
    trace = synth_trace(240, seed=3, rate=40.0, prompt="lognormal:200:0.5", output="lognormal:60:0.5", turns=4,
                        think_time_s=0.05, prefix_groups=3, prefix_len=64, prefix_fraction=0.5)
    assert _deploy_both_ways(trace, eng, {"replicas": 3, "router": router}, monkeypatch) > 0


def test_one_kv_aware_replica_takes_stretches(monkeypatch):
    eng = engine_config_from_dict(DEPLOY_ENGINE)
    trace = synth_trace(200, seed=4, rate=30.0, prompt="lognormal:200:0.5", output="lognormal:60:0.5")
    assert _deploy_both_ways(trace, eng, {"replicas": 1, "router": "kv_aware"}, monkeypatch) > 0


def test_disaggregated_deployments_step_one_iteration_at_a_time(monkeypatch):
    eng = engine_config_from_dict(DEPLOY_ENGINE)
    trace = synth_trace(120, seed=5, rate=30.0, prompt="lognormal:200:0.5", output="lognormal:40:0.5")
    pd = {"prefill": {"replicas": 1}, "decode": {"replicas": 2}, "link": {"bandwidth_gb_s": "inf", "latency_s": 0.001}}
    assert _deploy_both_ways(trace, eng, pd, monkeypatch) == 0


# ------------------------------------------------------------------ property

requests = st.lists(
    st.fixed_dictionaries({
        "prompt": st.integers(1, 70),
        "max_tokens": st.integers(1, 60),
        "at": st.integers(0, 40),
        "shared": st.integers(0, 40),
        "priority": st.integers(0, 2),
    }),
    min_size=1, max_size=14,
)
layouts = st.sampled_from([
    [{"type": "full"}],
    [{"type": "full"}, {"type": "sliding_window", "sliding_window": 12}],
    [{"type": "full"}, {"type": "sliding_window", "sliding_window": 5}],
    [{"type": "full"}, {"type": "ring"}],
    # blocks of different sizes: full attention's wider than the hash block (partial tail keys)
    [{"type": "full", "block_size": 16}, {"type": "sliding_window", "sliding_window": 12}],
    [{"type": "full"}, {"type": "sliding_window", "sliding_window": 20, "block_size": 16}],
    [{"type": "full"}, {"type": "chunked_local", "attention_chunk_size": 8}],
    [{"type": "full"}, {"type": "chunked_local", "attention_chunk_size": 24}],
    # state groups: align mode with prefix caching (else one block of max_model_len tokens), wider than
    # the hash block (fine-grained hits, the partial tail state), with prefill checkpoints
    [{"type": "full"}, {"type": "mamba", "prefill_checkpoint_blocks": 0}],
    [{"type": "full"}, {"type": "mamba", "block_size": 16, "prefill_checkpoint_blocks": 0}],
    [{"type": "full", "block_size": 16}, {"type": "mamba", "block_size": 16, "prefill_checkpoint_blocks": 0},
     {"type": "sliding_window", "sliding_window": 12}],
    [{"type": "full"}, {"type": "gdn", "prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": 4}],
])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=requests, layout=layouts, block=st.sampled_from([2, 4, 8]), blocks=st.integers(14, 120),
       seqs=st.integers(1, 6), budget=st.sampled_from([3, 6, 16, 64]), caching=st.booleans(),
       chunked=st.booleans(), mml=st.sampled_from([48, 96, 256]), version=st.sampled_from(["0.31.0", "0.32.0",
                                                                                           "0.33.0"]),
       policy=st.sampled_from(["fcfs", "priority"]), timed=st.booleans(), cap=st.sampled_from([None, 2]),
       asynchronous=st.booleans())
def test_random_traces_identical_both_ways(reqs, layout, block, blocks, seqs, budget, caching, chunked, mml, version,
                                           policy, timed, cap, asynchronous):
    groups = [dict(g, prefix_cacheable=g["type"] != "ring", page_size_bytes=1) for g in layout]
    kw = dict(num_gpu_blocks=blocks, block_size=block, max_num_batched_tokens=max(budget, 1 if chunked else mml),
              max_num_seqs=seqs, max_model_len=mml, kv_cache_groups=groups, enable_prefix_caching=caching,
              enable_chunked_prefill=chunked, vllm_version=version, policy=policy, async_scheduling=asynchronous,
              time_model={"kind": "linear", "base_s": 0.01, "per_token_s": 0.001})
    if len(groups) > 1 and caching:
        kw["cache_extra"] = {"prefix_match_unit": block}
    try:
        eng = engine_config_from_dict(kw)
    except Exception:
        return  # a combination the configuration refuses (e.g. a pool too small for one request)
    rows = drawn_rows(reqs, mml - 1, at=lambda r: r["at"] / 100 if timed else r["at"],
                      priority=lambda i, r: r["priority"])
    trace = make_trace(rows, clock="time" if timed else "step")
    try:
        replay(trace, eng, macro_steps=False, max_concurrency=cap)
    except Exception:
        return  # refused (a request that can never fit): nothing to compare
    _same_both_ways(trace, eng, max_concurrency=cap)
