"""Roofline coefficients from GPU and model specs.

A step's compute is ``2 * active_params`` FLOPs per scheduled token plus
attention: ``4 * heads * head_size`` FLOPs per layer for every pair of a new
token and a context token (a sliding window caps the context).  Its memory
traffic is the weights, read once, plus every scheduled request's KV cache
(K and V of each context token in each attention layer; a window caps it) and
its recurrent state (a constant per request).  Tensor parallelism divides
weights, KV heads and states across GPUs.
"""

from __future__ import annotations

from aisim._core.constants import TIME_MODEL_KINDS
from aisim.config.catalog import get_gpu, get_model


def roofline_args(tm) -> dict:
    """Core arguments of the roofline model of ``tm`` (an engine's TimeModel)."""
    model = get_model(tm.model)
    gpu = get_gpu(tm.gpu)
    tp = tm.tp
    attn_flops, kv_bytes, window = [], [], []
    state = 0.0
    for layer in model.layers:
        if layer.num_kv_heads:
            attn_flops.append(4.0 * model.num_heads * layer.head_size * layer.count / tp)
            kv_bytes.append(float(layer.bytes_per_token(tp) * layer.count))
            window.append(int(layer.sliding_window or 0))
        if layer.state_bytes:
            state += layer.state_bytes * layer.count / tp
    active = model.active_params or model.params
    return {
        "kind": TIME_MODEL_KINDS["roofline"],
        "flops_per_token": 2.0 * active / tp,
        "attn_flops": attn_flops,
        "kv_bytes": kv_bytes,
        "window": window,
        "state_bytes": state,
        "weight_bytes": active * model.weight_bytes / tp,
        "flops_rate": gpu.flops * tm.compute_efficiency,
        "bytes_rate": gpu.hbm_bytes_per_s * tm.bandwidth_efficiency,
        "overhead_s": tm.overhead_s,
    }
