"""Step time from operators: each matrix product, attention and all-reduce of a step, priced as it runs.

One engine step on one GPU of a tensor-parallel group of ``tp`` (every rank does the same work
on its share) costs

    GPU = sum over GEMMs (roofline of its shape) + routed experts + attention (prefill, decode)
          + activation quantization + recurrent states + sampler + all-reduces + layer_overhead_s x layers
    CPU = overhead_s + (overhead_per_req_s + executor_per_req_s if tp > 1) x requests
    step = max(GPU, CPU) with async scheduling (the engine schedules the next step while the GPU
           runs this one), GPU + CPU without

* **GEMMs** (:class:`aisim.config.modelspec.Gemm`, from the model's ``config.json``): QKV, O, the
  MLP's gate/up and down, MLA's projections, the MoE router and shared experts, each on its share
  ``n x k`` of one GPU, and the LM head.  ``M`` is the step's tokens, padded to the CUDA graph
  it runs in (:mod:`aisim.perf.graphs`); the LM head's is the step's requests (vLLM computes
  logits at one position of each).  One GEMM takes ``max(compute, memory)``: compute is its
  output cut into :data:`TILE` x :data:`TILE` tiles, ``ceil(M / TILE) x ceil(n / TILE)`` of them,
  in waves of the GPU's SM count (rounded up to whole waves once there is more than one; a
  grid smaller than the GPU is split along ``k``), each tile ``2 TILE^2 k`` FLOPs at the GPU's
  achievable matmul rate of the weights' dtype x ``compute_efficiency``; memory is the weight
  (``n k`` x its dtype's bytes) plus the activations in and out (``M (k + n)`` x
  :data:`ACT_BYTES`) over peak bandwidth x ``bandwidth_efficiency``.  A decode step is
  thus bound by reading the weights, a large prefill chunk by its FLOPs.  A checkpoint of
  128 x 128 FP8 blocks on Hopper runs its products in vLLM's block-FP8 kernel, whose tiles walk
  the whole depth ``k`` at a pace measured from its published runs: each GEMM takes that walk
  when longer (:mod:`aisim.perf.block_fp8`; a decode step of DeepSeek-R1 is bound by it).
* **routed experts**: ``2 x k x 3 x hidden x N`` FLOPs per token (``k`` experts picked) at the
  share of the achievable rate vLLM's fused-MoE kernel reaches for its ``N`` columns
  (:func:`aisim.perf.moe_kernel.expert_kernel`), against reading the experts the step touches
  (``T`` tokens picking ``k`` of ``E`` uniformly touch ``E (1 - (1 - k/E)^T)`` a layer; ``T`` the
  step's own tokens, a CUDA graph's alike padding rows adding none) at the share of peak bandwidth
  the kernel's published decode-sized runs read them at (``ExpertKernel.read_share``).
* **attention**, per layer kind and per request, in two kernels: the prefill chunks
  (FlashAttention-like: ``2 (qk + v)`` FLOPs per head per (new token, key) pair, the pairs of
  ``n`` new tokens ending at context ``c`` being ``sum min(position, window)``) and the decodes
  (paged reads of each request's KV cache, ``min(context, window)`` tokens per layer); each
  ``max(FLOPs / (achievable rate of the KV cache's dtype x attention_efficiency), KV bytes /
  bandwidth)``.  MLA runs each request in one of two forms, as vLLM's MLA metadata builder
  splits the batch (``MLACommonMetadataBuilder.build`` -> ``split_decodes_and_prefills`` with
  the backend's ``reorder_batch_threshold``,
  ``vllm/model_executor/layers/attention/mla_attention.py``): a request of at most
  :data:`MLA_DECODE_MAX_TOKENS` new tokens, or a decode verifying drafts, in the decode form
  (``forward_mqa``: absorbed weights, QK over ``kv_lora_rank + qk_rope_head_dim``, PV over
  ``kv_lora_rank`` a head); every other in the prefill form (``forward_mha``: QK over
  ``qk_nope_head_dim + qk_rope_head_dim``, PV over ``v_head_dim``), which also up-projects the
  latent of its cached context through ``kv_b_proj`` every step (``_compute_prefill_context``):
  ``2 x kv_lora_rank x heads/tp x (qk_nope_head_dim + v_head_dim)`` FLOPs per context token per
  layer, at the matmul rate.
* **activation quantization** (``triton_group_quant``, a block-FP8 checkpoint on Hopper): vLLM 0.8's
  Triton per-token-group kernel before each block-FP8 product and the experts' GEMMs, at its published
  seconds an element (:data:`aisim.perf.block_fp8.QUANT_S_PER_ELEMENT`) for each element a token
  quantizes (:func:`aisim.perf.block_fp8.quant_elements`), ``M`` the step's padded tokens.
* **recurrent states** (Mamba, GDN): each request's state read and written, its update's FLOPs.
* **sampler**: the float32 logits of each request, :data:`SAMPLER_PASSES` passes over the
  vocabulary (vLLM's ``Sampler``: logits to float32, temperature, softmax, the draw).
* **all-reduce** (``tp > 1``): two per layer (after attention and after the MLP), each a
  ring over ``M x hidden x 2 bytes x 2 (tp - 1) / tp`` at the GPU's one-way interconnect
  bandwidth, plus a fixed latency (:mod:`aisim.config.gpus`).
* **fixed costs**: ``layer_overhead_s`` a decoder layer on the GPU (the small kernels between
  the GEMMs: norms, rotary embedding, activations, the gaps between launches); the CPU's
  ``overhead_s`` a step and ``overhead_per_req_s`` a scheduled request (scheduling, input
  preparation, output processing).
* **the executor** (``tp > 1``): ``executor_per_req_s`` more a scheduled request.  On more than one
  GPU vLLM runs each GPU's model runner in a worker process of its multiprocess executor
  (``MultiprocExecutor.collective_rpc``, ``vllm/v1/executor/multiproc_executor.py``): every step the
  engine pickles the scheduler's output into a shared-memory queue that every worker reads and
  unpickles, each worker prepares its inputs, and the engine waits for the replies (vLLM 0.8: every
  worker's in turn; 0.10: the output rank's, ``unique_reply_rank``), the sampled tokens coming back
  pickled; the further CPU time grows with the requests the step carries.  It joins the CPU's time:
  added to the GPU's without async scheduling, overlapped with it under it.

Every constant is a datasheet number of :mod:`aisim.config.gpus`, a rule of vLLM read from its
source (cited where it is used), one of the named constants below, or a fitted
``TIME_MODEL_KEYS`` entry (``fitted=True``: ``compute_efficiency``, ``attention_efficiency``,
``bandwidth_efficiency``, ``overhead_s``, ``overhead_per_req_s``, ``executor_per_req_s``,
``layer_overhead_s``).  The
coefficients travel to the core as ``TimeModelC`` (``ext/steptime.pxd``), the GEMM shapes computed
once here; per step the core loops over the handful of GEMM kinds and the batch's requests.
"""

