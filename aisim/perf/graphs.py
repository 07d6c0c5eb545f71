"""The CUDA-graph sizes vLLM captures, and the padding of a step's tokens to them.

vLLM runs a step of ``T`` scheduled tokens under a captured CUDA graph when ``T`` is at most
``max_cudagraph_capture_size``: the graph of the smallest captured size ``>= T`` (a FULL graph for
a batch of uniform decodes, a PIECEWISE one otherwise; ``CudagraphDispatcher.dispatch``,
``vllm/v1/cudagraph_dispatcher.py``), its matrix products and all-reduces over the padded
tokens.  Larger steps run eagerly on their own tokens.

The default sizes (``VllmConfig._set_cudagraph_sizes``, ``vllm/config/vllm.py``, every release;
no ``compilation_config`` of the user's, ``performance_mode`` not ``interactivity``):

* ``max = min(max_num_seqs x q x 2, 1024 on compute capability 10 else 512)`` with ``q`` the
  tokens of a uniform decode (1, or ``1 + num_speculative_tokens``), then
  ``min(max_num_batched_tokens, max)``;
* sizes 1, 2, 4, then every 8 below 256, then every 16 from 256 up to ``max``;
  ``max_num_batched_tokens`` when it is at most ``max``;
* the uniform decode sizes: ``max_num_seqs`` when ``q`` is 1 and it fits under ``max``; with drafts
  ``q x`` each request count of the same grid up to ``max_num_seqs`` that fits (dynamic
  speculative decoding's tiers are not modelled).

How a step is padded to them is the release's ``cudagraph_rule`` (:class:`aisim.config.versions.Release`):

* ``"shared"`` (0.31-0.33, ``CudagraphDispatcher._create_padded_batch_descriptor``,
  ``vllm/v1/cudagraph_dispatcher.py``): every step, uniform decode or mixed, pads to the smallest of
  these sizes;
* ``"split"`` (0.34, ``VllmConfig._split_cudagraph_capture_sizes`` and
  ``CudaGraphManager.dispatch``, ``vllm/v1/worker/gpu/cudagraph_utils.py``): a mixed step pads to
  the prefill token sizes (these sizes; on compute capability 10 ``prefill_cudagraph_capture_grid``
  up to 8192 tokens), a uniform decode of ``q`` tokens a request to the smallest decode graph of
  ``n`` requests, ``n x q`` tokens.  The request counts are the sizes each rounded up to whole
  requests (``cdiv(s, q)``, at most ``max_num_seqs``, ``cdiv(s, q) x q`` within the largest size),
  or on compute capability 10 ``decode_cudagraph_capture_grid`` up to ``max_num_seqs``, kept up to
  the first one holding ``min(max_num_seqs, max_tokens // q)`` requests and clipped to it
  (``decode_cudagraph_capture_shapes``, ``vllm/config/compilation.py``).
"""

from __future__ import annotations

import bisect
import math
from typing import NamedTuple

# vllm/config/vllm.py: default_max_graph_size, 1024 on compute capability 10 (Blackwell), else 512.
DEFAULT_MAX_GRAPH_SIZE = 512
BLACKWELL_MAX_GRAPH_SIZE = 1024
# vllm/config/vllm.py VllmConfig._split_cudagraph_capture_sizes (0.34): on compute capability 10 the
# prefill grid reaches 8192 tokens and max_decode_cudagraph_capture_tokens defaults to 8192.
WIDE_GRAPH_TOKENS = 8192
# The rules of padding a step to a graph, by name (aisim.config.versions.Release.cudagraph_rule).
CUDAGRAPH_RULES = ("shared", "split")


class GraphSizes(NamedTuple):
    """The CUDA graphs a step may run in, as token counts, ascending.

    Attributes
    ----------
    tokens : list of int
        The token-keyed graphs: every step under the ``"shared"`` rule, mixed steps under ``"split"``.
    decode : list of int
        The uniform decode graphs (``n x q`` tokens; empty: decodes pad in ``tokens``).
    decode_q : int
        The tokens a request of a uniform decode schedules (``1 + num_speculative_tokens``).
    """

    tokens: list
    decode: list
    decode_q: int


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


