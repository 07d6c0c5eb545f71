"""Step-time models against hand-computed step times."""

import pytest

from aisim.errors import ConfigError, ReplayError

from helpers import run_log
from roofline_ref import gemm_s, pairs, step_s


def _durations(result):
    st = result.steps.to_pydict()
    return dict(zip(st["step"], st["duration_s"]))


def test_linear_model():
    eng = dict(num_gpu_blocks=200, max_model_len=4096,
               time_model={"base_s": 0.005, "per_token_s": 2e-5, "per_req_s": 1e-4})
    _, _, res = run_log(eng, [dict(id="a", prompt=100, max_tokens=2, at=0)])
    d = _durations(res)
    assert d[0] == pytest.approx(0.005 + 2e-5 * 100 + 1e-4)
    assert d[1] == pytest.approx(0.005 + 2e-5 * 1 + 1e-4)


# Hand counts of llama-3.1-8b (config.json: hidden 4096, 32 layers, 32 heads, 8 KV heads of 128,
# MLP 14336, vocabulary 128256, untied): per layer q and o 4096 x 4096 each, k and v 4096 x 1024 each,
# MLP 3 x 4096 x 14336.
LLAMA_LAYER = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336      # 218,103,808
LLAMA_DENSE = 32 * LLAMA_LAYER                                           # 6,979,321,856
LLAMA_HEAD = 128256 * 4096                                               # 525,336,576
LLAMA_PAIR = 2 * (128 + 128) * 32 * 32     # FLOPs per (new token, key) pair: QK and PV, 32 heads, 32 layers
LLAMA_KV = 2 * 8 * 128 * 2 * 32            # K and V bytes of one token: 8 heads x 128, bf16, 32 layers


def _roofline(model, gpu="H100", **tm):
    return {"kind": "roofline", "gpu": gpu, "model": model, "compute_efficiency": 0.5, "attention_efficiency": 0.25,
            "bandwidth_efficiency": 0.8, "overhead_s": 0.002, "overhead_per_req_s": 0.0,
            "executor_per_req_s": 0.0, **tm}


# An H100's achievable BF16 matmul rate (794.5 TFLOP/s measured, of 989 on the datasheet): matrix products at
# half of it, attention at a quarter; 3.35 TB/s of HBM at 80 %.
MATMUL, ATTN, HBM = 794.5e12 * 0.5, 794.5e12 * 0.25, 3.35e12 * 0.8


EFF = {"compute_efficiency": 0.5, "attention_efficiency": 0.25, "bandwidth_efficiency": 0.8, "overhead_s": 0.002,
       "overhead_per_req_s": 0.0, "executor_per_req_s": 0.0}


def _ref(model, batch, gpu="H100", **tm):
    return step_s(model, gpu, dict(EFF, **tm), batch)


def test_roofline_dense_prefill_is_compute_bound_and_decode_memory_bound():
    # llama-3.1-8b on one H100, CPU 2 ms a step.
    eng = dict(num_gpu_blocks=2000, max_model_len=4096, max_num_batched_tokens=4096,
               time_model=_roofline("llama-3.1-8b"))
    _, _, res = run_log(eng, [dict(id="a", prompt=1000, max_tokens=2, at=0)])
    d = _durations(res)
    # Step 0: 1,000 prompt tokens (past the largest CUDA graph, 512: not padded).  Its MLP gate/up
    # (28,672 x 4,096) alone: 8 x 224 = 1,792 tiles, 14 waves of 132 = 1,848 tile runs of 2 x 128^2 x
    # 4,096 FLOPs (248.0 GFLOP) at 397.25 TFLOP/s = 624.4 us against 235 MB of weights at 2.68 TB/s = 87.6 us.
    up = 1848 * 2 * 128 * 128 * 4096 / MATMUL
    assert up == pytest.approx(624.4e-6, rel=1e-4)
    assert gemm_s(1000, 28672, 4096, 132, MATMUL, HBM, 2) == up
    assert d[0] == pytest.approx(_ref("llama-3.1-8b", [(1000, 1000, False)]), rel=1e-9)
    # Step 1: one decode token at context 1,001 reads every weight.  Each GEMM is bound by its reads but
    # gate/up: its 224 tiles of 128 rows run in two waves at half the matmul rate, 264 x 2 x 128^2 x
    # 4,096 / 397.25 TFLOP/s = 89.2 us against 235 MB / 2.68 TB/s = 87.6 us of reads.
    assert d[1] == pytest.approx(_ref("llama-3.1-8b", [(1, 1001, True)]), rel=1e-9)
    tiles = 264 * 2 * 128 * 128 * 4096 / MATMUL
    assert tiles == pytest.approx(89.20e-6, rel=1e-3) and gemm_s(1, 28672, 4096, 132, MATMUL, HBM, 2) == tiles
    reads = ((LLAMA_DENSE + LLAMA_HEAD) * 2 + LLAMA_KV * 1001 + 4 * 4 * 128256) / HBM   # weights, KV, sampler
    extra = 32 * (tiles - 28672 * 4096 * 2 / HBM)   # gate/up's compute over its reads, 32 layers
    assert d[1] == pytest.approx(0.002 + reads + extra, rel=1e-3)   # plus the activations' few kB a GEMM