from __future__ import annotations

import math

from aisim._core.constants import TIME_MODEL_KINDS
from aisim.config.catalog import get_gpu, get_model
from aisim.config.modelspec import DTYPE_BYTES
from aisim.perf.block_fp8 import WALK_FIXED_S, gemm_walks, quant_seconds_per_token
from aisim.perf.moe_kernel import expert_kernel

# Bytes of one activation element in an all-reduce (vLLM reduces BF16 activations).
ALLREDUCE_BYTES = 2
# Bytes of one activation element a GEMM reads or writes (BF16 activations, FP8 weights or not).
ACT_BYTES = 2
# Output tile of one thread block of a GEMM, rows and columns: the 128 x 128 tile of the CUTLASS and
# cuBLAS kernels behind vLLM's linear layers on Ampere and Hopper (an assumption of aisim: the
# libraries pick among several tiles per shape).
TILE = 128
# Passes of the sampler over each request's float32 logits: written by the LM head in float32, scaled
# by the temperature, softmaxed, drawn from (vllm/v1/sample/sampler.py Sampler.forward: compute_logprobs
# off, no penalties); each pass reads or writes vocab x 4 bytes.
SAMPLER_PASSES = 4
LOGIT_BYTES = 4
# All-reduces per decoder layer under tensor parallelism (attention output, MLP output).
ALLREDUCES_PER_LAYER = 2
# The most new tokens an MLA request runs in the decode form: the decode threshold of vLLM's MLA
# metadata builders (MLACommonMetadataBuilder.reorder_batch_threshold), 1 in the backends vLLM 0.11
# picks (FlashMLA on Hopper, CUTLASS MLA on Blackwell, Triton MLA) and, without drafts, in 0.33's
# Triton and FlashInfer MLA.  Not followed: 0.33's FlashAttention MLA (its first choice on Hopper)
# takes up to 512 and its FlashMLA up to 128; the time model is not told the release.
MLA_DECODE_MAX_TOKENS = 1


