"""CUDA-graph sizes and padding by release: one list for every step (0.31-0.33), prefill token sizes
and uniform decode request counts of their own (0.34), each derived by hand from vLLM's rules."""

import pytest

from aisim.config.versions import RELEASES, release
from aisim.perf.graphs import CUDAGRAPH_RULES, capture_sizes, decode_grid, graph_sizes, prefill_grid, step_graph

from helpers import run_log
from roofline_ref import step_s


def test_every_release_names_a_known_rule():
    assert {r.version: r.cudagraph_rule for r in RELEASES} == {
        "0.31.0": "shared", "0.32.0": "shared", "0.33.0": "shared", "0.34.0": "split"}
    assert {r.cudagraph_rule for r in RELEASES} <= set(CUDAGRAPH_RULES)


def test_spec_decode_sizes_under_both_rules():
    # max_num_seqs 4, two drafts (q = 3), H100.  _set_cudagraph_sizes: max = min(4 x 3 x 2, 512) = 24; the
    # grid 1, 2, 4, 8, 16, 24; request_counts(4) = 1, 2, 4 times q: 3, 6, 12.
    shared = [1, 2, 3, 4, 6, 8, 12, 16, 24]
    assert capture_sizes(4, 8192, 9, 2) == shared
    assert graph_sizes("shared", 4, 8192, 9, 2) == (shared, [], 3)
    # 0.34 _split_cudagraph_capture_sizes: request counts cdiv(s, 3) of those sizes, at most 4, with
    # cdiv(s, 3) x 3 <= 24: 1, 1, 1, 2, 2, 3, 4, 6 -> 4, 8 -> 4: {1, 2, 3, 4}; the limit min(4, 8192 // 3) = 4
    # keeps them all: decode graphs of 3, 6, 9, 12 tokens.  Prefill graphs: the shared sizes.
    g = graph_sizes("split", 4, 8192, 9, 2)
    assert g == (shared, [3, 6, 9, 12], 3)
    # A decode of three requests (9 tokens): 0.33 pads it to 12, 0.34 runs its 3-request graph; a mixed
    # step of 9 tokens pads to 12 under both; 13 tokens to 16.
    assert step_graph(9, True, graph_sizes("shared", 4, 8192, 9, 2)) == 12
    assert step_graph(9, True, g) == 9
    assert step_graph(9, False, g) == 12 and step_graph(13, True, g) == 16


def test_without_drafts_on_h100_the_rules_agree():
    # q = 1 off compute capability 10: the request counts are the sizes up to max_num_seqs (256 among them),
    # so a decode pads as before.
    g = graph_sizes("split", 256, 8192, 9)
    assert g.tokens == capture_sizes(256, 8192, 9)
    assert g.decode == [s for s in g.tokens if s <= 256] and len(g.decode) == 35
    assert all(step_graph(n, True, g) == step_graph(n, True, graph_sizes("shared", 256, 8192, 9))
               for n in range(1, 600))


def test_blackwell_grids_of_0_34():
    # compilation.py _walk_grid: each size the next multiple of the largest power of two not above step(size).
    # Prefill: step min(t, max(8, t / 4), 0.07 x max(t, 4096)): 1, 2, 4, every 8 to 64, then t / 4 -> 16: 80.
    assert prefill_grid(8192)[:12] == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80]
    assert len(prefill_grid(8192)) == 54 and prefill_grid(300)[-3:] == [224, 256, 300]
    # Decode: step 0.65 n^(2/3): 1 at n <= 5 (0.65 x 5^(2/3) = 1.90), 2 at 6 (2.14): 1..6, 8, 10, ...
    assert decode_grid(1024)[:9] == [1, 2, 3, 4, 5, 6, 8, 10, 12] and len(decode_grid(1024)) == 64
    g = graph_sizes("split", 256, 4096, 10)
    assert g.tokens == prefill_grid(4096) and g.decode == decode_grid(256)
    # A decode of 9 requests: 0.33 pads to 16 (the 8-stride grid), 0.34 to its 10-request graph.
    assert step_graph(9, True, graph_sizes("shared", 256, 4096, 10)) == 16 and step_graph(9, True, g) == 10


@pytest.mark.parametrize("version, rows", [("0.33.0", 16), ("0.34.0", 10)])
def test_the_core_pads_a_decode_by_its_release(version, rows):
    # Nine two-token prompts on a B200, then their decodes: the step of nine decodes runs 16 rows under 0.33
    # and 10 under 0.34, as the reference prices it from the same rule.
    tm = {"kind": "roofline", "gpu": "B200", "model": "llama-3.1-8b", "compute_efficiency": 0.5,
          "attention_efficiency": 0.25, "bandwidth_efficiency": 0.8, "overhead_s": 0.002, "overhead_per_req_s": 0.0,
          "executor_per_req_s": 0.0}
    eng = dict(num_gpu_blocks=2000, max_model_len=4096, max_num_batched_tokens=4096, block_size=16,
               vllm_version=version, async_scheduling=False, kv_cache_groups=[{"type": "full"}], time_model=tm)
    _, _, res = run_log(eng, [dict(id=f"r{i}", prompt=2, max_tokens=3, at=0) for i in range(9)])
    st = res.steps.to_pydict()
    decode = dict(zip(st["step"], st["duration_s"]))[1]
    keys = {k: tm[k] for k in tm if k not in ("kind", "gpu", "model")}
    assert step_graph(9, True, graph_sizes(release(version).cudagraph_rule, 256, 4096, 10)) == rows
    assert decode == pytest.approx(step_s("llama-3.1-8b", "B200", keys, [(1, 3, True)] * 9, version=version),
                                   rel=1e-12)
