"""Dense products of a block-FP8 checkpoint on Hopper, from published timings of vLLM's CUTLASS kernel."""

import math

import pytest

from aisim.config.catalog import get_gpu, get_model
from aisim.perf import block_fp8
from aisim.perf.block_fp8 import GemmRun

from helpers import run_log
from roofline_ref import gemm_s, step_s, walk_s

# The persistent runs' blocks walked (K / 128) and microseconds at 64 rows:
#   K 4,096 -> 32: 30.912; 7,168 -> 56: 45.696; 16,384 -> 128: 91.040; 18,432 -> 144: 100.704;
#   1,536 -> 12: 14.592; 2,304 -> 18: 18.720; 16,384 -> 128: 76.448.
# Mean x 518 / 7 = 74, mean y 378.112 / 7 = 54.016; sum (x - 74)^2 = 1764 + 324 + 2916 + 4900 + 3844 + 3136
# + 2916 = 19,800; sum (x - 74)(y - 54.016) = 970.368 + 149.76 + 1999.296 + 3268.16 + 2444.288 + 1976.576
# + 1211.328 = 12,019.776.  Slope 12,019.776 / 19,800 = 0.607059 us a block, intercept 54.016 - 74 x that
# = 9.093605 us.
PER_BLOCK_US = 12019.776 / 19800
FIXED_US = 378.112 / 7 - 74 * PER_BLOCK_US
WALK_7168_US = FIXED_US + 56 * PER_BLOCK_US     # 43.08893


def test_the_line_is_the_least_squares_line_of_the_persistent_runs():
    assert block_fp8.WALK_PER_BLOCK_S == pytest.approx(PER_BLOCK_US * 1e-6, rel=1e-12)
    assert block_fp8.WALK_FIXED_S == pytest.approx(FIXED_US * 1e-6, rel=1e-12)
    assert FIXED_US == pytest.approx(9.093605, rel=1e-6) and PER_BLOCK_US == pytest.approx(0.607059, rel=1e-6)
    # Runs on a line are found exactly: 5 us plus 0.5 us a block.
    runs = [GemmRun("x", 7168, k, 64, 5 + 0.5 * k / 128) for k in (512, 2048, 8192)]
    fixed, per_block = block_fp8._line(runs)
    assert fixed == pytest.approx(5e-6, rel=1e-9) and per_block == pytest.approx(0.5e-6, rel=1e-9)


def test_stream_k_takes_the_runs_mean_share_of_the_line():
    # Both Stream-K runs walk K 7,168 (56 blocks: 43.08893 us on the line): 27.776 / 43.08893 = 0.64462 and
    # 20.864 / 43.08893 = 0.48421, geometric mean sqrt(27.776 x 20.864) / 43.08893 = 0.558686.
    assert WALK_7168_US == pytest.approx(43.08893, rel=1e-6)
    assert block_fp8.STREAM_K_FACTOR == pytest.approx(math.sqrt(27.776 * 20.864) / WALK_7168_US, rel=1e-12)
    assert block_fp8.STREAM_K_FACTOR == pytest.approx(0.558686, rel=1e-5)


def test_vllm_picks_cutlass_for_multiples_of_128_and_stream_k_for_k_over_3n():
    # DeepSeek-R1 at TP 8: q_a 1,536 x 7,168 and the shared experts' gate/up 512 x 7,168 (K > 3N): Stream-K;
    # q_b 3,072 x 1,536, o 7,168 x 2,048: persistent; kv_a's 576 columns are no multiple of 128: Triton.
    assert block_fp8.stream_k(1536, 7168) and block_fp8.stream_k(512, 7168)
    assert not block_fp8.stream_k(3072, 1536) and not block_fp8.stream_k(7168, 2048)
    assert not block_fp8.cutlass(576, 7168) and not block_fp8.stream_k(576, 7168)
    assert not block_fp8.stream_k(4608, 7168)    # 7,168 <= 3 x 4,608