def test_roofline_per_request_overhead():
    # 0.1 ms of the engine's own work per scheduled request: two decoding requests add 0.2 ms a step.
    eng = dict(num_gpu_blocks=2000, max_model_len=4096, max_num_batched_tokens=4096,
               time_model=_roofline("llama-3.1-8b", overhead_per_req_s=1e-4))
    _, _, res = run_log(eng, [dict(id="a", prompt=100, max_tokens=3, at=0), dict(id="b", prompt=100, max_tokens=3,
                                                                                 at=0)])
    d = _durations(res)
    two = [(1, 101, True), (1, 101, True)]
    assert d[1] == pytest.approx(_ref("llama-3.1-8b", two) + 2e-4, rel=1e-9)


def test_roofline_executor_cost_per_request_on_more_than_one_gpu():
    # vLLM's multiprocess executor (tp > 1) adds its CPU time per scheduled request: at 0.1 ms, two decoding
    # requests on 2 x H100 add 0.2 ms to the step; on one GPU (no executor processes) nothing.
    reqs = [dict(id="a", prompt=100, max_tokens=3, at=0), dict(id="b", prompt=100, max_tokens=3, at=0)]
    two = [(1, 101, True), (1, 101, True)]
    for tp, added in ((2, 2e-4), (1, 0.0)):
        eng = dict(num_gpu_blocks=2000, max_model_len=4096, max_num_batched_tokens=4096,
                   time_model=_roofline("llama-3.1-8b", tp=tp, executor_per_req_s=1e-4))
        d = _durations(run_log(eng, reqs)[2])
        assert d[1] == pytest.approx(_ref("llama-3.1-8b", two, tp=tp) + added, rel=1e-9)
    # Under async scheduling it is CPU time like the rest, overlapped with the GPU's: at 5 ms a request the
    # CPU's 2 ms + 2 x 5 ms = 12 ms outlast the decode's reads and set the step.
    eng = dict(num_gpu_blocks=2000, max_model_len=4096, max_num_batched_tokens=4096, async_scheduling=True,
               time_model=_roofline("llama-3.1-8b", tp=2, executor_per_req_s=5e-3))
    d = _durations(run_log(eng, reqs)[2])
    assert _ref("llama-3.1-8b", two, tp=2) - 0.002 < 0.012
    assert d[1] == pytest.approx(0.012, rel=1e-12)
    assert step_s("llama-3.1-8b", "H100", dict(EFF, tp=2, executor_per_req_s=5e-3), two,
                  async_scheduling=True) == pytest.approx(0.012, rel=1e-12)


def test_roofline_async_scheduling_overlaps_the_cpu():
    # With async scheduling the CPU's 2 ms a step overlap the GPU's: a decode step (about 2.8 ms of
    # reads) costs the GPU's time alone, a 1,000-token prefill too; without, the 2 ms add.
    batch = [(1, 1001, True)]
    gpu = _ref("llama-3.1-8b", batch) - 0.002
    assert step_s("llama-3.1-8b", "H100", EFF, batch, async_scheduling=True) == gpu
    slow_gpu = dict(EFF, overhead_s=0.05)
    assert step_s("llama-3.1-8b", "H100", slow_gpu, batch, async_scheduling=True) == 0.05
    eng = dict(num_gpu_blocks=2000, max_model_len=4096, max_num_batched_tokens=4096, async_scheduling=True,
               time_model=_roofline("llama-3.1-8b"))
    _, _, res = run_log(eng, [dict(id="a", prompt=1000, max_tokens=3, at=0)])
    d = _durations(res)
    assert d[0] == pytest.approx(_ref("llama-3.1-8b", [(1000, 1000, False)]) - 0.002, rel=1e-9)


