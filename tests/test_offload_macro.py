"""Macro-steps with a KV offload tier: byte-identical to stepping one iteration at a time.

With a tier the connector runs in every step of a quiet stretch (ext/engine_macro.pxi): its
waiting pass, build_connector_meta and the worker's output; the stretch skips only each running
request's store check, and ends before a step in which one of them could get a store job
(off_quiet_bound).  Each comparison replays a trace with ``macro_steps`` on and off and asserts
the step table, the request table, the summary, the gaps and the decision log identical; the
hand-derived cases also pin how many stretches were taken and how many steps they covered.
"""

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from aisim.config.engine import engine_config_from_dict
from aisim.replay import replay
from aisim.traces.synth import synth_trace

from helpers import drawn_rows, make_trace, offload_engine_dict, offload_requests
from test_macro_steps import _deploy_both_ways, _macro_counts, _same_both_ways


def _engine(blocks=40, asynchronous=False, **offload):
    # Blocks of 16 tokens, one chunk a block, stores and loads reported one step after their issue.
    eng = {"num_gpu_blocks": blocks, "block_size": 16, "max_model_len": 320, "max_num_seqs": 4,
           "max_num_batched_tokens": 256, "startup_check": False, "vllm_version": "0.34.0",
           "kv_cache_groups": [{"type": "full"}], "async_scheduling": asynchronous,
           "time_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 0.0001},
           "kv_offload": {"cpu_blocks": 20, **offload}}
    return engine_config_from_dict(eng)


ONE = [dict(id="a", prompt=64, max_tokens=20, at=0)]


def test_a_landing_inside_a_stretch():
    # Prompt 64 (4 chunks), 20 outputs.  Step 0 prefills and issues store job 0 (4 chunks); a decode
    # past the prompt never stores (offload_prompt_only), so steps 1..19 are one stretch, ending
    # with the finish: the output of step 1, inside it, reports job 0 (4 chunks evictable).
    eng = _engine()
    res = _same_both_ways(make_trace(ONE), eng)
    steps = res.steps.to_pydict()
    assert steps["offload_stores"][:2] == [1, 0] and steps["offload_completed"][:3] == [0, 1, 0]
    assert steps["offload_cpu_evictable"][:3] == [0, 4, 4]
    assert _macro_counts(make_trace(ONE), eng) == {"stretches": 1, "steps": 19}


def test_a_decode_store_ends_a_stretch():
    # Without offload_prompt_only the decodes store: after step 0, chunk 4 (tokens 64..79) is the
    # next; step s (1..19) schedules computed tokens 64 + s, so its build_connector_meta stores
    # chunk 4 at step 16.  Steps 1..15 are a stretch, step 16 is stepped alone; at step 17 the
    # next chunk (80..95) is out of reach of the 3 steps left: steps 17..19 are one more.  The
    # finished request offers its tokens up to 83 (the last sampled one has no KV): no new chunk.
    eng = _engine(extra={"offload_prompt_only": False})
    res = _same_both_ways(make_trace(ONE), eng)
    steps = res.steps.to_pydict()
    assert [s for s, n in zip(steps["step"], steps["offload_stores"]) if n] == [0, 16]
    assert _macro_counts(make_trace(ONE), eng) == {"stretches": 2, "steps": 15 + 3}


def test_a_decode_store_ends_an_asynchronous_stretch():
    # Asynchronous: step 1 schedules the first decode while the prefill is in flight; from step 2
    # the batch in flight is one decode.  Step s schedules computed tokens 64 + s while the output
    # of step s - 1 is not processed yet: its offloadable tokens are min(64 + s, num_tokens 63 + s),
    # so chunk 4 is stored at step 17 and the stretch is steps 2..16.  At step 18 the outputs of
    # steps 0..16 are in (17 of 20) and its last token may not be in flight: steps 18..19.
    eng = _engine(asynchronous=True, extra={"offload_prompt_only": False})
    res = _same_both_ways(make_trace(ONE), eng)
    steps = res.steps.to_pydict()
    assert [s for s, n in zip(steps["step"], steps["offload_stores"]) if n] == [0, 17]
    assert _macro_counts(make_trace(ONE), eng) == {"stretches": 2, "steps": 15 + 2}


