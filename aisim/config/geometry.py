"""vLLM's start-up KV-cache layout, derived from a model's layers.

Reproduces, for the layer kinds of the catalog:

* page-size unification of hybrid attention + state models
  (``Platform._align_hybrid_block_size``): the attention block grows to
  ``A * cdiv(M, A * p1)`` tokens so that its page covers the state page, and
  the state page is padded to it (A = the kernel block, 16 here, or 64 with
  prefix caching in align mode as the seed's worked number has it);
* grouping of layers into KV-cache groups (``get_kv_cache_groups``): per spec,
  groups of ``group_size`` layers, where ``group_size`` is the smallest layer
  count of any spec, or the largest when the largest is below 1.5 times the
  smallest;
* the pool size from KV-cache bytes (``get_kv_cache_configs``):
  ``num_blocks = kv_bytes // (group_size * page)``.
"""

from __future__ import annotations

import math

from aisim.config.catalog import ModelSpec, check_tp
from aisim.config.kvgroups import KIND

GIB = 1 << 30


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def unified_block_size(model: ModelSpec, block_size: int = 16, prefix_caching: bool = True, tp: int = 1) -> int:
    """Attention block size after page-size unification with the state layers."""
    states = [layer for layer in model.layers if layer.state_bytes]
    attn = [layer for layer in model.layers if layer.num_kv_heads]
    if not states or not attn:
        return block_size
    p1 = max(layer.bytes_per_token(tp) for layer in attn)
    m = max(layer.state_bytes // tp for layer in states)
    a = max(64 if prefix_caching else 16, block_size)
    return max(block_size, a * _cdiv(m, a * p1))


def kv_cache_groups(model: ModelSpec, block_size: int = 16, prefix_caching: bool = True, tp: int = 1):
    """KV-cache groups of ``model`` as configuration dicts, and the block size.

    Returns
    -------
    (list of dict, int)
        Groups in vLLM's order (specs by first appearance, ``group_size`` layers
        each) with ``type``, ``count``, ``page_size_bytes``, ``num_layers`` and
        kind-specific keys; the engine block size.
    """
    check_tp(model, tp)
    bs = unified_block_size(model, block_size, prefix_caching, tp)
    attn = [layer for layer in model.layers if layer.num_kv_heads]
    page = bs * max((layer.bytes_per_token(tp) for layer in attn), default=0)
    if not page:
        page = max(layer.state_bytes // tp for layer in model.layers)
    counts = [layer.count for layer in model.layers]
    small, large = min(counts), max(counts)
    group_size = large if large < 1.5 * small else small
    groups = []
    for layer in model.layers:
        g = {"type": layer.kind, "count": math.ceil(layer.count / group_size),
             "page_size_bytes": page, "num_layers": group_size,
             "prefix_cacheable": KIND[layer.kind].prefix_cacheable}
        if layer.kind == "sliding_window":
            g["sliding_window"] = layer.sliding_window
        if layer.state_bytes:
            align = layer.prefill_checkpoint_alignment
            g["prefill_checkpoint_blocks"] = 1 if align else 0
            if align:
                g["prefill_checkpoint_alignment"] = align
        groups.append(g)
    # Full attention is looked up first, but group ids follow layer order.
    return groups, bs


def weights_bytes_per_gpu(model: ModelSpec, tp: int = 1, dtype: str | None = None) -> float:
    """Bytes of one GPU's share of the weights, as the checkpoint stores them or as ``dtype``."""
    from aisim.config.modelspec import DTYPE_BYTES

    per_param = DTYPE_BYTES[dtype] if dtype else model.weight_bytes
    return model.params * per_param / tp


def kv_cache_bytes(model: ModelSpec, gpu_memory_gib: float, tp: int = 1, gpu_memory_utilization: float = 0.9,
                   activation_gib: float = 1.0, dtype: str | None = None) -> int:
    """KV-cache bytes per GPU: the usable memory minus weights and activations."""
    budget = gpu_memory_gib * GIB * gpu_memory_utilization
    return int(budget - weights_bytes_per_gpu(model, tp, dtype) - activation_gib * GIB)


def num_blocks(groups, kv_bytes: int) -> int:
    """Blocks a pool of ``kv_bytes`` holds (``get_kv_cache_configs``)."""
    per_block = max(g["num_layers"] * g["page_size_bytes"] for g in groups)
    return max(kv_bytes // per_block, 0)
