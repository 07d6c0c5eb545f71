"""Lazy keys: blocks no other request can share are cached without keys, and nothing a replay
reports changes.

Block keys are a chain, so a request's block can be another request's only within the leading
tokens the two have in common (``aisim._core.hashing.shared_prefix_tokens``); a request whose first
hash block no other request of the trace has (a private one) shares no block at all.  Only the
request's own lookup after a preemption could find the keys of its later blocks: the core caches
them lazily (ext/blockpool.pyx ``bp_cache_lazily``) and keys them when it is preempted
(ext/kvcache.pyx ``kv_key_lazy``).  Every comparison here replays a trace with lazy keys (the
default) and with every block keyed as it is cached (``replay(..., lazy_keys=False)``; deployments:
``aisim.replay_input.private_requests`` replaced by all zeros) and asserts byte-identical step and
request tables, summaries and decision logs.
"""

import json
import os

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings

import aisim.replay_input as replay_module
from aisim.config.engine import engine_config_from_dict
from aisim.config.versions import SUPPORTED_VLLM_VERSIONS
from aisim.core_input import CoreTrace, core_config, private_requests
from aisim.decisionlog import decision_lines, log_line_json
from aisim.deploy import deploy
from aisim.replay import _whole_arrays, replay, replay_stream, stream_private
from aisim.traces import read_oracle_trace, read_trace
from aisim._core.hashing import shared_prefix_tokens
from aisim.traces.schema import canonical_segments, output_stream, stream_id, trace_table
from aisim.traces.synth import synth_trace

from conftest import ORACLE
from helpers import drawn_rows, ipc_bytes, make_trace, oracle_engine_dict

TRACES = os.path.join(os.path.dirname(__file__), "data", "traces")


def _private(trace, eng):
    timed = (trace.schema.metadata or {}).get(b"clock") == b"time"
    return private_requests(CoreTrace(**_whole_arrays(trace, eng, timed)), core_config(eng).hash_block_size).tolist()


def _same_with_and_without(trace, eng, monkeypatch, **kw):
    lazy = replay(trace, eng, record_decisions=True, **kw)
    keyed = replay(trace, eng, record_decisions=True, lazy_keys=False, **kw)
    assert ipc_bytes(lazy.steps) == ipc_bytes(keyed.steps)
    assert ipc_bytes(lazy.requests) == ipc_bytes(keyed.requests)
    assert json.dumps(lazy.summary) == json.dumps(keyed.summary)
    assert [log_line_json(x) for x in decision_lines(lazy)] == [log_line_json(x) for x in decision_lines(keyed)]
    return lazy


def _engine(**kw):
    base = dict(num_gpu_blocks=8, block_size=4, max_num_batched_tokens=64, max_num_seqs=2, max_model_len=64,
                kv_cache_groups=[{"type": "full"}], time_model={"kind": "linear", "base_s": 0.01})
    base.update(kw)
    return engine_config_from_dict(base)


# ------------------------------------------------------------------ which requests are private