def test_roofline_tensor_parallel_all_reduces():
    # llama-3.1-8b on 2 x H100: every split layer and the LM head halve; 2 all-reduces in each of 32 layers,
    # each 8 us plus tokens x 4096 x 2 B x 2 (2 - 1) / 2 over 450 GB/s (half of NVLink's 900 GB/s).
    from aisim.config.catalog import get_gpu, get_model
    from aisim.perf.roofline import roofline_terms

    t = roofline_terms(get_model("llama-3.1-8b"), get_gpu("H100"), 2, "bf16")
    assert t["comm_s"] == 64 * 8e-6 and t["comm_per_token_s"] == 64 * 4096 * 2 / 450e9
    # 1,000 tokens: 512 us + 64 x 8,192,000 B / 450 GB/s = 512 + 1,165 us.
    assert t["comm_s"] + t["comm_per_token_s"] * 1000 == pytest.approx(1677.1e-6, rel=1e-4)
    eng = dict(num_gpu_blocks=2000, max_model_len=4096, max_num_batched_tokens=4096,
               time_model=_roofline("llama-3.1-8b", tp=2))
    _, _, res = run_log(eng, [dict(id="a", prompt=1000, max_tokens=2, at=0)])
    d = _durations(res)
    assert d[0] == pytest.approx(_ref("llama-3.1-8b", [(1000, 1000, False)], tp=2), rel=1e-9)
    assert d[1] == pytest.approx(_ref("llama-3.1-8b", [(1, 1001, True)], tp=2), rel=1e-9)


def test_roofline_moe_reads_the_experts_the_batch_touches(monkeypatch):
    # qwen3-30b-a3b on one H100: 48 layers, each 128 experts of 3 x 2048 x 768 parameters, 8 picked per
    # token.  The experts' kernel at 0.5 of the achievable rate here; its own share: the next test.
    from aisim.perf import moe_kernel

    monkeypatch.setattr(moe_kernel, "expert_share", lambda n, fp8: 0.5)
    expert = 3 * 2048 * 768
    eng = dict(num_gpu_blocks=2000, max_model_len=4096, max_num_batched_tokens=4096,
               time_model=_roofline("qwen3-30b-a3b"))
    _, _, res = run_log(eng, [dict(id=f"r{i}", prompt=100, max_tokens=2, at=0) for i in range(3)])
    d = _durations(res)

    def touched(tokens):  # expected distinct experts of one layer: 128 (1 - (1 - 8/128)^tokens)
        return 128 * (1 - (1 - 8 / 128) ** tokens)

    # Step 0: three 100-token prompts, 300 tokens (their GEMMs padded to the graph of 304) touch nearly all
    # 128 experts of a layer.
    assert touched(300) == pytest.approx(127.9999995, rel=1e-9)
    assert d[0] == pytest.approx(_ref("qwen3-30b-a3b", [(100, 100, False)] * 3), rel=1e-9)
    # Step 1: three decode tokens (a graph of 4, its padding row alike, picking the same experts as each
    # other) read 128 (1 - (15/16)^3) = 22.53 experts a layer at the BF16 kernel's read share of 3.35 TB/s
    # (0.859: test_moe_kernel.py), 2.88 TB/s: 48 x 22.53 x 4.72 M parameters x 2 B = 10.21 GB, 3.55 ms.
    assert touched(3) == pytest.approx(22.53125, rel=1e-12)
    assert touched(3) * 48 * expert * 2 / (3.35e12 * moe_kernel.READ_SHARE) == pytest.approx(3.548e-3, rel=1e-3)
    assert d[1] == pytest.approx(_ref("qwen3-30b-a3b", [(1, 101, True)] * 3), rel=1e-9)