def test_a_load_issued_inside_a_stretch():
    # 19 usable blocks, a tier of 30 chunks.  a (p: 64 tokens, 4 blocks) finishes at step 0 and f
    # (240 tokens, 15 blocks) at step 1, both stored whole; b (64 tokens of its own) arrives at step
    # 3 and takes the least recently freed blocks, a's: p is gone from the GPU, kept in the tier.
    # b decodes from step 4 (its fifth block at step 4).  c (p + 16) arrives at step 8, inside b's
    # stretch: the quiet step's waiting pass looks it up (64 tokens offered), takes 4 blocks and
    # issues load job 3; c waits in WAITING_FOR_REMOTE_KVS.  The output of step 9 reports the load
    # and the waiting pass of step 10 admits c, which ends the stretch (steps 4..10).  c computes
    # its last 16 tokens (store of chunk 4) and finishes at step 11, a step of its own (a stretch
    # of one step needs 8 running requests); steps 12..32 are one more stretch, ending with b.
    reqs = [dict(id="a", prompt=64, max_tokens=1, at=0, segments=[("p", 0, 64)]),
            dict(id="f", prompt=240, max_tokens=1, at=1),
            dict(id="b", prompt=64, max_tokens=30, at=3),
            dict(id="c", prompt=80, max_tokens=2, at=8, segments=[("p", 0, 64), ("own-c", 64, 16)])]
    eng = _engine(blocks=20, cpu_blocks=30)
    res = _same_both_ways(make_trace(reqs), eng)
    steps = res.steps.to_pydict()
    assert steps["offload_loads"][8] == 1 and steps["offload_load_tokens"][8] == 64
    assert steps["offload_remote_wait"][8:11] == [1, 1, 0] and steps["offload_completed"][9] == 1
    assert steps["num_new"][10] == 1 and steps["prefill_tokens"][10] == 16 and steps["offload_stores"][10] == 1
    assert steps["free_blocks"][7:10] == [14, 10, 10]
    assert _macro_counts(make_trace(reqs), eng) == {"stretches": 2, "steps": 7 + 21}


requests = offload_requests(max_prompt=120, max_shared=100, max_size=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=requests, blocks=st.integers(8, 40), cpu=st.integers(2, 24), seqs=st.integers(1, 4),
       budget=st.sampled_from([16, 48, 256]), asynchronous=st.booleans(), disk=st.booleans(),
       prompt_only=st.booleans(), per_chunk=st.sampled_from([1, 2]), link=st.booleans(), timed=st.booleans(),
       delays=st.sampled_from([(1, 1), (2, 3), (0, 1)]))
def test_random_traces_with_a_tier_identical_both_ways(reqs, blocks, cpu, seqs, budget, asynchronous, disk,
                                                       prompt_only, per_chunk, link, timed, delays):
    # A GPU pool that churns (8-40 blocks of 16 tokens), a CPU tier of 2-24 chunks (1 or 2 blocks
    # each, evicting often), with or without the disk tier, transfers on the step clock or the
    # PCIe link's, prompts sharing one of three prefixes.
    off = {"cpu_blocks": cpu, "blocks_per_chunk": per_chunk, "disk_tier": disk,
           "load_delay_steps": delays[0], "store_delay_steps": delays[1],
           "extra": {"offload_prompt_only": prompt_only}}
    if link:
        off.update(pcie_gen=5, kv_bytes_per_block=64 << 20)
    kw = offload_engine_dict(blocks, seqs, budget, asynchronous, off)
    try:
        eng = engine_config_from_dict(kw)
    except Exception:
        return  # a combination the configuration refuses
    rows = drawn_rows(reqs, 150, shared_stream=lambda r: f"p{r['prefix']}",
                      at=lambda r: r["at"] / 100 if timed else r["at"])
    trace = make_trace(rows, clock="time" if timed else "step")
    try:
        replay(trace, eng, macro_steps=False)
    except Exception:
        return  # refused (a request that can never fit): nothing to compare
    _same_both_ways(trace, eng)


def _deploy_engine(**offload):
    # A pool that churns behind each replica (99 usable blocks of 16 tokens), a tier of 120 chunks
    # on the PCIe link.
    return engine_config_from_dict(dict(
        num_gpu_blocks=100, max_model_len=1584, max_num_seqs=8, max_num_batched_tokens=512, startup_check=False,
        vllm_version="0.34.0", kv_cache_groups=[{"type": "full"}],
        time_model={"kind": "linear", "base_s": 0.01, "per_token_s": 1e-5},
        kv_offload={"cpu_blocks": 120, "pcie_gen": 4, "kv_bytes_per_block": 64 << 20, **offload}))


@pytest.mark.parametrize("router", ["round_robin", "least_loaded", "kv_aware"])
@pytest.mark.parametrize("asynchronous", [False, True])
def test_deployments_with_a_tier_identical_both_ways(router, asynchronous, monkeypatch):
    # Each replica runs its own stretches, its connector in every step of them, up to the
    # deployment's next event.  The next turns come back after their prefixes left the GPU pool:
    # some are loaded from the tier (10 loads with round-robin, synchronous), which evicts.
    eng = _deploy_engine().replace(async_scheduling=asynchronous)
    trace = synth_trace(160, seed=3, rate=40.0, prompt="lognormal:200:0.5", output="lognormal:60:0.5", turns=2,
                        think_time_s=1.0, prefix_groups=3, prefix_len=128, prefix_fraction=0.6)
    assert _deploy_both_ways(trace, eng, {"replicas": 2, "router": router}, monkeypatch) > 0