def test_private_requests_by_hand():
    # Blocks of 4 tokens.  a and b open with the same 4 "sys" tokens: both shared.  c's first block
    # is its own, but f resends c's prompt: both shared.  d (2 + 1 tokens) never fills a block.
    # e (2 prompt tokens) fills its first block with 2 of its outputs: no other request has them.
    # g opens with e's outputs (not e's first block, whose chain starts at e's prompt): private,
    # and e too.
    rows = [dict(id="a", prompt=12, max_tokens=2, at=0, segments=[("sys", 0, 8), ("a", 0, 4)]),
            dict(id="b", prompt=10, max_tokens=2, at=0, segments=[("sys", 0, 8), ("b", 0, 2)]),
            dict(id="c", prompt=10, max_tokens=2, at=0),
            dict(id="d", prompt=2, max_tokens=1, at=0),
            dict(id="e", prompt=2, max_tokens=5, at=0)]
    trace = make_trace(rows)
    segs = trace.column("segments").to_pylist() + [
        [(stream_id("t", "private-c"), 0, 10), (stream_id("t", "f"), 0, 3)],
        [(output_stream("e"), 0, 4)]]
    whole = trace_table({"request_id": ["a", "b", "c", "d", "e", "f", "g"], "arrival_step": [0] * 7,
                         "arrival_s": [None] * 7, "prompt_tokens": [12, 10, 10, 2, 2, 13, 4],
                         "output_tokens": [2, 2, 2, 1, 5, 2, 2], "priority": [0] * 7,
                         "segments": [[tuple(s.values()) if isinstance(s, dict) else tuple(s) for s in row]
                                      for row in segs]}, "step")
    eng = _engine(num_gpu_blocks=40)
    assert _private(whole, eng) == [0, 0, 0, 1, 1, 0, 1]


def _shared(trace, eng):
    timed = (trace.schema.metadata or {}).get(b"clock") == b"time"
    return shared_prefix_tokens(CoreTrace(**_whole_arrays(trace, eng, timed))).tolist()


def test_shared_prefix_tokens_by_hand():
    # a and b open with the same 8 "sys" tokens, h with its first 6, i with them and 2 of a's next
    # 4 tokens.  a shares 8 + 2 with i, b only the 8 (its next run is its own), h 6 (with every
    # one of them), i 10 (with a).  c's prompt is resent whole by f, whose next run is its own:
    # 10 each.  d shares nothing.  A session: t2 resends t1's prompt and its 3 outputs, t1 shares
    # all of its tokens (prompt and answer), t2 those.
    def row(rid, segs, out):
        return rid, canonical_segments([(s if isinstance(s, int) else stream_id("t", s), f, n) for s, f, n in segs]), out
    rows = [row("a", [("sys", 0, 8), ("a", 0, 4)], 2), row("b", [("sys", 0, 8), ("b", 0, 2)], 2),
            row("h", [("sys", 0, 6), ("h", 0, 5)], 1), row("i", [("sys", 0, 8), ("a", 0, 2), ("i", 0, 3)], 1),
            row("c", [("c", 0, 10)], 2), row("f", [("c", 0, 10), ("f", 0, 3)], 2), row("d", [("d", 0, 2)], 1),
            row("t1", [("s", 0, 5)], 3), row("t2", [("s", 0, 5), (output_stream("t1"), 0, 3), ("n", 0, 4)], 2)]
    trace = trace_table({"request_id": [r[0] for r in rows], "arrival_step": [0] * len(rows),
                         "arrival_s": [None] * len(rows), "prompt_tokens": [sum(n for _, _, n in r[1]) for r in rows],
                         "output_tokens": [r[2] for r in rows], "priority": [0] * len(rows),
                         "segments": [r[1] for r in rows]}, "step")
    eng = _engine(num_gpu_blocks=40)
    assert _shared(trace, eng) == [10, 8, 6, 10, 10, 10, 0, 8, 8]
    # Private (shares no whole first block of 4) where a request shares fewer than 4 tokens.
    assert _private(trace, eng) == [0, 0, 0, 0, 0, 0, 1, 0, 0]


# ------------------------------------------------------------------ by hand

