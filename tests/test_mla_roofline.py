"""MLA in the roofline: the decode form over the latent, the prefill form over up-projected heads.

A small DeepSeek-V3-style model (its config.json below, MLA without a query down-projection, no
routed experts) on one H100, every step time derived by hand from the config numbers.
"""

import json

import pytest

from helpers import run_log
from roofline_ref import step_s

# hidden 1024, 4 layers, 8 heads; latent kv_lora_rank 256 + rope 32; per head nope 64, v 64; MLP 2048.
MLA_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 2048,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8, "kv_lora_rank": 256,
    "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64, "vocab_size": 32000,
    "tie_word_embeddings": False,
}
# Per layer, split by TP: q 1024 x 8 x (64 + 32) = 786,432; kv_b_proj 256 x 8 x (64 + 64) = 262,144;
# o 8 x 64 x 1024 = 524,288; MLP 3 x 1024 x 2048 = 6,291,456: 7,864,320.  Held whole: kv_a 1024 x 288.
DENSE = 4 * 7_864_320                              # 31,457,280
WHOLE = 4 * 1024 * 288                             # 1,179,648
HEAD = 32000 * 1024                                # 32,768,000
FLOPS_TOKEN = 2 * (DENSE + WHOLE)                  # 65,273,856 (kv_b_proj of the token's own latent included)
FLOPS_REQ = 2 * HEAD                               # 65,536,000: the LM head on one position
WEIGHTS = (DENSE + WHOLE + HEAD) * 2               # 130,809,856 bytes, bf16
# A pair (new token, key), 8 heads, 4 layers.  Decode form, absorbed: QK over 256 + 32, PV over 256.
PAIR_DECODE = 2 * (288 + 256) * 8 * 4              # 34,816
# Prefill form, multi-head: QK over 64 + 32, PV over 64.
PAIR_PREFILL = 2 * (96 + 64) * 8 * 4               # 10,240
# A cached context token of a prefill-form request: its latent through kv_b_proj, 256 -> 8 x (64 + 64).
CTX = 2 * 256 * 128 * 8 * 4                        # 2,097,152
KV = 288 * 2 * 4                                   # 2,304 latent bytes a token over the 4 layers

# An H100's achievable BF16 matmul rate (794.5 TFLOP/s) at half, attention at a quarter; 3.35 TB/s at 80 %.
MATMUL, ATTN, HBM = 794.5e12 * 0.5, 794.5e12 * 0.25, 3.35e12 * 0.8


@pytest.fixture
def mla_model(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MLA_CONFIG))
    return str(path)


def _engine(model, tokens=4096, **tm):
    return dict(num_gpu_blocks=2000, max_model_len=4096, max_num_batched_tokens=tokens,
                time_model={"kind": "roofline", "gpu": "H100", "model": model, "compute_efficiency": 0.5,
                            "attention_efficiency": 0.25, "bandwidth_efficiency": 0.8, "overhead_s": 0.002,
                            "overhead_per_req_s": 0.0, "executor_per_req_s": 0.0, **tm})


def _durations(result):
    st = result.steps.to_pydict()
    return dict(zip(st["step"], st["duration_s"]))


def test_mla_coefficients_from_the_config(mla_model):
    from aisim.config.catalog import get_gpu, get_model
    from aisim.perf.roofline import roofline_terms

    t = roofline_terms(get_model(mla_model), get_gpu("H100"), 1, "bf16")
    assert t["attn_flops"] == [PAIR_DECODE] and t["attn_flops_prefill"] == [PAIR_PREFILL]
    assert t["ctx_flops"] == CTX and t["kv_bytes"] == [KV] and t["flops_per_token"] == FLOPS_TOKEN
    # deepseek-r1 on 8 x H200: 16 heads a GPU, 61 layers; prefill QK 128 + 64 and PV 128 (3.4x fewer FLOPs
    # a pair than the absorbed 576 + 512); the context up-projected 512 -> 16 x (128 + 128).
    r1 = roofline_terms(get_model("deepseek-r1"), get_gpu("H200"), 8, "fp8")
    assert r1["attn_flops_prefill"] == [2 * (192 + 128) * 16 * 61]
    assert r1["ctx_flops"] == 2 * 512 * 16 * 256 * 61


EFF = {"compute_efficiency": 0.5, "attention_efficiency": 0.25, "bandwidth_efficiency": 0.8, "overhead_s": 0.002,
       "overhead_per_req_s": 0.0, "executor_per_req_s": 0.0}


def _ref(model, batch, tokens=4096, max_num_seqs=256, **tm):
    return step_s(model, "H100", dict(EFF, **tm), batch, max_num_seqs=max_num_seqs, max_num_batched_tokens=tokens)


def test_mla_prefill_chunk_without_context(mla_model):
    # One 1,000-token prompt: positions 1..1000 attend to 500,500 keys in the prefill form, nothing cached:
    # 10,240 x 500,500 / 198.6 TFLOP/s = 25.8 us of attention.
    _, _, res = run_log(_engine(mla_model), [dict(id="a", prompt=1000, max_tokens=2, at=0)])
    assert PAIR_PREFILL * 500_500 / ATTN == pytest.approx(25.80e-6, rel=1e-3)
    assert _durations(res)[0] == pytest.approx(_ref(mla_model, [(1000, 1000, False)]), rel=1e-9)