def test_one_products_time_on_an_h200():
    # DeepSeek-R1's q_b at TP 8 on an H200, a CUDA graph of 56 rows: 1 x 24 tiles (< 132 SMs), persistent,
    # 12 blocks: 9.093605 + 12 x 0.607059 = 16.378 us, where the roofline's price is 1.24 us: its tiles' FLOPs
    # (24 x 2 x 128^2 x 1,536) at 0.67 of 1,453.4 TFLOP/s, over its bytes (4.72 MB of FP8 weights and 0.52 MB
    # of activations, 1.23 us at 0.89 of 4.8 TB/s).
    walk, factor = 12 * PER_BLOCK_US * 1e-6, 1.0
    assert block_fp8.walk_seconds(1536) == pytest.approx((FIXED_US + 12 * PER_BLOCK_US) * 1e-6, rel=1e-12)
    assert walk_s(56, 3072, 132, walk, factor) == pytest.approx(16.378e-6, rel=1e-4)
    roof = gemm_s(56, 3072, 1536, 132, 1453.4e12 * 0.67, 4.8e12 * 0.89, 1)
    assert roof == pytest.approx(24 * 2 * 128**2 * 1536 / (1453.4e12 * 0.67), rel=1e-12)
    assert roof == pytest.approx(1.24e-6, rel=1e-2)
    walked = gemm_s(56, 3072, 1536, 132, 1453.4e12 * 0.67, 4.8e12 * 0.89, 1, walk=walk)
    assert walked == pytest.approx(16.378e-6, rel=1e-4)
    # A prefill of 4,096 rows: 32 x 24 = 768 tiles, 6 waves, the fixed part once: 9.0936 + 6 x 7.2847 = 52.80 us
    # (SGLang pull request 5820 timed this product at 4,096 rows at 53.02 us).
    assert walk_s(4096, 3072, 132, walk, factor) == pytest.approx(52.80e-6, rel=1e-3)
    assert walk_s(4096, 3072, 132, walk, factor) == pytest.approx(
        (FIXED_US + 6 * 12 * PER_BLOCK_US) * 1e-6, rel=1e-12)


def _r1_walk_us():
    # One decode step of DeepSeek-R1 on 8 x H200 (one row of tiles, every grid under 132 SMs), per layer:
    # q_a (Stream-K) 0.558686 x 43.08893 = 24.0732; kv_a (Triton, K 7,168) 43.0889; q_b 16.3783;
    # o (16 blocks) 9.093605 + 9.712950 = 18.8066 -> 102.3470 us in each of 61 layers;
    # shared gate/up (Stream-K) 24.0732 + shared down (2 blocks) 10.3078 = 34.3810 us in 58 MoE layers;
    # dense gate/up (4,608 x 7,168: persistent) 43.0889 + down (18 blocks) 20.0207 = 63.1096 us in 3 layers.
    skf = math.sqrt(27.776 * 20.864) / WALK_7168_US
    attn = skf * WALK_7168_US + WALK_7168_US + (FIXED_US + 12 * PER_BLOCK_US) + (FIXED_US + 16 * PER_BLOCK_US)
    shared = skf * WALK_7168_US + FIXED_US + 2 * PER_BLOCK_US
    dense = WALK_7168_US + FIXED_US + 18 * PER_BLOCK_US
    return 61 * attn + 58 * shared + 3 * dense


