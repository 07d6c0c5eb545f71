"""Roofline coefficients from GPU and model specs.

One engine step on one GPU of a tensor-parallel group of ``tp`` (every rank does the
same work on its share) costs

    overhead_s + overhead_per_req_s x requests + max(compute_s, memory_s) + allreduce_s

* **compute**: ``2 x`` the parameters a token multiplies (its share of the split layers,
  the layers every rank holds whole, the ``k`` routed experts it picks) per scheduled
  token; the LM head's ``2 x hidden x vocab / tp`` per scheduled request (vLLM computes
  logits at one position of each); attention, per layer kind, ``2 (qk + v)`` FLOPs per
  head per (new token, key) pair over the layer's share of heads, the pairs of ``n`` new
  tokens ending at context ``c`` being ``sum min(position, window)`` over their
  positions (causal attention, a sliding window caps the keys; MLA in two forms, below);
  linear-attention state updates per token.  Matrix products run at the GPU's
  achievable matmul FLOP/s x ``compute_efficiency``, attention at the same rate x
  ``attention_efficiency``, the routed experts' products at the share of that rate vLLM's
  fused-MoE kernel reaches for their shape (:func:`aisim.perf.moe_kernel.expert_share`); the
  rate of the weights' dtype (FP8 weights on a GPU without FP8 tensor cores run at the BF16
  rate), attention's the rate of the KV cache's dtype
  (the attention kernels multiply the cached keys and values as stored: BF16 unless every
  attention layer caches FP8, whatever the weights).
* **memory**: the weights read once per step (split layers / ``tp``, whole layers, the
  LM head / ``tp``; the embedding is only gathered); of the routed experts only those the
  batch touches: with ``T`` scheduled tokens each picking ``k`` of ``E`` experts
  uniformly, a layer reads ``E (1 - (1 - k/E)^T)`` distinct experts on average; each
  scheduled request's KV cache (``min(context, window)`` tokens per attention layer; MLA's
  latent whole on every GPU, GQA's share of heads); each recurrent state read and
  written.  Over ``peak bandwidth x bandwidth_efficiency``.
* **MLA** runs each request in one of two forms, as vLLM's MLA metadata builder splits the
  batch (``MLACommonMetadataBuilder.build`` -> ``split_decodes_and_prefills`` with the
  backend's ``reorder_batch_threshold``, ``vllm/model_executor/layers/attention/mla_attention.py``;
  ``vllm/v1/attention/backends/mla/common.py`` before): a request of at most
  :data:`MLA_DECODE_MAX_TOKENS` new tokens, or a decode verifying drafts, in the decode form
  (``forward_mqa``: absorbed weights, QK over ``kv_lora_rank + qk_rope_head_dim``, PV over
  ``kv_lora_rank`` a head); every other in the prefill form (``forward_mha``: multi-head
  attention over up-projected keys and values, QK over ``qk_nope_head_dim +
  qk_rope_head_dim``, PV over ``v_head_dim``), which also up-projects the latent of its cached
  context through ``kv_b_proj`` every step (``_compute_prefill_context``, in workspace-sized
  chunks): ``2 x kv_lora_rank x heads/tp x (qk_nope_head_dim + v_head_dim)`` matmul FLOPs per
  context token per layer.  The new tokens' own up-projection (prefill) and the absorbed
  ``W_UK``/``W_UV`` products (decode), the same count a token, are ``kv_b_proj``'s parameters
  in the FLOPs per token.  Other layers have one form.
* **all-reduce** (``tp > 1``): two per layer (after attention and after the MLP), each a
  ring over ``T x hidden x 2 bytes x 2 (tp - 1) / tp`` at the GPU's one-way interconnect
  bandwidth, plus a fixed latency (:mod:`aisim.config.gpus`).

The coefficients travel to the core as ``TimeModelC`` (``ext/steptime.pxd``).
"""

from __future__ import annotations

import math

from aisim._core.constants import TIME_MODEL_KINDS
from aisim.config.catalog import get_gpu, get_model
from aisim.config.modelspec import DTYPE_BYTES
from aisim.perf.moe_kernel import expert_kernel

# Bytes of one activation element in an all-reduce (vLLM reduces BF16 activations).
ALLREDUCE_BYTES = 2
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
    return {
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


def roofline_args(tm) -> dict:
    """Core arguments of the roofline model of ``tm`` (an engine's TimeModel).

    The core prices every matrix FLOP at one rate, the achievable rate x ``compute_efficiency``;
    the routed experts run at the achievable rate x their kernel's share
    (:func:`aisim.perf.moe_kernel.expert_kernel`), so their FLOPs enter ``flops_per_token`` as
    ``compute_efficiency / share`` FLOPs each.
    """
    model = get_model(tm.model)
    gpu = get_gpu(tm.gpu)
    dtype = resolved_dtype(tm, model)
    t = roofline_terms(model, gpu, tm.tp, dtype)
    kernel = expert_kernel(model, tm.tp, gpu, dtype)
    if kernel is not None:
        t["flops_per_token"] += t["expert_flops_per_token"] * (tm.compute_efficiency / kernel.share - 1.0)
    t["attn_rate"] = t["attention_flops"] * tm.attention_efficiency
    t["req_s"] = tm.overhead_per_req_s
    return {
        "kind": TIME_MODEL_KINDS["roofline"],
        "flops_per_token": t["flops_per_token"],
        "attn_flops": t["attn_flops"],
        "attn_flops_prefill": t["attn_flops_prefill"],
        "ctx_flops": t["ctx_flops"],
        "decode_max_tokens": MLA_DECODE_MAX_TOKENS,
        "kv_bytes": t["kv_bytes"],
        "window": t["window"],
        "state_bytes": t["state_bytes"],
        "weight_bytes": t["weight_bytes"],
        "flops_rate": t["matmul_flops"] * tm.compute_efficiency,
        "bytes_rate": t["peak_bytes"] * tm.bandwidth_efficiency,
        "overhead_s": tm.overhead_s,
        **{k: t[k] for k in ("req_s", "flops_per_req", "attn_rate", "moe_experts", "moe_log_miss",
                             "moe_expert_bytes", "comm_s", "comm_per_token_s")},
    }