def test_mla_decode_step_is_absorbed(mla_model):
    # Step 1 decodes one token at context 1,001 in the absorbed form.  Attention at 1e-4 of the matmul
    # rate (79.45 GFLOP/s) makes the decode kernel bound by its FLOPs: 34,816 x 1,001 / 79.45e9 = 439 us
    # in place of reading 2,304 B x 1,001 at 2.68 TB/s.
    _, _, res = run_log(_engine(mla_model, attention_efficiency=1e-4), [dict(id="a", prompt=1000, max_tokens=2,
                                                                            at=0)])
    slow = PAIR_DECODE * 1001 / (794.5e12 * 1e-4)
    assert slow == pytest.approx(438.6e-6, rel=1e-3)
    d = _durations(res)[1]
    assert d == pytest.approx(_ref(mla_model, [(1, 1001, True)], attention_efficiency=1e-4), rel=1e-9)
    assert d - _ref(mla_model, [(1, 1001, True)]) == pytest.approx(slow - KV * 1001 / HBM, rel=1e-6)


def test_mla_chunk_with_cached_context_up_projects_it(mla_model):
    # A 1,500-token prompt in chunks of 1,000: step 1 runs the last 500 (positions 1001..1500: (1001 + 1500)
    # x 500 / 2 = 625,250 pairs) and up-projects the 1,000 tokens of the first chunk: 2,097,152 x 1,000
    # FLOPs at 397.25 TFLOP/s, 5.28 us.
    _, _, res = run_log(_engine(mla_model, tokens=1000), [dict(id="a", prompt=1500, max_tokens=2, at=0)])
    d = _durations(res)
    assert CTX * 1000 / MATMUL == pytest.approx(5.279e-6, rel=1e-3)
    assert d[0] == pytest.approx(_ref(mla_model, [(1000, 1000, False)], tokens=1000), rel=1e-9)
    assert d[1] == pytest.approx(_ref(mla_model, [(500, 1500, False)], tokens=1000), rel=1e-9)


def test_mla_mixed_batch_prices_each_request_in_its_form(mla_model):
    # Budget 600: step 0 runs a's 100-token prompt and the first 500 of b's 1,000; step 1 decodes a (one token
    # at context 101, absorbed) beside b's last 500 (positions 501..1000: 375,250 pairs, prefill form, its 500
    # cached tokens up-projected).
    reqs = [dict(id="a", prompt=100, max_tokens=3, at=0), dict(id="b", prompt=1000, max_tokens=2, at=0)]
    steps, _, res = run_log(_engine(mla_model, tokens=600), reqs)
    d = _durations(res)
    assert d[0] == pytest.approx(_ref(mla_model, [(100, 100, False), (500, 500, False)], tokens=600), rel=1e-9)
    assert d[1] == pytest.approx(_ref(mla_model, [(1, 101, True), (500, 1000, False)], tokens=600), rel=1e-9)


def test_one_token_chunk_runs_in_the_decode_form(mla_model):
    # vLLM splits by query length alone: with a budget of 101, step 0 runs a's 100-token prompt and one token of
    # b's, a prefill chunk of one token, in the absorbed form (one pair at position 1) and up-projects nothing.
    reqs = [dict(id="a", prompt=100, max_tokens=2, at=0), dict(id="b", prompt=50, max_tokens=2, at=0)]
    _, _, res = run_log(dict(_engine(mla_model, tokens=101, attention_efficiency=1e-4), max_num_seqs=16), reqs)
    want = _ref(mla_model, [(100, 100, False), (1, 1, False)], tokens=101, max_num_seqs=16, attention_efficiency=1e-4)
    assert _durations(res)[0] == pytest.approx(want, rel=1e-9)


def test_non_mla_model_has_one_form():
    # llama-3.1-8b: the prefill form is the decode form and nothing is up-projected, so the core runs the
    # one-form arithmetic; a mixed step (a decode at context 101 beside a 500-token chunk at 1,000) costs
    # what one count a pair gives.
    from aisim.config.catalog import get_gpu, get_model
    from aisim.perf.roofline import roofline_terms

    t = roofline_terms(get_model("llama-3.1-8b"), get_gpu("H100"), 1, "bf16")
    assert t["attn_flops_prefill"] == t["attn_flops"] == [2 * 256 * 32 * 32] and t["ctx_flops"] == 0.0
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    dense, head, pair = 32 * layer, 128256 * 4096, 2 * 256 * 32 * 32
    reqs = [dict(id="a", prompt=100, max_tokens=3, at=0), dict(id="b", prompt=1000, max_tokens=2, at=0)]
    _, _, res = run_log(_engine("llama-3.1-8b", tokens=600), reqs)
    assert _durations(res)[1] == pytest.approx(_ref("llama-3.1-8b", [(1, 101, True), (500, 1000, False)], tokens=600),
                                               rel=1e-9)
    assert (dense, head, pair) == (6_979_321_856, 525_336_576, 524_288)
