"""The CUDA-graph sizes vLLM captures, and the padding of a step's tokens to them.

vLLM runs a step of ``T`` scheduled tokens under a captured CUDA graph when ``T`` is at most
``max_cudagraph_capture_size``: the graph of the smallest captured size ``>= T`` (a FULL graph for
a batch of uniform decodes, a PIECEWISE one otherwise; ``CudagraphDispatcher.dispatch``,
``vllm/v1/cudagraph_dispatcher.py``), its matrix products and all-reduces over the padded
tokens.  Larger steps run eagerly on their own tokens.

The default sizes (``VllmConfig._set_cudagraph_sizes``, ``vllm/config/vllm.py``, vLLM 0.31-0.33;
no ``compilation_config`` of the user's, ``performance_mode`` not ``interactivity``):

* ``max = min(max_num_seqs x q x 2, 1024 on compute capability 10 else 512)`` with ``q`` the
  tokens of a uniform decode (1, or ``1 + num_speculative_tokens``), then
  ``min(max_num_batched_tokens, max)``;
* sizes 1, 2, 4, then every 8 below 256, then every 16 from 256 up to ``max``;
  ``max_num_batched_tokens`` when it is at most ``max``;
* the uniform decode sizes: ``max_num_seqs`` when ``q`` is 1 and it fits under ``max``; with drafts
  ``q x`` each request count of the same grid up to ``max_num_seqs`` that fits (dynamic
  speculative decoding's tiers are not modelled).
"""

from __future__ import annotations

import bisect

# vllm/config/vllm.py: default_max_graph_size, 1024 on compute capability 10 (Blackwell), else 512.
DEFAULT_MAX_GRAPH_SIZE = 512
BLACKWELL_MAX_GRAPH_SIZE = 1024


def _grid(top: int) -> list[int]:
    """1, 2, 4, every 8 below 256, every 16 from 256, up to ``top``."""
    sizes = [i for i in (1, 2, 4) if i <= top]
    if top >= 8:
        sizes += list(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes += list(range(256, top + 1, 16))
    return sizes


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, capability: int = 0,
                  num_speculative_tokens: int = 0) -> list[int]:
    """The batch sizes (tokens) vLLM captures CUDA graphs for, ascending.

    Parameters
    ----------
    max_num_seqs, max_num_batched_tokens : int
        The scheduler's limits.
    capability : int
        The GPU's CUDA compute capability, major version (:class:`aisim.config.gpus.GPUSpec`).
    num_speculative_tokens : int
        Drafts verified per request and step (0: none).

    Examples
    --------
    >>> capture_sizes(4, 8192)[-3:]
    [2, 4, 8]
    >>> s = capture_sizes(256, 8192); (len(s), s[-1])
    (51, 512)
    """
    q = 1 + num_speculative_tokens
    ceiling = BLACKWELL_MAX_GRAPH_SIZE if capability == 10 else DEFAULT_MAX_GRAPH_SIZE
    top = min(max_num_seqs * q * 2, ceiling)
    if q > 1:
        reqs = min(max_num_seqs, ceiling)
        uniform = [n * q for n in sorted(set(_grid(reqs) + [reqs])) if n * q <= top]
    else:
        uniform = [max_num_seqs] if max_num_seqs <= top else []
    top = min(max_num_batched_tokens, top)
    sizes = _grid(top)
    if max_num_batched_tokens <= top:
        sizes.append(max_num_batched_tokens)
    sizes += [s for s in uniform if s <= max_num_batched_tokens]
    return sorted(set(sizes))


def padded(tokens: int, sizes) -> int:
    """The tokens a step of ``tokens`` runs on: the smallest size ``>= tokens``, or ``tokens`` past the last."""
    i = bisect.bisect_left(sizes, tokens)
    return sizes[i] if i < len(sizes) else tokens