def test_a_deepseek_r1_decode_steps_block_fp8_products_on_8_h200():
    # 61 x 102.3470 + 58 x 34.3810 + 3 x 63.1096 = 6,243.17 + 1,994.10 + 189.33 = 8,426.6 us.
    assert _r1_walk_us() == pytest.approx(8426.6, rel=1e-4)
    model, gpu = get_model("deepseek-r1"), get_gpu("H200")
    assert model.weight_block == 128 and block_fp8.applies(model, gpu, "fp8")
    walks = block_fp8.gemm_walks(model, gpu, 8, "fp8")
    total = sum(g.count * walk_s(56, g.shape(8)[0], 132, *w) for g, w in zip(model.gemms, walks))
    assert total == pytest.approx(_r1_walk_us() * 1e-6, rel=1e-12)
    # The router, kv_b (BF16 in its decode form) and the LM head are left to the roofline.
    assert {g.name for g, w in zip(model.gemms, walks) if w[0] == 0} == {"router", "kv_b", "lm_head"}
    # Not on an A100 or a B200, nor served in BF16, nor a checkpoint without blocks.
    assert not block_fp8.applies(model, get_gpu("A100-80GB"), "fp8")
    assert not block_fp8.applies(model, get_gpu("B200"), "fp8")
    assert not block_fp8.applies(model, gpu, "bf16")
    assert not block_fp8.applies(get_model("qwen3-30b-a3b"), gpu, "fp8")


def test_the_core_prices_r1s_decode_with_the_walk(monkeypatch):
    # One request on 8 x H200: its decode step (graph of 1 row) is the reference's, and differs from the
    # model without the walk by the walk's 8.4266 ms less the roofline's price of the same products.
    eff = {"compute_efficiency": 0.67, "attention_efficiency": 0.79, "bandwidth_efficiency": 0.89,
           "overhead_s": 0.002, "overhead_per_req_s": 0.0, "executor_per_req_s": 0.0}
    tm = {"kind": "roofline", "gpu": "H200", "model": "deepseek-r1", "tp": 8, **eff}
    eng = dict(num_gpu_blocks=200, max_model_len=4096, max_num_batched_tokens=4096, time_model=tm)

    def decode_s():
        _, _, res = run_log(eng, [dict(id="a", prompt=100, max_tokens=2, at=0)])
        st = res.steps.to_pydict()
        return dict(zip(st["step"], st["duration_s"]))[1]

    with_walk = decode_s()
    assert with_walk == pytest.approx(step_s("deepseek-r1", "H200", dict(eff, tp=8), [(1, 101, True)]), rel=1e-9)
    monkeypatch.setattr("aisim.perf.roofline.gemm_walks", lambda m, g, tp, d: [(0.0, 1.0)] * len(m.gemms))
    without = decode_s()
    model = get_model("deepseek-r1")
    roof = sum(g.count * gemm_s(1, *g.shape(8), 132, 1453.4e12 * 0.67, 4.8e12 * 0.89, 1)
               for g in model.gemms if g.name not in block_fp8.UNQUANTIZED)
    assert with_walk - without == pytest.approx(_r1_walk_us() * 1e-6 - roof, rel=1e-6)


# SGLang pull request 4396's Triton per-token-group runs at 7,168 columns, tokens and us:
#   64: 10.656, 128: 14.656, 256: 20.160001, 512: 31.808, 1024: 55.071998, 2048: 101.824.
# Mean tokens 672; sum (t - 672)^2 = 369,664 + 295,936 + 173,056 + 25,600 + 123,904 + 1,893,376 = 2,881,536;
# mean us 234.175999 / 6 = 39.029333; sum (t - 672)(us - 39.029333) = 131,567.57 -> 0.0456588 us a token,
# 6.3698 ps an element (7,168 a token); intercept 39.029333 - 672 x 0.0456588 = 8.3466 us.
QUANT_US_PER_TOKEN = 131567.57 / 2881536


def test_the_triton_quantization_is_the_least_squares_line_of_its_runs():
    assert block_fp8.QUANT_S_PER_ELEMENT == pytest.approx(QUANT_US_PER_TOKEN * 1e-6 / 7168, rel=1e-6)
    assert block_fp8.QUANT_S_PER_ELEMENT == pytest.approx(6.3698e-12, rel=1e-4)
    assert block_fp8.QUANT_FIXED_S == pytest.approx(8.3466e-6, rel=1e-4)


