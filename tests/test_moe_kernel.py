"""The routed experts' share of the matmul rate, from published fused-MoE kernel timings."""

import pytest

from aisim.config.catalog import get_model
from aisim.perf import moe_kernel
from aisim.perf.moe_kernel import KernelRun


def test_a_runs_share_is_its_flops_over_the_gpus_achievable_rate():
    # Mixtral-8x7B at TP 2 on an H100: 1,536 tokens, top 2, hidden 4,096, N 7,168 in 1,122.93 us;
    # 6 x 1536 x 2 x 4096 x 7168 = 541,165,879,296 FLOPs against the H100's measured 794.5 TFLOP/s.
    run = KernelRun("x", "H100", 8, 7168, 4096, 2, 1536, 1122.93)
    assert run.flops == 541_165_879_296
    assert moe_kernel.run_share(run) == pytest.approx(541_165_879_296 / 1122.93e-6 / 794.5e12, rel=1e-12)
    # The same run read against the FP8 rate (1,402.6 TFLOP/s measured).
    assert moe_kernel.run_share(run, "fp8") == pytest.approx(541_165_879_296 / 1122.93e-6 / 1402.6e12, rel=1e-12)


def _run_at(share: float, n: int) -> KernelRun:
    """A run on an H100 (794.5 TFLOP/s) that reaches ``share`` with ``n`` columns."""
    flops = 6.0 * 4096 * 8 * 2048 * n
    return KernelRun("x", "H100", 128, n, 2048, 8, 4096, flops / (share * 794.5e12) * 1e6)


def test_the_line_through_runs_on_it_is_found_exactly():
    # Shares 1 / (1.5 + 600 / N) at N = 200, 600, 2400: 1/3.0, 1/2.5, 1/1.75; least squares of 1/share on
    # 1/N passes through all three.
    runs = [_run_at(1.0 / (1.5 + 600.0 / n), n) for n in (200, 600, 2400)]
    a, b = moe_kernel._fit(runs)
    assert a == pytest.approx(1.5, rel=1e-9) and b == pytest.approx(600.0, rel=1e-9)


def test_the_line_off_the_runs_is_the_least_squares_one():
    # 1/share = 2, 3, 3 at 1/N = 0, 1/1000, 1/500 -> x = 0, 1, 2 (in 1/1000): mean x 1, mean y 8/3;
    # slope sum (x - 1)(y - 8/3) / sum (x - 1)^2 = (-1 x -2/3 + 0 + 1 x 1/3) / 2 = 1/2 per 1/1000 -> b 500;
    # a = 8/3 - 1/2 = 13/6.  (N = inf stands in for 1/N = 0 as N = 1e12.)
    runs = [_run_at(1 / 2, 10**12), _run_at(1 / 3, 1000), _run_at(1 / 3, 500)]
    a, b = moe_kernel._fit(runs)
    assert a == pytest.approx(13 / 6, rel=1e-6) and b == pytest.approx(500.0, rel=1e-6)


def test_the_share_halves_at_b_over_a_and_never_passes_the_rate(monkeypatch):
    monkeypatch.setattr(moe_kernel, "SHARE_A", 1.5)
    monkeypatch.setattr(moe_kernel, "SHARE_B", 600.0)
    assert moe_kernel.expert_share(400.0) == pytest.approx(1 / 3, rel=1e-12)     # (1/1.5) / 2
    assert moe_kernel.expert_share(1e9) == pytest.approx(1 / 1.5, rel=1e-6)
    monkeypatch.setattr(moe_kernel, "SHARE_A", 0.5)
    assert moe_kernel.expert_share(1e9) == 1.0


def test_the_shipped_line_is_fitted_on_the_bf16_runs():
    assert (moe_kernel.SHARE_A, moe_kernel.SHARE_B) == moe_kernel._fit(moe_kernel.KERNEL_RUNS)
    # Narrower slices run slower: the line's slope is positive and the shares fall with N.
    assert moe_kernel.SHARE_B > 0
    shares = [moe_kernel.expert_share(n) for n in (96, 192, 768, 7168)]
    assert shares == sorted(shares) and 0 < shares[0] and shares[-1] <= 1


