"""Property: with speculative decoding on, no request ever outputs more than ``max_tokens``.

Random traces (prompts, shared prefixes, arrivals, output lengths, per-request
``accept`` lists), random acceptance rules and engines (k, method, release,
sync or async, pool size that forces preemptions), each replayed to the end:
every request finishes with exactly ``max_tokens`` outputs, its accepted
drafts never exceed its drafts, and the decision log's verifications add up
to the request columns.
"""

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from aisim.config.engine import engine_config_from_dict
from aisim.decisionlog import decision_lines
from aisim.replay import replay

from helpers import drawn_rows, make_trace

requests = st.lists(
    st.fixed_dictionaries({
        "prompt": st.integers(1, 90),
        "max_tokens": st.integers(1, 40),
        "at": st.integers(0, 12),
        "shared": st.integers(0, 40),
        "accept": st.one_of(st.none(), st.lists(st.integers(0, 6), min_size=1, max_size=4)),
    }),
    min_size=1, max_size=12,
)
acceptance = st.one_of(
    st.fixed_dictionaries({"counts": st.lists(st.integers(0, 6), min_size=1, max_size=5)}),
    st.fixed_dictionaries({"permille": st.one_of(st.integers(0, 1000), st.lists(st.integers(0, 1000), min_size=1,
                                                                               max_size=4)),
                           "seed": st.integers(0, 2**64 - 1)}),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=requests, acc=acceptance, k=st.integers(1, 4), method=st.sampled_from(["eagle", "draft_model", "ngram"]),
       version=st.sampled_from(["0.31.0", "0.32.0", "0.33.0"]), asynchronous=st.booleans(),
       blocks=st.integers(24, 60), policy=st.sampled_from(["fcfs", "priority"]))
def test_outputs_never_exceed_max_tokens(reqs, acc, k, method, version, asynchronous, blocks, policy):
    eng = engine_config_from_dict(dict(
        num_gpu_blocks=blocks, block_size=8, max_num_batched_tokens=48, max_num_seqs=6, max_model_len=160,
        vllm_version=version, kv_cache_groups=[{"type": "full"}], async_scheduling=asynchronous, policy=policy,
        speculative={"num_speculative_tokens": k, "method": method, "acceptance": acc}))
    rows = drawn_rows(reqs, max(r["prompt"] for r in reqs), accept=lambda i, r: r["accept"],
                      priority=lambda i, r: i % 3)
    result = replay(make_trace(rows), eng, record_decisions=True)
    out = result.requests.to_pylist()
    assert all(q["status"] == "finished" for q in out)
    assert {q["request_id"]: q["output_tokens"] for q in out} == {f"r{i:02d}": r["max_tokens"] for i, r in enumerate(reqs)}
    assert all(0 <= q["spec_accepted"] <= q["spec_drafts"] for q in out)
    drafted = {q["request_id"]: 0 for q in out}
    for line in decision_lines(result):
        if line["type"] != "step":
            continue
        for rid, (m, a) in line["spec"].items():
            assert 0 <= a <= m <= k
            drafted[rid] += m
    assert drafted == {q["request_id"]: q["spec_drafts"] for q in out}