def test_a_private_request_preempted_finds_its_own_blocks(monkeypatch):
    # 7 usable blocks of 4 tokens; a and b (8 private prompt tokens, 12 outputs each) are admitted
    # at step 0 with 2 blocks each (a: 1, 2; b: 3, 4).  Their 9th token takes a third block each at
    # step 1 (a: 5, b: 6): one left.  At step 5 their 13th token needs a fourth: a takes block 7,
    # b finds none and is preempted (the last of the running).  b had computed 12 tokens, so its
    # blocks 3, 4, 6 are full and cached: freed tail first they queue as 6, 4, 3 behind nothing.
    # a's 17th token (step 9) pops block 6, evicting b's tokens 8..11.  When a finishes, b is
    # re-admitted with 8 + 5 tokens; its lookup finds its blocks 3 and 4: a hit of 8 tokens, which
    # the lazily cached blocks could only give once keyed at the preemption.
    trace = make_trace([dict(id="a", prompt=8, max_tokens=12, at=0), dict(id="b", prompt=8, max_tokens=12, at=0)])
    eng = _engine(max_model_len=28)  # what 7 usable blocks of 4 tokens hold (vLLM's start-up check)
    assert _private(trace, eng) == [1, 1]
    res = _same_with_and_without(trace, eng, monkeypatch)
    rows = {r["request_id"]: r for r in res.requests.to_pylist()}
    assert rows["b"]["preemptions"] == 1 and rows["a"]["preemptions"] == 0
    assert rows["b"]["cached_tokens"] == 0 and rows["b"]["cached_tokens_all_admissions"] == 8
    stats = res.summary["prefix_cache_stats"]
    assert (stats["preempted_queries"], stats["preempted_hits"], stats["hits"]) == (13, 8, 0)


def test_session_turns_that_quote_answers(monkeypatch):
    # Turn 2 resends turn 1's prompt and answer: neither is private; the third request is.
    t1 = [(stream_id("s", "sys"), 0, 100)]
    t2 = t1 + [(output_stream("t1"), 0, 30), (stream_id("s", "new"), 0, 40)]
    rows = {"request_id": ["t1", "t2", "x"], "arrival_step": [None] * 3, "arrival_s": [0.0, 5.0, 0.1],
            "prompt_tokens": [100, 170, 64], "output_tokens": [30, 5, 20], "priority": [0] * 3,
            "segments": [t1, t2, [(stream_id("s", "x"), 0, 64)]], "session_id": ["s", "s", None],
            "turn": [0, 1, 0]}
    trace = trace_table(rows, "time")
    eng = _engine(num_gpu_blocks=60, block_size=16, max_model_len=944)  # 59 x 16: what the pool holds
    # In arrival order: t1, x, t2.
    assert _private(trace, eng) == [0, 1, 0]
    res = _same_with_and_without(trace, eng, monkeypatch)
    # t2 hits t1's 100 prompt tokens and 28 of its outputs (8 full blocks; the last output has no KV).
    assert res.requests.column("cached_tokens").to_pylist() == [0, 0, 128]


def test_a_window_frees_blocks_a_preempted_request_finds_again(monkeypatch):
    # Full attention and a 12-token window, 20 usable blocks of 4 tokens: the window frees blocks of
    # the requests it slides over; requests are preempted and resumed.  Their lookups after a
    # preemption find blocks a window freed before it: keyed when the window freed them.
    eng = _engine(num_gpu_blocks=21, block_size=4, max_num_batched_tokens=8, max_num_seqs=6, max_model_len=32,
                  vllm_version="0.31.0", enable_chunked_prefill=True,
                  kv_cache_groups=[{"type": "full", "page_size_bytes": 1, "prefix_cacheable": True},
                                   {"type": "sliding_window", "sliding_window": 12, "page_size_bytes": 1,
                                    "prefix_cacheable": True}],
                  cache_extra={"prefix_match_unit": 4})
    shape = [(19, 13, 23), (4, 28, 8), (13, 18, 23), (16, 16, 3), (30, 2, 9), (24, 8, 27), (17, 13, 7), (20, 10, 2),
             (26, 6, 6), (29, 3, 11), (28, 4, 4), (11, 21, 11)]
    trace = make_trace([dict(id=f"r{i:02d}", prompt=p, max_tokens=m, at=a) for i, (p, m, a) in enumerate(shape)])
    assert _private(trace, eng) == [1] * len(shape)
    res = _same_with_and_without(trace, eng, monkeypatch)
    assert res.summary["prefix_cache_stats"]["preempted_hits"] > 0