@pytest.mark.parametrize("model, tp, n", [
    ("qwen3-30b-a3b", 1, 768),          # moe_intermediate_size 768
    ("qwen3-235b-a22b", 8, 192),        # 1,536 / 8
    ("deepseek-r1", 8, 256),            # 2,048 / 8
    ("glm-4.6", 8, 192),                # 1,536 / 8
])
def test_the_kernels_columns_are_one_experts_intermediate_size_a_gpu(model, tp, n):
    assert moe_kernel.expert_columns(get_model(model), tp) == pytest.approx(n, rel=1e-12)


def test_the_published_fp8_runs_reach_less_than_the_bf16_line():
    # Both at N 768, 4,096 tokens, top 8, hidden 2,048: 309,237,645,312 FLOPs.  Qwen3-30B-A3B on an H100
    # in 1,647.57 us against its measured FP8 rate 1,402.6 TFLOP/s: 0.134; Qwen3-VL-30B-A3B on an L40S in
    # 1,846.43 us against its datasheet FP8 peak 733 TFLOP/s: 0.228.
    h100, l40s = moe_kernel.FP8_KERNEL_RUNS
    assert h100.flops == l40s.flops == 309_237_645_312
    assert moe_kernel.run_share(h100, "fp8") == pytest.approx(309_237_645_312 / 1647.57e-6 / 1402.6e12, rel=1e-12)
    assert moe_kernel.run_share(l40s, "fp8") == pytest.approx(309_237_645_312 / 1846.43e-6 / 733e12, rel=1e-12)
    assert all(moe_kernel.run_share(r, "fp8") < moe_kernel.expert_share(r.n) for r in (h100, l40s))


def test_fp8_products_run_at_the_fp8_runs_mean_share_of_the_bf16_line():
    # Both FP8 runs sit at N 768, so the FP8 share there is their geometric mean: sqrt(0.134 x 0.228).
    r1 = 309_237_645_312 / 1647.57e-6 / 1402.6e12
    r2 = 309_237_645_312 / 1846.43e-6 / 733e12
    assert moe_kernel.expert_share(768, fp8=True) == pytest.approx((r1 * r2) ** 0.5, rel=1e-12)
    assert moe_kernel.FP8_FACTOR == pytest.approx((r1 * r2) ** 0.5 / moe_kernel.expert_share(768), rel=1e-12)
    assert moe_kernel.expert_share(192, fp8=True) == pytest.approx(moe_kernel.FP8_FACTOR * moe_kernel.expert_share(192))


def test_a_decode_runs_read_share_is_its_touched_experts_bytes_over_peak_bandwidth():
    # Mixtral-8x7B at TP 2 on an H100, BF16, 64 tokens picking 2 of 8 experts: all 8 touched but for
    # 8 x (3/4)^64 = 8.0e-8; each expert 3 x 4,096 x 7,168 x 2 B = 176,160,768 B, 1,409,286,144 B in all,
    # read in 483.14 us: 2.917 TB/s, 0.871 of the H100's 3.35 TB/s.
    mixtral = moe_kernel.DECODE_KERNEL_RUNS[0]
    assert moe_kernel.touched_experts(8, 2, 64) == pytest.approx(8 - 8 * 0.75**64, rel=1e-15)
    assert moe_kernel.run_read_share(mixtral, 2) == pytest.approx(
        8 * (1 - 0.75**64) * 176_160_768 / 483.14e-6 / 3.35e12, rel=1e-12)
    assert moe_kernel.run_read_share(mixtral, 2) == pytest.approx(0.8707, rel=1e-4)
    # Qwen3-30B-A3B with FP8 weights, 128 tokens picking 8 of 128: 128 (1 - (15/16)^128) = 127.967 experts of
    # 3 x 2,048 x 768 x 1 B = 4,718,592 B, 603.8 MB in 273.72 us: 2.206 TB/s, 0.659.
    qwen = moe_kernel.FP8_DECODE_KERNEL_RUNS[2]
    assert moe_kernel.touched_experts(128, 8, 128) == pytest.approx(127.9669, rel=1e-6)
    assert moe_kernel.run_read_share(qwen, 1) == pytest.approx(0.6585, rel=1e-3)


