"""The API server in front of the engine: a serial queue that spaces arrivals.

vLLM's OpenAI-compatible server handles every request in one process before the engine
sees it (``vllm/entrypoints/openai/serving_chat.py`` ``OpenAIServingChat.create_chat_completion``
and ``serving_completion.py``: the chat template, tokenization through the renderer, then
``AsyncLLM.add_request``, ``vllm/v1/engine/async_llm.py``, whose ``InputProcessor`` builds the
engine request).  aisim models it as one server working through the requests in the order they
were sent, each taking

    per_request_s + per_token_s x prompt tokens

so request ``i`` reaches the engine at ``e_i = max(send_i, e_{i-1}) + s_i`` (the Lindley
recursion of a single FIFO server).  The engine replays the requests at ``e_i``; the
client's latencies count from ``send_i``.

The output side is not on the client's critical path between tokens: the engine core runs in its
own process, and the server's output handler (``AsyncLLM._run_output_handler``, a background task
of its event loop) detokenizes each step's outputs (``OutputProcessor.process_outputs``) while the
engine core computes the next step, so streaming delays every token of a request alike and leaves
its inter-token gaps to the engine.  It shares the event loop with the requests' tokenization, so
under load it slows the queue; the fitted costs carry that, and the first token's trip back, on
average (no separate per-output-token cost is modelled).

The replay applies it at its door (:func:`aisim.replay.replay`, :func:`aisim.deploy.deploy`, the
streamed replay under the pipeline, capacity and sweep): each request's service seconds
(:func:`request_costs`) go to the core, which runs the queue as it sends the requests (at their
arrival, at the release of the client's cap, or at a closed-loop turn's release).  The two costs
and the switch are time-model keys (``frontend``, ``frontend_per_request_s``,
``frontend_per_token_s``: :data:`aisim.config.keys.TIME_MODEL_KEYS`), fitted with the roofline's
efficiencies to published measurements (``benchmarks/timing_accuracy.py --fit``).
"""

from __future__ import annotations

import numpy as np

from aisim.config.keys import TIME_MODEL_KEYS

_DEFAULTS = {k.name: k.default for k in TIME_MODEL_KEYS}
PER_REQUEST_S = _DEFAULTS["frontend_per_request_s"]
PER_TOKEN_S = _DEFAULTS["frontend_per_token_s"]


def request_costs(engine, prompt_tokens, timed: bool = True):
    """The API server's seconds for each request of a replay, or None for an engine-only one.

    Parameters
    ----------
    engine : aisim.config.engine.EngineConfig
        Its time model's ``frontend`` switch and costs.
    prompt_tokens : array_like of int
        Prompt tokens of each request.
    timed : bool
        The trace is clocked in seconds; a trace clocked by engine step has no client clock,
        so it runs engine only.

    Returns
    -------
    numpy.ndarray or None
        One float64 per request (:func:`service_s`), or None.
    """
    tm = engine.time_model
    if not timed or not tm.frontend:
        return None
    return service_s(prompt_tokens, tm.frontend_per_request_s, tm.frontend_per_token_s)


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
