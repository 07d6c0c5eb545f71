"""The KV-aware router's prefix index (ext/keyindex.pxi): prompts that end inside another's run
of blocks, leave it, repeat it; keys a replica reports by its blocks' tags; output blocks a
later prompt quotes.  Values derived by hand from the cost in ext/deploy.pyx ``_kv_scores``:
cost_w = (booked prefill + max(0, prompt - overlap_w * B)) / B + active blocks on w + the
prompt's blocks not active there."""

import numpy as np
import pyarrow as pa
import pytest

from aisim.config.engine import engine_config_from_dict
from aisim.deploy import deploy
from aisim.traces.frame import from_frame
from aisim.traces.synth import synth_trace

B = 16


def _nested():
    """Group 0's stream gives A 10 blocks, B its first 5, C its first 7 and 3 of its own, E all 10
    again; D is 4 blocks of group 1.  Half a second apart, each still decoding when the others
    arrive (1,000 output tokens at 10 ms a step), each prefilled within a step of its arrival."""
    prefix = [160, 80, 112, 64, 160]
    prompt = [160, 80, 160, 64, 160]
    return from_frame(pa.table({
        "request_id": list("ABCDE"), "arrival_time": [0.0, 0.5, 1.0, 1.5, 2.0],
        "prompt_len": prompt, "max_tokens": [1000] * 5,
        "prefix_group": [0, 0, 0, 1, 0], "prefix_len": prefix}))


def test_nested_prompts_by_hand():
    eng = engine_config_from_dict({"num_gpu_blocks": 4000, "block_size": B,
                                   "time_model": {"kind": "linear", "base_s": 0.01}})
    dep = deploy(_nested(), eng, {"replicas": 2, "router": "kv_aware"}, record_routing=True)
    r = dep.routing
    # A: nothing anywhere. B (A's first 5 blocks): replica 0 caches and holds them (cost tie,
    # lowest index). C: 7 of A's blocks, then its own 3 (A's run split at 5 and 7). D: another
    # group. E: A again, every block cached and active on replica 0.
    assert r["overlap_blocks"].tolist() == [[0, 0], [5, 0], [7, 0], [0, 0], [10, 0]]
    assert r["overlap_blocks_true"].tolist() == r["overlap_blocks"].tolist()
    assert r["decode_blocks"].tolist() == [[10, 10], [10, 5], [13, 10], [17, 4], [13, 14]]
    assert r["prefill_tokens"].tolist() == [[160, 160], [0, 80], [48, 160], [64, 64], [0, 160]]
    assert r["cost"].tolist() == [[20, 20], [10, 10], [16, 20], [21, 8], [13, 24]]
    assert dep.requests.column("replica").to_pylist() == [0, 0, 0, 1, 0]


@pytest.mark.parametrize("router", [{"kind": "kv_aware"},
                                    {"kind": "session_affinity", "fallback": "kv_aware", "slack": 0}])
def test_quoted_answers_are_seen_in_the_caches(router):
    # A session's next turn repeats the previous turn's prompt and answer: the answer's blocks
    # enter the cache as output blocks, which the router must still name (looked up by key).
    trace = synth_trace(120, seed=5, rate=20.0, prompt="lognormal:120:0.4", output="fixed:64", turns=4,
                        think_time_s=0.05)
    eng = engine_config_from_dict({"num_gpu_blocks": 3000, "block_size": B, "max_num_seqs": 8,
                                   "time_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-5}})
    dep = deploy(trace, eng, {"replicas": 3, "router": router}, record_routing=True)
    seen, truth = dep.routing["overlap_blocks"], dep.routing["overlap_blocks_true"]
    assert np.array_equal(seen, truth)
    # Some decision saw a cached run longer than the turn's own earlier prompt: through an answer.
    prompt = trace.column("prompt_tokens").to_numpy()
    sess = trace.column("session_id").to_pylist()
    prev = {}
    through = 0
    for i, s in enumerate(sess):
        if s in prev:
            through += int(seen[i].max() * B > prompt[prev[s]])
        prev[s] = i
    assert through > 0
