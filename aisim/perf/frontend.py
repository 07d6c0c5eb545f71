"""The API server in front of the engine: a serial queue that spaces arrivals.

vLLM's OpenAI-compatible server handles every request in one process before the engine
sees it (``vllm/entrypoints/openai/serving_chat.py`` ``OpenAIServingChat.create_chat_completion``:
the chat template, tokenization, then ``AsyncLLM.add_request``, ``vllm/v1/engine/async_llm.py``),
and streams every output token back through the same process.  Under a burst of requests
this work, not the GPU, is what a client waits for.  aisim models it as one server working
through the requests in the order they were sent, each taking

    per_request_s + per_token_s x prompt tokens

so request ``i`` reaches the engine at ``e_i = max(send_i, e_{i-1}) + s_i`` (the Lindley
recursion of a single FIFO server).  The engine replays the requests at ``e_i``; the
client's latencies still count from ``send_i``.  The two costs are fitted, with the
roofline's efficiencies, to published measurements (``benchmarks/timing_accuracy.py``);
:data:`PER_REQUEST_S` and :data:`PER_TOKEN_S` are the fitted values.
"""

from __future__ import annotations

import numpy as np

# Fitted by ``python benchmarks/timing_accuracy.py --fit`` (benchmarks/data/README.md).
PER_REQUEST_S = 0.0023
PER_TOKEN_S = 1.9e-5


def service_s(prompt_len, per_request_s: float = PER_REQUEST_S, per_token_s: float = PER_TOKEN_S) -> np.ndarray:
    """Seconds the API server spends on each request before the engine sees it.

    Parameters
    ----------
    prompt_len : array_like of int
        Prompt tokens of each request.
    per_request_s, per_token_s : float
        The fixed cost of a request and the cost of each prompt token.

    Returns
    -------
    numpy.ndarray
        One float64 per request.
    """
    return per_request_s + per_token_s * np.asarray(prompt_len, dtype=np.float64)


def engine_arrivals(send_s, prompt_len, per_request_s: float = PER_REQUEST_S,
                    per_token_s: float = PER_TOKEN_S) -> np.ndarray:
    """When each request reaches the engine through the serial API server.

    Parameters
    ----------
    send_s : array_like of float
        When the client sent each request, in the order the server takes them
        (non-decreasing).
    prompt_len : array_like of int
        Prompt tokens of each request.
    per_request_s, per_token_s : float
        As :func:`service_s`.

    Returns
    -------
    numpy.ndarray
        ``e_i = max(send_i, e_{i-1}) + s_i``: with ``S_i`` the cumulative service,
        ``e_i = S_i + max_{k <= i} (send_k - S_{k-1})``.

    Raises
    ------
    ValueError
        Sends out of order, lengths that differ, or a negative cost.
    """
    send = np.asarray(send_s, dtype=np.float64)
    s = service_s(prompt_len, per_request_s, per_token_s)
    if send.shape != s.shape:
        raise ValueError(f"{len(send)} send times for {len(s)} prompts")
    if per_request_s < 0 or per_token_s < 0:
        raise ValueError("API server costs must be non-negative")
    if len(send) and np.any(np.diff(send) < 0):
        raise ValueError("send times must be non-decreasing")
    done = np.cumsum(s)
    return done + np.maximum.accumulate(send - (done - s))