def roofline_terms(model, gpu, tp: int, dtype: str) -> dict:
    """The roofline's coefficients before efficiencies and overhead, for inspection and tests.

    Parameters
    ----------
    model : aisim.config.modelspec.ModelSpec
    gpu : aisim.config.gpus.GPUSpec
    tp : int
        Tensor-parallel size.
    dtype : {"bf16", "fp8"}
        Weights as served.

    Returns
    -------
    dict
        ``flops_per_token`` (``expert_flops_per_token`` of it the routed experts'),
        ``flops_per_req``, ``weight_bytes``, ``state_bytes`` (per request),
        ``attn_flops``/``kv_bytes``/``window`` (one entry per attention layer kind),
        ``attn_flops_prefill`` (the same kinds' FLOPs a pair in MLA's prefill form; else
        ``attn_flops``), ``ctx_flops`` (MLA: matmul FLOPs per cached context token of a
        request in the prefill form; else 0),
        ``moe_experts``, ``moe_log_miss``, ``moe_expert_bytes``, ``comm_s``, ``comm_per_token_s``,
        ``peak_flops`` (datasheet), ``matmul_flops`` (achievable),
        ``gemms`` (``(name, n, k, count, rows)`` a matrix product on one GPU), ``state_flops``
        (per token), ``sample_bytes`` (per request),
        ``attention_flops`` (achievable in the KV cache's dtype), ``peak_bytes``.
    """
    wb = DTYPE_BYTES[dtype]
    attn_flops, attn_flops_prefill, kv_bytes, window = [], [], [], []
    state = state_flops = ctx_flops = 0.0
    fp8_kv = True
    for layer in model.layers:
        if layer.num_kv_heads:
            fp8_kv = fp8_kv and layer.kv_dtype_bytes == 1
            heads = (layer.num_heads or model.num_heads) / tp
            qk, v = layer.qk_dim or layer.head_size, layer.v_dim or layer.head_size
            attn_flops.append(2.0 * (qk + v) * heads * layer.count)
            pqk, pv = layer.prefill_qk_dim or qk, layer.prefill_v_dim or v
            attn_flops_prefill.append(2.0 * (pqk + pv) * heads * layer.count)
            ctx_flops += 2.0 * layer.up_rank * layer.up_dim * heads * layer.count
            kv_bytes.append(float(layer.bytes_per_token(tp) * layer.count))
            window.append(int(layer.sliding_window or 0))
        if layer.state_bytes:
            state += 2.0 * layer.state_bytes * layer.count / tp   # read, then written back
            state_flops += layer.state_flops * layer.count / tp
    expert_flops = 0.0
    if model.detailed:
        head = float(model.vocab_size * model.hidden_size)
        expert_flops = 2.0 * model.moe_layers * model.experts_per_token * model.expert_params / tp
        flops_per_token = 2.0 * (model.dense_params / tp + model.replicated_params) + expert_flops + state_flops
        flops_per_req = 2.0 * head / tp
        weights = (model.dense_params / tp + model.replicated_params + head / tp) * wb
    else:  # no parameter split known: every active parameter is read and multiplied
        active = model.active_params or model.params
        flops_per_token, flops_per_req = 2.0 * active / tp + state_flops, 0.0
        weights = active * wb / tp
    experts, miss, expert_bytes = 0.0, 0.0, 0.0
    if model.moe_layers:
        experts = float(model.num_experts)
        k = model.experts_per_token
        miss = math.log1p(-k / experts) if k < experts else -math.inf
        expert_bytes = model.moe_layers * model.expert_params * wb / tp
    comm_s = comm_per_token_s = 0.0
    if tp > 1:
        n = ALLREDUCES_PER_LAYER * model.num_layers
        comm_s = n * gpu.link_latency_s
        comm_per_token_s = (n * model.hidden_size * ALLREDUCE_BYTES * 2.0 * (tp - 1) / tp
                            / gpu.link_bytes_per_s_each_way)
    gemms = [(g.name, *g.shape(tp), g.count, g.rows) for g in model.gemms]
    if not gemms:  # no shapes known: the active weights as one square-ish product a layer
        active = model.active_params or model.params
        gemms = [("active", float(model.hidden_size), active / tp / model.hidden_size / model.num_layers,
                  model.num_layers, "tokens")]
    return {
        "gemms": gemms, "state_flops": state_flops,
        "sample_bytes": float(SAMPLER_PASSES * LOGIT_BYTES * model.vocab_size),
        "flops_per_token": flops_per_token, "expert_flops_per_token": expert_flops, "flops_per_req": flops_per_req,
        "weight_bytes": weights,
        "state_bytes": state, "attn_flops": attn_flops, "kv_bytes": kv_bytes, "window": window,
        "attn_flops_prefill": attn_flops_prefill, "ctx_flops": ctx_flops,
        "moe_experts": experts, "moe_log_miss": miss, "moe_expert_bytes": expert_bytes,
        "comm_s": comm_s, "comm_per_token_s": comm_per_token_s,
        "peak_flops": gpu.flops_for(dtype), "matmul_flops": gpu.achievable_flops(dtype),
        # vLLM's attention backends (vllm/v1/attention/backends/flash_attn.py, mla/flashmla.py) take
        # queries, keys and values in the KV cache's dtype: FP8 weights leave attention in BF16.
        "attention_flops": gpu.achievable_flops("fp8" if fp8_kv and attn_flops else "bf16"),
        "peak_bytes": gpu.hbm_bytes_per_s,
    }