def test_the_kernel_reads_at_its_decode_runs_mean_share_by_dtype():
    # Geometric means over the three runs of each kind (64, 96 and 128 tokens): BF16 0.871, 0.851, 0.856
    # -> 0.859; FP8 0.675, 0.664, 0.659 -> 0.666.
    assert moe_kernel.READ_SHARE == pytest.approx(0.8592, rel=1e-3)
    assert moe_kernel.FP8_READ_SHARE == pytest.approx(0.6659, rel=1e-3)
    from aisim.config.catalog import get_gpu

    assert moe_kernel.expert_kernel(get_model("deepseek-r1"), 8, get_gpu("H200"), "fp8").read_share == \
        moe_kernel.FP8_READ_SHARE
    assert moe_kernel.expert_kernel(get_model("qwen3-30b-a3b"), 1, get_gpu("H100"), "bf16").read_share == \
        moe_kernel.READ_SHARE
    # FP8 weights on a GPU without FP8 tensor cores run the BF16 kernel (weights widened): its read share.
    assert moe_kernel.expert_kernel(get_model("deepseek-r1"), 8, get_gpu("A100-80GB"), "fp8").read_share == \
        moe_kernel.READ_SHARE


class R1_ON_8_H200:
    """DeepSeek-R1 on 8 x H200 at the defaults' constants, as roofline_args reads a time model."""
    model, gpu, tp, dtype = "deepseek-r1", "H200", 8, "fp8"
    compute_efficiency, attention_efficiency, bandwidth_efficiency = 0.67, 0.79, 0.89
    overhead_s, overhead_per_req_s, executor_per_req_s, layer_overhead_s = 0.0021, 5.4e-5, 1.2e-4, 0.0
    triton_group_quant = False


def test_a_deepseek_r1_decode_steps_experts_on_8_h200():
    # 50 decodes on 8 x H200: 256 (1 - (31/32)^50) = 203.66 of a layer's 256 experts touched; one expert is
    # 3 x 7,168 x 2,048 FP8 weights, an eighth of them on each GPU, over 58 MoE layers: 319,291,392 B, so
    # 65.03 GB a step, read at 0.666 of 4.8 TB/s (3.196 TB/s): 20.35 ms (15.23 ms at the dense products'
    # 0.89).  Their FLOPs (a graph of 56 rows, 5.11 GFLOP a row at 0.102 of 1,453.4 TFLOP/s: 1.94 ms) stay
    # under the reads.
    from aisim.config.catalog import get_gpu
    from aisim.perf.roofline import roofline_args

    a = roofline_args(R1_ON_8_H200)
    assert a["moe_expert_bytes"] == 58 * 3 * 7168 * 2048 / 8 == 319_291_392
    assert a["expert_bytes_rate"] == pytest.approx(4.8e12 * moe_kernel.FP8_READ_SHARE, rel=1e-15)
    touched = 256 * (1 - (31 / 32) ** 50)
    assert touched == pytest.approx(203.66, rel=1e-4)
    reads = touched * 319_291_392 / a["expert_bytes_rate"]
    assert reads == pytest.approx(20.35e-3, rel=1e-3)
    assert a["expert_flops_per_token"] * 56 / a["expert_rate"] == pytest.approx(1.94e-3, rel=1e-2)
    assert get_gpu("H200").hbm_bytes_per_s == 4.8e12


def test_a_deepseek_r1_prefill_chunks_experts_on_8_h200():
    # A chunk of 8,192 prompt tokens on 8 x H200: every expert touched (256 (1 - (31/32)^8192) = 256 to 1e-110);
    # each token 2 x 8 experts x 3 x 7,168 x 2,048 weights / 8 GPUs x 58 MoE layers = 5,108,662,272 FLOPs, so
    # 4.185e13 a chunk at the line's FP8 share at N 256, 0.1017 of 1,453.4 TFLOP/s (147.8 TFLOP/s): 283.1 ms,
    # over the reads (256 x 319,291,392 B at 0.666 of 4.8 TB/s: 25.6 ms).  Half the step of 430 ms.
    from aisim.perf.roofline import roofline_args

    a = roofline_args(R1_ON_8_H200)
    assert a["expert_flops_per_token"] == 2 * 8 * 3 * 7168 * 2048 / 8 * 58 == 5_108_662_272
    share = moe_kernel.expert_share(256, fp8=True)
    assert share == pytest.approx(0.1017, rel=1e-3)
    assert a["expert_rate"] == pytest.approx(1453.4e12 * share, rel=1e-12)
    flops_s = 8192 * 5_108_662_272 / a["expert_rate"]
    assert flops_s == pytest.approx(283.1e-3, rel=1e-3)
    reads_s = 256 * 319_291_392 / a["expert_bytes_rate"]
    assert reads_s == pytest.approx(25.6e-3, rel=1e-2) and reads_s < flops_s