# ------------------------------------------------------------------ recorded and sample traces

@pytest.mark.parametrize("scenario", sorted(os.listdir(ORACLE)))
def test_oracle_scenarios_identical(scenario, monkeypatch):
    path = os.path.join(ORACLE, scenario)
    # 0.32.0, or the first release that has the scenario's settings.
    version = next(v for v in ("0.32.0",) + SUPPORTED_VLLM_VERSIONS if os.path.exists(os.path.join(path, f"vllm-{v}.jsonl")))
    eng = engine_config_from_dict(oracle_engine_dict(path, version))
    trace = read_oracle_trace(os.path.join(path, "trace.jsonl"), eng.max_model_len)
    _same_with_and_without(trace, eng, monkeypatch)


@pytest.mark.parametrize("path", ["mooncake/synthetic_trace.jsonl", "azure2023/AzureLLMInferenceTrace_code_head500.csv"])
def test_sample_traces_under_pressure_identical(path, monkeypatch):
    trace = read_trace(os.path.join(TRACES, path))
    eng = _engine(num_gpu_blocks=1100, block_size=16, max_num_seqs=64, max_num_batched_tokens=1024,
                  max_model_len=16384, time_model={"kind": "linear", "base_s": 0.02, "per_token_s": 1e-5})
    res = _same_with_and_without(trace, eng, monkeypatch, reject_too_long=True)
    assert res.summary["preemptions"] > 0


def _streamed(trace, eng, private, **kw):
    pieces = [trace.slice(i, 97) for i in range(0, trace.num_rows, 97)]
    timed = (trace.schema.metadata or {}).get(b"clock") == b"time"
    out = {"requests": [], "steps": []}
    for item in replay_stream(iter(pieces), eng, timed=timed, expected=trace.num_rows, out_rows=41,
                              private=private, **kw):
        if item[0] != "summary":
            out[item[0]].append(item[1])
    return [ipc_bytes(pa.concat_tables(v).combine_chunks()) for v in out.values()]


def test_streamed_replays_identical():
    # The Mooncake sample in pieces of 97 rows with prompts of max_model_len or more rejected: the
    # flags of one pass over the pieces (stream_private) line up with the rows the core is fed.
    trace = read_trace(os.path.join(TRACES, "mooncake/synthetic_trace.jsonl"))
    eng = _engine(num_gpu_blocks=1100, block_size=16, max_num_seqs=64, max_num_batched_tokens=1024,
                  max_model_len=16384, time_model={"kind": "linear", "base_s": 0.02, "per_token_s": 1e-5})
    pieces = [trace.slice(i, 97) for i in range(0, trace.num_rows, 97)]
    private = stream_private(iter(pieces), eng, timed=True)
    assert private.tolist() == _private(trace, eng)
    assert 0 < private.sum() < trace.num_rows
    lazy = _streamed(trace, eng, private, reject_too_long=True)
    assert lazy == _streamed(trace, eng, None, reject_too_long=True)
    whole = replay(trace, eng, reject_too_long=True)
    assert whole.summary["preemptions"] > 0
    assert lazy[1] == ipc_bytes(whole.steps.combine_chunks())


@pytest.mark.parametrize("fleet", [{"replicas": 3, "router": "round_robin"},
                                   {"prefill": {"replicas": 2, "router": "round_robin"},
                                    "decode": {"replicas": 2, "router": "least_loaded"},
                                    "link": {"bandwidth_gb_s": "inf"}}])