def _walk_grid(limit: int, step) -> list[int]:
    """1, ..., ``limit``, each size the next multiple of the largest power of two not above ``step(size)``
    (``_walk_grid``, vllm/config/compilation.py, 0.34)."""
    grid, size = [], 1
    while size < limit:
        grid.append(size)
        stride = 1 << max(0, math.floor(math.log2(max(1.0, step(size)))))
        size = (size // stride + 1) * stride
    return [*grid, limit] if limit else []


def prefill_grid(max_tokens: int) -> list[int]:
    """``prefill_cudagraph_capture_grid`` (vllm/config/compilation.py, 0.34): 54 sizes at 8192."""
    return _walk_grid(max_tokens, lambda t: min(t, max(8, t / 4), 0.07 * max(t, 4096)))


def decode_grid(max_requests: int) -> list[int]:
    """``decode_cudagraph_capture_grid`` (vllm/config/compilation.py, 0.34): 64 sizes at 1024."""
    return _walk_grid(max_requests, lambda n: 0.65 * n ** (2 / 3))


def graph_sizes(rule: str, max_num_seqs: int, max_num_batched_tokens: int, capability: int = 0,
                num_speculative_tokens: int = 0) -> GraphSizes:
    """The graphs of a release's ``rule`` (:data:`CUDAGRAPH_RULES`) for these limits.

    Parameters
    ----------
    rule : {"shared", "split"}
        The release's ``cudagraph_rule``.
    max_num_seqs, max_num_batched_tokens, capability, num_speculative_tokens
        As :func:`capture_sizes`.

    Examples
    --------
    >>> g = graph_sizes("split", 8, 8192, num_speculative_tokens=3); g.decode
    [4, 8, 16, 24, 32]
    """
    q = 1 + num_speculative_tokens
    shared = capture_sizes(max_num_seqs, max_num_batched_tokens, capability, num_speculative_tokens)
    if rule == "shared":
        return GraphSizes(shared, [], q)
    if capability == 10:   # wide defaults: the prefill and decode grids of their own
        prefill = prefill_grid(min(WIDE_GRAPH_TOKENS, max_num_batched_tokens))
        reqs = decode_grid(max_num_seqs)
        budget = min(max_num_batched_tokens, WIDE_GRAPH_TOKENS)
    else:
        prefill, top = shared, shared[-1]
        reqs = sorted({min(-(-s // q), max_num_seqs) for s in shared if -(-s // q) * q <= top})
        budget = max_num_batched_tokens
    # decode_cudagraph_capture_shapes: the first request count past the limit is captured at it.
    limit = min(max_num_seqs, budget // q)
    reach = reqs[:bisect.bisect_left(reqs, limit) + 1] if limit >= 1 else []
    decode = sorted({min(n, limit) * q for n in reach})
    # CudaGraphManager: the decode graphs within the recorded largest size (decode_cudagraph_capture_max_tokens).
    top = max(prefill + decode, default=0)
    return GraphSizes(prefill, [d for d in decode if d <= top], q)


def step_graph(tokens: int, uniform_decode: bool, g: GraphSizes) -> int:
    """The tokens a step runs on under ``g``: a uniform decode's decode graph, else :func:`padded`."""
    if uniform_decode and g.decode and tokens <= g.decode[-1]:
        return padded(tokens, g.decode)
    return padded(tokens, g.tokens)


def padded(tokens: int, sizes) -> int:
    """The tokens a step of ``tokens`` runs on: the smallest size ``>= tokens``, or ``tokens`` past the last."""
    i = bisect.bisect_left(sizes, tokens)
    return sizes[i] if i < len(sizes) else tokens