def test_deepseek_r1s_tokens_quantize_their_block_fp8_inputs_on_8_h200():
    # A token at TP 8: q_a 7,168 + kv_a 7,168 + q_b 1,536 + o 2,048 = 17,920 in 61 layers (1,093,120); the first 3
    # layers' MLP 7,168 + 2,304 (28,416); the shared expert 7,168 + 256 in 58 (430,592); the routed experts' hidden
    # state 7,168 and 8 slices of 256 in 58 (534,528): 2,086,656 elements, 13.292 us a token at 6.3698 ps, 108.9 ms
    # an 8,192-token chunk.  Not the router, kv_b nor the LM head (BF16, or kv_b's prefill form left out).
    model, gpu = get_model("deepseek-r1"), get_gpu("H200")
    assert block_fp8.quant_elements(model, 8) == 61 * 17920 + 3 * 9472 + 58 * 7424 + 58 * (7168 + 8 * 256) == 2_086_656
    per_token = block_fp8.quant_seconds_per_token(model, gpu, 8, "fp8", True)
    assert per_token == pytest.approx(2_086_656 * QUANT_US_PER_TOKEN * 1e-6 / 7168, rel=1e-6)
    assert per_token * 8192 == pytest.approx(108.9e-3, rel=1e-3)
    # Off by default (vLLM 0.11 and later run a CUDA kernel), and only where the block-FP8 kernel runs.
    assert block_fp8.quant_seconds_per_token(model, gpu, 8, "fp8", False) == 0.0
    assert block_fp8.quant_seconds_per_token(model, get_gpu("B200"), 8, "fp8", True) == 0.0
    assert block_fp8.quant_seconds_per_token(model, gpu, 8, "bf16", True) == 0.0


def test_the_core_adds_the_triton_quantization_per_padded_token():
    # One request on 8 x H200: its decode step (a graph of 1 row) takes 13.292 us more with the Triton kernel,
    # and both steps are the reference's.
    eff = {"compute_efficiency": 0.67, "attention_efficiency": 0.79, "bandwidth_efficiency": 0.89,
           "overhead_s": 0.002, "overhead_per_req_s": 0.0, "executor_per_req_s": 0.0}

    def decode_s(triton):
        tm = {"kind": "roofline", "gpu": "H200", "model": "deepseek-r1", "tp": 8, "triton_group_quant": triton, **eff}
        eng = dict(num_gpu_blocks=200, max_model_len=4096, max_num_batched_tokens=4096, time_model=tm)
        _, _, res = run_log(eng, [dict(id="a", prompt=100, max_tokens=2, at=0)])
        st = res.steps.to_pydict()
        return dict(zip(st["step"], st["duration_s"]))[1]

    on, off = decode_s(True), decode_s(False)
    assert on - off == pytest.approx(2_086_656 * QUANT_US_PER_TOKEN * 1e-6 / 7168, rel=1e-6)
    ref = dict(eff, tp=8, triton_group_quant=True)
    assert on == pytest.approx(step_s("deepseek-r1", "H200", ref, [(1, 101, True)]), rel=1e-9)


def test_the_triton_quantization_key_is_a_roofline_switch():
    from aisim.config.engine import engine_config_from_dict
    from aisim.errors import ConfigError

    tm = {"kind": "roofline", "gpu": "H200", "model": "deepseek-r1", "tp": 8}
    eng = dict(num_gpu_blocks=200, max_model_len=4096)
    assert engine_config_from_dict(dict(eng, time_model=tm)).time_model.triton_group_quant is False
    cfg = engine_config_from_dict(dict(eng, time_model=dict(tm, triton_group_quant=True)))
    assert cfg.time_model.triton_group_quant is True and cfg.time_model.relevant()["triton_group_quant"] is True
    assert "triton_group_quant" not in engine_config_from_dict(dict(eng, time_model=tm)).time_model.relevant()
    with pytest.raises(ConfigError, match="'time_model.triton_group_quant' must be true or false, got 1"):
        engine_config_from_dict(dict(eng, time_model=dict(tm, triton_group_quant=1)))
