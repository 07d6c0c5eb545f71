"""A slow reference of the roofline step time (aisim/perf/roofline.py states the model), for tests only.

Written from the model's statement, not from the core: each GEMM of the model's ``gemms`` at the
roofline of its shape (tiles in waves over the SMs, or its bytes, or the block-FP8 kernel's walk), the routed experts, attention
in a prefill and a decode kernel, the sampler, the all-reduces, then the CPU's time added (or
overlapped under async scheduling).  The pieces it reads from ``roofline_terms`` (attention FLOPs
a pair, KV bytes a token, experts' bytes) are pinned by hand counts in the tests.
"""

import math

from aisim.config.catalog import get_gpu, get_model
from aisim.config.versions import release
from aisim.perf.block_fp8 import WALK_FIXED_S, gemm_walks, quant_seconds_per_token
from aisim.perf.graphs import graph_sizes, step_graph
from aisim.perf.moe_kernel import expert_kernel
from aisim.perf.roofline import roofline_terms


def walk_s(m, n, sms, walk, factor, tile=128):
    """vLLM's block-FP8 kernel for ``m`` rows (``walk`` and ``factor`` of :func:`aisim.perf.block_fp8.gemm_walks`):
    its fixed part once and each wave's walk down ``k``, a grid under one wave at ``factor`` of that; 0 for a
    product the kernel does not run (``walk`` 0)."""
    if not walk:
        return 0.0
    tiles = math.ceil(m / tile) * math.ceil(n / tile)
    return (WALK_FIXED_S + walk) * factor if tiles < sms else WALK_FIXED_S + math.ceil(tiles / sms) * walk


def gemm_s(m, n, k, sms, flops_rate, bytes_rate, weight_bytes, tile=128, act=2, walk=0.0, factor=1.0):
    """One GEMM: its 128 x 128 tiles in whole waves (once there are more than SMs), or its bytes; with
    ``walk`` (vLLM's block-FP8 kernel) or its fixed part and each wave's walk down ``k``, a grid under one wave
    at ``factor`` of that."""
    tiles = math.ceil(m / tile) * math.ceil(n / tile)
    walked = walk_s(m, n, sms, walk, factor, tile)
    if tiles > sms:
        tiles = math.ceil(tiles / sms) * sms
    return max(tiles * 2 * tile * tile * k / flops_rate, (n * k * weight_bytes + m * (k + n) * act) / bytes_rate,
               walked)


def pairs(n, c, w=0):
    """(new token, key) pairs of n new tokens ending at context c, keys capped at w (0: none)."""
    return sum(min(p, w) if w else p for p in range(c - n + 1, c + 1))


def step_s(model, gpu, tm, batch, max_num_seqs=256, max_num_batched_tokens=4096, async_scheduling=False,
           version=None):
    """Seconds of one step of ``batch``: ``(new tokens, context after the step, is a decode)`` a request.

    ``tm``: the roofline keys (efficiencies, overheads, tp, dtype, triton_group_quant); ``version``: the release whose
    CUDA-graph padding applies (default: the newest).
    """
    spec, g = get_model(model), get_gpu(gpu)
    tp, dtype = tm.get("tp", 1), tm.get("dtype") or spec.dtype
    t = roofline_terms(spec, g, tp, dtype)
    wb = 1 if dtype == "fp8" else 2
    matmul = t["matmul_flops"] * tm["compute_efficiency"]
    attn = t["attention_flops"] * tm["attention_efficiency"]
    bw = t["peak_bytes"] * tm["bandwidth_efficiency"]
    tokens, reqs = sum(b[0] for b in batch), len(batch)
    sizes = graph_sizes(release(version).cudagraph_rule, max_num_seqs, max_num_batched_tokens, g.capability)
    m = step_graph(tokens, all(n == 1 and dec and c > n for n, c, dec in batch), sizes)
    gpu_s = tm.get("layer_overhead_s", 0.0) * spec.num_layers
    for (_, n, k, count, rows), (walk, factor) in zip(t["gemms"], gemm_walks(spec, g, tp, dtype)):
        gpu_s += count * gemm_s(reqs if rows == "requests" else m, n, k, g.sms, matmul, bw, wb, walk=walk,
                                factor=factor)
    kernel = expert_kernel(spec, tp, g, dtype)
    if kernel is not None:
        # the step's own tokens spread over the experts; a graph's padding rows are alike; the kernel reads
        # them at its own share of peak bandwidth
        touched = t["moe_experts"] * (1 - (1 - spec.experts_per_token / spec.num_experts) ** tokens)
        gpu_s += max(t["expert_flops_per_token"] * m / (t["matmul_flops"] * kernel.share),
                     touched * t["moe_expert_bytes"] / (t["peak_bytes"] * kernel.read_share))
    kinds = {True: [0.0, 0.0], False: [0.0, 0.0]}   # decode?: [FLOPs, bytes]
    up = 0.0
    for n, c, dec in batch:
        prefill_form = t["ctx_flops"] or t["attn_flops_prefill"] != t["attn_flops"]
        af = t["attn_flops"]
        if prefill_form and n > 1 and not dec:
            af = t["attn_flops_prefill"]
            up += c - n
        for f, kb, w in zip(af, t["kv_bytes"], t["window"]):
            kinds[dec][0] += f * pairs(n, c, w)
            kinds[dec][1] += kb * (min(c, w) if w else c)
    for f, b in kinds.values():
        gpu_s += max(f / attn, b / bw)
    gpu_s += t["ctx_flops"] * up / matmul
    gpu_s += t["sample_bytes"] * reqs / bw
    # vLLM 0.8's Triton per-token-group quantization before the block-FP8 products, per padded token
    gpu_s += quant_seconds_per_token(spec, g, tp, dtype, tm.get("triton_group_quant", False)) * m
    gpu_s += t["comm_s"] + t["comm_per_token_s"] * m
    per_req = tm.get("overhead_per_req_s", 0.0) + (tm.get("executor_per_req_s", 0.0) if tp > 1 else 0.0)
    cpu_s = tm["overhead_s"] + per_req * reqs
    return max(gpu_s, cpu_s) if async_scheduling else gpu_s + cpu_s