def resolved_dtype(tm, model) -> str:
    """The weights' dtype of time model ``tm``: its ``dtype``, else the checkpoint's."""
    return tm.dtype or model.dtype


def roofline_args(tm, async_scheduling: bool = False, graph_sizes=(), decode_graphs=(), decode_q: int = 1) -> dict:
    """Core arguments of the operator model of ``tm`` (an engine's TimeModel).

    Parameters
    ----------
    tm : aisim.config.engine.TimeModel
    async_scheduling : bool
        The engine schedules the next step while the GPU runs this one: the CPU's time overlaps.
    graph_sizes : sequence of int
        The token-keyed CUDA graphs (:attr:`aisim.perf.graphs.GraphSizes.tokens`); empty: no graphs.
    decode_graphs : sequence of int
        The uniform decode graphs, in tokens (:attr:`aisim.perf.graphs.GraphSizes.decode`); empty:
        decodes pad among ``graph_sizes``.
    decode_q : int
        The tokens each request of a uniform decode schedules.
    """
    model = get_model(tm.model)
    gpu = get_gpu(tm.gpu)
    dtype = resolved_dtype(tm, model)
    t = roofline_terms(model, gpu, tm.tp, dtype)
    kernel = expert_kernel(model, tm.tp, gpu, dtype)
    share = kernel.share if kernel is not None else tm.compute_efficiency
    read_share = kernel.read_share if kernel is not None else tm.bandwidth_efficiency
    g = t["gemms"]
    walks = gemm_walks(model, gpu, tm.tp, dtype) if model.gemms else [(0.0, 1.0)] * len(g)
    return {
        "kind": TIME_MODEL_KINDS["roofline"],
        "gemm_n": [x[1] for x in g], "gemm_k": [x[2] for x in g], "gemm_count": [float(x[3]) for x in g],
        "gemm_per_req": [int(x[4] == "requests") for x in g],
        "gemm_walk_s": [w[0] for w in walks], "gemm_walk_factor": [w[1] for w in walks],
        "walk_fixed_s": WALK_FIXED_S,
        "quant_s_per_token": quant_seconds_per_token(model, gpu, tm.tp, dtype, tm.triton_group_quant),
        "sms": float(gpu.sms or 1), "tile": float(TILE), "act_bytes": float(ACT_BYTES),
        "weight_elt": float(DTYPE_BYTES[dtype]),
        "attn_flops": t["attn_flops"],
        "attn_flops_prefill": t["attn_flops_prefill"],
        "ctx_flops": t["ctx_flops"],
        "decode_max_tokens": MLA_DECODE_MAX_TOKENS,
        "kv_bytes": t["kv_bytes"],
        "window": t["window"],
        "state_bytes": t["state_bytes"],
        "state_flops": t["state_flops"],
        "sample_bytes": t["sample_bytes"],
        "expert_flops_per_token": t["expert_flops_per_token"],
        "expert_rate": t["matmul_flops"] * share,
        "expert_bytes_rate": t["peak_bytes"] * read_share,
        "flops_rate": t["matmul_flops"] * tm.compute_efficiency,
        "bytes_rate": t["peak_bytes"] * tm.bandwidth_efficiency,
        "attn_rate": t["attention_flops"] * tm.attention_efficiency,
        "overhead_s": tm.overhead_s,
        # ParallelConfig.__post_init__ (vllm/config.py) picks the "mp" executor for a world size above 1,
        # "uni" for 1: MultiprocExecutor.collective_rpc (vllm/v1/executor/multiproc_executor.py) sends each
        # step to a worker process per GPU and awaits the reply; one GPU runs in the engine's own process.
        "req_s": tm.overhead_per_req_s + (tm.executor_per_req_s if tm.tp > 1 else 0.0),
        "gpu_fixed_s": tm.layer_overhead_s * model.num_layers,
        "async_cpu": bool(async_scheduling),
        "graph_sizes": [int(x) for x in graph_sizes],
        "decode_graph_sizes": [int(x) for x in decode_graphs], "decode_q": int(decode_q),
        **{k: t[k] for k in ("moe_experts", "moe_log_miss", "moe_expert_bytes", "comm_s", "comm_per_token_s")},
    }