def test_deployments_identical(fleet, monkeypatch):
    # Replicas and disaggregated pools under pressure: private requests preempted on a replica.
    trace = synth_trace(300, seed=7, rate=60.0, prompt="lognormal:300:0.5", output="lognormal:40:0.5", turns=1,
                        think_time_s=0.1, prefix_groups=5, prefix_len=128, prefix_fraction=0.5)
    eng = _engine(num_gpu_blocks=120, block_size=16, max_num_seqs=32, max_num_batched_tokens=1024,
                  max_model_len=1904, time_model={"kind": "linear", "base_s": 0.005, "per_token_s": 2e-5})  # 119 x 16
    assert 0 < sum(_private(trace, eng)) < trace.num_rows
    lazy = deploy(trace, eng, fleet)
    with monkeypatch.context() as m:
        m.setattr(replay_module, "private_requests", lambda ct, size: np.zeros(len(ct.prompt_len), dtype=np.int8))
        keyed = deploy(trace, eng, fleet)
    assert lazy.summary["preemptions"] > 0
    assert ipc_bytes(lazy.requests) == ipc_bytes(keyed.requests)
    assert ipc_bytes(lazy.steps) == ipc_bytes(keyed.steps)


# ------------------------------------------------------------------ property

requests = st.lists(
    st.fixed_dictionaries({
        "prompt": st.integers(1, 70),
        "max_tokens": st.integers(1, 60),
        "at": st.integers(0, 40),
        "shared": st.integers(0, 12),
    }),
    min_size=1, max_size=14,
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(reqs=requests, block=st.sampled_from([2, 4, 8]), spare=st.integers(0, 60), seqs=st.integers(1, 6),
       budget=st.sampled_from([3, 6, 16, 64]), chunked=st.booleans(), version=st.sampled_from(["0.31.0", "0.32.0",
                                                                                              "0.33.0"]),
       policy=st.sampled_from(["fcfs", "priority"]), asynchronous=st.booleans(), macro=st.booleans(),
       second=st.sampled_from([None, {"type": "sliding_window", "sliding_window": 8},
                               {"type": "sliding_window", "sliding_window": 13},
                               {"type": "chunked_local", "attention_chunk_size": 8}, {"type": "ring"}]),
       retention=st.sampled_from([None, 4, 8, 16]), mml=st.sampled_from([32, 48, 96]))
def test_random_traces_identical(reqs, block, spare, seqs, budget, chunked, version, policy, asynchronous, macro,
                                 second, retention, mml, monkeypatch):
    groups = [{"type": "full", "page_size_bytes": 1, "prefix_cacheable": True}]
    if second:  # a window or a local chunk frees blocks a preempted request could find again
        groups.append(dict(second, page_size_bytes=1, prefix_cacheable=second["type"] != "ring"))
    # A pool just big enough for one request of max_model_len in every group, plus ``spare`` blocks.
    blocks = len(groups) * -(-mml // block) + 2 + spare
    kw = dict(num_gpu_blocks=blocks, block_size=block, max_num_batched_tokens=max(budget, 1 if chunked else mml),
              max_num_seqs=seqs, max_model_len=mml, kv_cache_groups=groups, enable_chunked_prefill=chunked,
              vllm_version=version, policy=policy, async_scheduling=asynchronous,
              time_model={"kind": "linear", "base_s": 0.01, "per_token_s": 0.001})
    if second:
        # Sparse retention caches only some window blocks: a resumed request's window may then
        # match blocks freed long before its preemption.
        kw["cache_extra"] = {"prefix_match_unit": block}
        if retention:
            kw["cache_extra"]["prefix_cache_retention_interval"] = retention
    try:
        eng = engine_config_from_dict(kw)
    except Exception:
        return  # a combination the configuration refuses
    rows = drawn_rows(reqs, mml - 1, priority=lambda i, r: i % 3)
    trace = make_trace(rows)
    try:
        replay(trace, eng)
    except Exception:
        return  # refused (a request that can never fit): nothing to compare
    _same_with_and_without(trace, eng, monkeypatch, macro_steps=macro)


# Requests that resend part of an earlier request's prompt, or all of it and part of its answer
# (a session's next turn), then tokens of their own: every depth of shared prefix, blocks cut
# anywhere inside one.
family = st.lists(
    st.fixed_dictionaries({
        "parent": st.integers(-1, 15),    # the earlier request it resends (-1 or later: none)
        "cut": st.integers(0, 40),        # how much of the parent's prompt it resends
        "answer": st.integers(0, 20),     # how much of the parent's answer (after all of its prompt)
        "own": st.integers(0, 20),
        "max_tokens": st.integers(1, 40),
        "at": st.integers(0, 12),
    }),
    min_size=2, max_size=16,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(reqs=family, block=st.sampled_from([2, 4, 8]), spare=st.integers(0, 10), seqs=st.integers(2, 6),
       budget=st.sampled_from([3, 8, 16, 64]), chunked=st.booleans(), version=st.sampled_from(SUPPORTED_VLLM_VERSIONS),
       macro=st.booleans(), second=st.sampled_from([None, {"type": "sliding_window", "sliding_window": 8},
                                                    {"type": "chunked_local", "attention_chunk_size": 8},
                                                    {"type": "ring"},
                                                    {"type": "mamba", "prefill_checkpoint_blocks": 0}]),
       mml=st.sampled_from([32, 64, 96]), drafts=st.sampled_from([0, 0, 2]))
def test_random_families_identical(reqs, block, spare, seqs, budget, chunked, version, macro, second, mml, drafts,
                                   monkeypatch):
    # A pool that churns: evictions, partial blocks, session turns, preemptions and resumed
    # requests finding their own blocks; hybrid groups and speculative decoding on every release.
    groups = [{"type": "full", "page_size_bytes": 1, "prefix_cacheable": True}]
    if second:
        groups.append(dict(second, page_size_bytes=1, prefix_cacheable=second["type"] != "ring"))
    kw = dict(num_gpu_blocks=len(groups) * -(-mml // block) + 2 + spare, block_size=block,
              max_num_batched_tokens=max(budget, 1 if chunked else mml), max_num_seqs=seqs, max_model_len=mml,
              kv_cache_groups=groups, enable_chunked_prefill=chunked, vllm_version=version,
              time_model={"kind": "linear", "base_s": 0.01, "per_token_s": 0.001})
    if drafts:
        kw["speculative"] = {"num_speculative_tokens": drafts, "method": "eagle", "acceptance": {"counts": [0, 2, 1]}}
    if second:
        kw["cache_extra"] = {"prefix_match_unit": block}
    try:
        eng = engine_config_from_dict(kw)
    except Exception:
        return  # a combination the configuration refuses
    ids, prompts, outs, segs = [], [], [], []
    for i, r in enumerate(reqs):
        rid = f"r{i:02d}"
        own = [(stream_id("t", rid), 0, r["own"] + 1)]
        if 0 <= r["parent"] < i:
            p = r["parent"]
            take, quoted = [], 0
            for s, f, n in segs[p]:
                if quoted < r["cut"]:
                    take.append((s, f, min(n, r["cut"] - quoted)))
                    quoted += take[-1][2]
            if quoted == prompts[p] and r["answer"]:
                take.append((output_stream(ids[p]), 0, min(r["answer"], outs[p])))
            own = take + own
        seg = canonical_segments(own)
        total = sum(n for _, _, n in seg)
        if total >= mml:
            return
        ids.append(rid)
        prompts.append(total)
        outs.append(r["max_tokens"])
        segs.append(seg)
    trace = trace_table({"request_id": ids, "arrival_step": [r["at"] for r in reqs[:len(ids)]],
                         "arrival_s": [None] * len(ids), "prompt_tokens": prompts, "output_tokens": outs,
                         "priority": [0] * len(ids), "segments": segs}, "step")
    try:
        replay(trace, eng)
    except Exception:
        return  # refused (a request that can never fit): nothing to compare
    _same_with_and_without(trace, eng, monkeypatch, macro_steps=macro)