def test_roofline_prices_routed_experts_at_their_kernels_share(monkeypatch):
    # qwen3-30b-a3b with the routed experts' kernel at 0.25 of the achievable rate: one 2,000-token
    # prompt's 2 x 48 x 8 x 3 x 2048 x 768 = 3.62 GFLOP a token take 2,000 x 3.62 GFLOP / 198.6 TFLOP/s
    # = 36.5 ms, above reading all 128 x 48 experts (58.0 GB at the BF16 kernel's 0.859 of 3.35 TB/s, 20.2
    # ms); at 0.5 (18.2 ms) the reads bound them.  The kernel's N: one expert's 768 columns.
    from aisim.perf import moe_kernel

    asked = []
    monkeypatch.setattr(moe_kernel, "expert_share", lambda n, fp8: asked.append((n, fp8)) or 0.25)
    eng = dict(num_gpu_blocks=2000, max_model_len=4096, max_num_batched_tokens=4096,
               time_model=_roofline("qwen3-30b-a3b"))
    _, _, res = run_log(eng, [dict(id="a", prompt=2000, max_tokens=2, at=0)])
    d = _durations(res)
    experts = 2 * 48 * 8 * 3 * 2048 * 768 * 2000 / (794.5e12 * 0.25)
    assert experts == pytest.approx(0.036490, rel=1e-4)
    assert (768, False) in asked
    full = _ref("qwen3-30b-a3b", [(2000, 2000, False)])
    monkeypatch.setattr(moe_kernel, "expert_share", lambda n, fp8: 0.5)
    half = _ref("qwen3-30b-a3b", [(2000, 2000, False)])
    reads = 128 * (1 - (1 - 8 / 128) ** 2000) * 48 * 3 * 2048 * 768 * 2 / (3.35e12 * moe_kernel.READ_SHARE)
    assert reads == pytest.approx(20.15e-3, rel=1e-3)
    assert d[0] == pytest.approx(full, rel=1e-9) and full - half == pytest.approx(experts - reads, rel=1e-9)


def test_roofline_attention_runs_in_the_kv_cache_dtype():
    # llama-3.1-8b with FP8 weights on one H100: the layers multiply at the FP8 rate (1,402.6 TFLOP/s
    # measured), attention over the BF16 KV cache at the BF16 rate (794.5): 1,000 prompt tokens.
    from aisim.config.catalog import get_gpu, get_model
    from aisim.perf.roofline import roofline_terms

    t = roofline_terms(get_model("llama-3.1-8b"), get_gpu("H100"), 1, "fp8")
    assert t["matmul_flops"] == 1402.6e12 and t["attention_flops"] == 794.5e12
    eng = dict(num_gpu_blocks=2000, max_model_len=4096, max_num_batched_tokens=4096,
               time_model=_roofline("llama-3.1-8b", dtype="fp8"))
    _, _, res = run_log(eng, [dict(id="a", prompt=1000, max_tokens=2, at=0)])
    assert _durations(res)[0] == pytest.approx(_ref("llama-3.1-8b", [(1000, 1000, False)], dtype="fp8"), rel=1e-9)


def test_roofline_window_caps_attention_pairs_and_reads():
    # gemma-3-27b: 52 layers see the last 1,024 tokens, 10 see everything; 32 heads and 16 KV heads of 128.
    from aisim.config.catalog import get_gpu, get_model
    from aisim.perf.roofline import roofline_terms

    pair, kv = 2 * 256 * 32, 2 * 16 * 128 * 2
    t = roofline_terms(get_model("gemma-3-27b"), get_gpu("H100"), 1, "bf16")
    assert sorted(zip(t["window"], t["attn_flops"], t["kv_bytes"])) == [(0, pair * 10, kv * 10),
                                                                        (1024, pair * 52, kv * 52)]
    # Prefill: positions 1..4000; a windowed layer sees 1, 2, .., 1024, then 1024 for the 2,976 others.
    assert pairs(4000, 4000, 1024) == (1 + 1024) * 1024 // 2 + 1024 * (4000 - 1024) == 3_572_224
    assert pairs(4000, 4000) == 4000 * 4001 // 2
    eng = dict(num_gpu_blocks=4000, max_model_len=8192, max_num_batched_tokens=8192,
               time_model=_roofline("gemma-3-27b"))
    _, _, res = run_log(eng, [dict(id="a", prompt=4000, max_tokens=2, at=0)])
    d = _durations(res)
    big = dict(max_num_batched_tokens=8192)
    assert d[0] == pytest.approx(step_s("gemma-3-27b", "H100", EFF, [(4000, 4000, False)], **big), rel=1e-9)
    # Decode at context 4,001: the windowed layers read 1,024 tokens' K and V, the others 4,001.
    assert d[1] == pytest.approx(step_s("gemma-3-27b", "H100", EFF, [(1, 4001, True)], **big), rel=1e-9)


def test_roofline_terms_of_mla_and_fp8():
    from aisim.config.catalog import get_gpu, get_model
    from aisim.perf.roofline import roofline_terms

    # deepseek-r1 on 8 x H200: MLA keeps one 512 + 64 latent per token and layer on every GPU (bf16);
    # absorbed attention multiplies QK over 576 and PV over 512 for each of the 16 heads a GPU holds.
    t = roofline_terms(get_model("deepseek-r1"), get_gpu("H200"), 8, "fp8")
    assert t["kv_bytes"] == [61 * 576 * 2] and t["attn_flops"] == [2 * (576 + 512) * 16 * 61]
    assert t["peak_flops"] == 1979e12 and t["matmul_flops"] == 1453.4e12 and t["moe_experts"] == 256
    # FP8 weights, BF16 latent: attention at the H200's BF16 rate; 58 layers x 8 of 3 x 7168 x 2048 routed.
    assert t["attention_flops"] == 794.5e12
    assert t["expert_flops_per_token"] == 2 * 58 * 8 * 3 * 7168 * 2048 / 8
    # 58 MoE layers of 256 experts of 3 x 7168 x 2048, FP8, an eighth on each GPU.
    assert t["moe_expert_bytes"] == 58 * 3 * 7168 * 2048 * 1 / 8
    # FP8 weights on an A100 (no FP8 tensor cores) multiply at the BF16 rate but read one byte each.
    a100 = roofline_terms(get_model("llama-3.1-8b"), get_gpu("A100-80GB"), 1, "fp8")
    assert a100["matmul_flops"] == 271.2e12 and a100["weight_bytes"] == LLAMA_DENSE + LLAMA_HEAD
    # GLM-5.3-Flash caches FP8 keys and values in every attention layer: attention at the FP8 rate.
    glm = roofline_terms(get_model("glm-5.3-flash"), get_gpu("H100"), 1, "fp8")
    assert glm["attention_flops"] == 1402.6e12 and glm["expert_flops_per_token"] == 0.0


def _profile(tmp_path, rows, header="prefill_tokens,kv_tokens,latency_s"):
    path = tmp_path / "profile.csv"
    path.write_text(header + "\n" + "\n".join(",".join(str(v) for v in r) for r in rows) + "\n")
    return str(path)


def test_table_bilinear(tmp_path):
    # Grid over prefill tokens {0, 1000} x KV tokens read {0, 2000}.
    path = _profile(tmp_path, [(0, 0, 0.010), (0, 2000, 0.014), (1000, 0, 0.050), (1000, 2000, 0.070)])
    eng = dict(num_gpu_blocks=200, max_model_len=2000, max_num_batched_tokens=2048,
               time_model={"kind": "table", "path": path})
    _, _, res = run_log(eng, [dict(id="a", prompt=500, max_tokens=2, at=0)])
    d = _durations(res)
    # Step 0: prefill 500, KV read 500: x = 0.5, y = 0.25.
    lo = 0.010 + 0.5 * (0.050 - 0.010)
    hi = 0.014 + 0.5 * (0.070 - 0.014)
    assert d[0] == pytest.approx(lo + 0.25 * (hi - lo))
    # Step 1: a decode (no prefill tokens), KV read 501: x = 0, y = 0.2505.
    assert d[1] == pytest.approx(0.010 + 0.2505 * (0.014 - 0.010))


def test_table_linear_in_one_axis(tmp_path):
    path = _profile(tmp_path, [(1, 0.01), (4, 0.02)], header="batch_size,latency_s")
    eng = dict(num_gpu_blocks=200, max_model_len=2000, time_model={"kind": "table", "path": path})
    reqs = [dict(id=f"r{i}", prompt=10, max_tokens=3, at=0) for i in range(3)]
    _, _, res = run_log(eng, reqs)
    assert _durations(res)[0] == pytest.approx(0.01 + (3 - 1) / 3 * 0.01)


def test_table_never_extrapolates(tmp_path):
    path = _profile(tmp_path, [(0, 0, 0.01), (0, 100, 0.02), (100, 0, 0.03), (100, 100, 0.04)])
    eng = dict(num_gpu_blocks=200, max_model_len=2000, time_model={"kind": "table", "path": path})
    with pytest.raises(ReplayError, match="outside the step-time profile's measured range"):
        run_log(eng, [dict(id="a", prompt=500, max_tokens=2, at=0)])


def test_bad_profiles_are_named(tmp_path):
    with pytest.raises(ConfigError, match="full grid"):
        eng = dict(num_gpu_blocks=200, max_model_len=4096, time_model={"kind": "table",
                                                   "path": _profile(tmp_path, [(0, 0, 0.01), (1, 1, 0.02)])})
        run_log(eng, [dict(id="a", prompt=5, max_tokens=1, at=0)])
    with pytest.raises(ConfigError, match="'time_model.gpu' is required"):
        run_log(dict(num_gpu_blocks=200, max_model_len=4096, time_model={"kind": "roofline", "model": "llama-3.1-8b"}),
                    [])


@pytest.mark.parametrize("data,fragment", [
    (b"prefill_tokens,latency_s\n0,0.01\n64,nan\n", ":3: field 'latency_s' must be a finite number, got 'nan'"),
    (b"prefill_tokens,latency_s\n0,0.01\n6\xff,0.02\n", ":3: not UTF-8 text (byte 0xff at column 2)"),
])
def test_profile_tables_refuse_non_finite_numbers_and_bytes_that_are_not_utf8(tmp_path, data, fragment):
    from aisim.perf.table import table_args

    path = tmp_path / "profile.csv"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as err:
        table_args(str(path))
    assert str(err.value) == f"{path}{fragment}"


def test_table_counts_verified_drafts_as_prefill_tokens(tmp_path):
    # Same grid.  With k = 3 drafts, step 1 verifies 1 + 3 tokens: the 3 drafts are a multi-token query
    # (prefill axis 3), the context read is 500 + 4 = 504: x = 0.003, y = 0.252.
    path = _profile(tmp_path, [(0, 0, 0.010), (0, 2000, 0.014), (1000, 0, 0.050), (1000, 2000, 0.070)])
    eng = dict(num_gpu_blocks=200, max_model_len=2000, max_num_batched_tokens=2048,
               time_model={"kind": "table", "path": path},
               speculative={"num_speculative_tokens": 3, "acceptance": {"counts": [0]}})
    _, _, res = run_log(eng, [dict(id="a", prompt=500, max_tokens=2, at=0)])
    lo = 0.010 + 0.003 * (0.050 - 0.010)
    hi = 0.014 + 0.003 * (0.070 - 0.014)
    assert _durations(res)[1] == pytest.approx(lo + 0.252 * (hi - lo))


def test_roofline_prices_each_step_of_a_stretch_and_after_a_finish_afresh():
    # Four decoding requests, then three once "a" finishes: both batches pad to the 4-token decode graph,
    # so their products of the padded tokens are alike and only the LM head (one row a request) tells them
    # apart, by about 1e-5 of the step.  The core keeps the last step's matrix products; each step must
    # still cost what the reference prices afresh: its own requests' LM head and contexts.
    eng = dict(num_gpu_blocks=2000, max_model_len=4096, max_num_batched_tokens=4096,
               time_model=_roofline("llama-3.1-8b"))
    reqs = [dict(id=x, prompt=100, max_tokens=3 if x == "a" else 5, at=0) for x in "abcd"]
    d = _durations(run_log(eng, reqs)[2])
    assert sorted(d) == [0, 1, 2, 3, 4, 5]   # step 5 schedules nothing: the CPU's 2 ms alone
    assert d[5] == pytest.approx(0.002, rel=1e-12)
    assert d[0] == pytest.approx(_ref("llama-3.1-8b", [(100, 100, False)] * 4), rel=1e-9)
    for step, n, ctx in ((1, 4, 101), (2, 4, 102), (3, 3, 103), (4, 3, 104)):
        assert d[step] == pytest.approx(_ref("llama-3.1-8b", [(1, ctx, True)] * n), rel=1e-9)
    four_as_three = _ref("llama-3.1-8b", [(1, 103, True)] * 4) - _ref("llama-3.1-8b", [(1, 103, True)] * 3)
    assert four_as_three > 1e-9 * d[3] * 1000   # the LM head's row and one more context: far past the tolerance
