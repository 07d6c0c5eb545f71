"""A ``vllm bench serve`` run rebuilt as a trace: its requests' lengths and the client's send times.

Lengths: each request's own (``input_lens``, ``output_lens``) when the file kept them
(``--save-detailed``); else the run's totals spread evenly (the first ``total % n`` requests one
token longer), so the replay sends exactly the tokens the run did.  A random dataset's shared
prefix (``random_prefix_len`` in the metadata) is one prefix group: vLLM's ``RandomDataset``
draws the prefix tokens once for every prompt (``vllm/benchmarks/datasets/datasets.py``).  The
prompts are otherwise distinct (no prefix hits), as the random dataset's are.

Send times follow ``vllm/benchmarks/serve.py`` ``get_request``: gap ``i`` (the first one too) is
``gamma(shape=burstiness, scale=1 / (request_rate * burstiness))`` (1: Poisson; infinite
burstiness: every gap ``1 / request_rate``), the sends are their running sums, rescaled so the
last is ``num_prompts / request_rate``; at rate ``inf`` every request is sent at 0.  vLLM draws
the gaps one by one from NumPy's global state, which ``main_async`` seeds with
``np.random.seed(--seed)`` (0 unless given; the random dataset draws from a generator of its own,
``RandomDataset._rng``), so ``seed`` being the run's ``--seed`` redraws its sends exactly.  A run
with ``max_concurrency`` has its sends held by the cap (``replay(..., max_concurrency=C)``).

The client before vLLM 0.10 (``benchmarks/benchmark_serving.py``, until pull request 21108 made
the gaps precomputed and rescaled) sent differently, and its sends can be redrawn exactly from its
``--seed`` (:func:`legacy_send_times`): the first request at the start, then after each send a
``np.random.gamma`` gap from NumPy's global state, which ``main`` seeds with ``np.random.seed(seed)``
and the random dataset draws from first.
"""

from __future__ import annotations

import math

import numpy as np


def request_lengths(run) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output tokens of each request of ``run`` (:class:`~aisim.calibrate.benchserve.MeasuredRun`)."""
    n = run.num_prompts
    if run.input_lens is not None:
        prompt = np.asarray(run.input_lens, dtype=np.int64)
    else:
        prompt = _spread(run.total_input_tokens, n)
    if run.output_lens is not None:
        out = np.asarray(run.output_lens, dtype=np.int64)
    else:
        out = _spread(run.total_output_tokens, n)
    return prompt, np.maximum(out, 1)


def _spread(total: int, n: int) -> np.ndarray:
    """``total`` tokens over ``n`` requests as evenly as integers allow, the longer ones first.

    >>> _spread(10, 4).tolist()
    [3, 3, 2, 2]
    """
    base, extra = divmod(total, n)
    return np.array([base + 1] * extra + [base] * (n - extra), dtype=np.int64)


def send_times(n: int, rate: float, burstiness: float, seed: int = 0) -> np.ndarray:
    """The client's send times of ``n`` requests at ``rate`` with ``burstiness`` (seconds from the start).

    >>> send_times(4, 2.0, math.inf).tolist()
    [0.5, 1.0, 1.5, 2.0]
    >>> send_times(3, math.inf, 1.0).tolist()
    [0.0, 0.0, 0.0]
    """
    if math.isinf(rate):
        return np.zeros(n)
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / rate)
    else:
        state = np.random.RandomState(seed)
        gaps = np.array([state.gamma(shape=burstiness, scale=1.0 / (rate * burstiness)) for _ in range(n)])
    sends = np.cumsum(gaps)
    if sends[-1] > 0:
        sends = sends * (n / rate / sends[-1])   # serve.py: the last send at num_prompts / request_rate
    return sends


def legacy_send_times(n: int, rate: float, burstiness: float, seed: int, vocab_size: int,
                      input_range: tuple = (0, 0), output_range: tuple = (0, 0)) -> np.ndarray:
    """The sends of ``benchmark_serving.py`` before vLLM 0.10 (seconds from the start), as it drew them.

    ``main`` calls ``np.random.seed(seed)``; ``RandomDataset.sample`` (``benchmark_dataset.py``)
    draws ``np.random.randint`` of every prompt's length, every output's length (``input_range``,
    ``output_range``: inclusive; one value draws nothing) and of every prompt's offset into the
    tokenizer's ``vocab_size`` (Hugging Face's, added tokens left out); ``get_request`` then sends a
    request, draws ``np.random.gamma(shape=burstiness, scale=1 / (rate * burstiness))`` and sleeps
    that long, so the first request goes at 0 and the last gap is drawn but never slept.

    >>> float(legacy_send_times(3, 2.0, 1.0, 0, 128000)[0])
    0.0
    >>> legacy_send_times(2, math.inf, 1.0, 0, 128000).tolist()
    [0.0, 0.0]
    """
    if math.isinf(rate):
        return np.zeros(n)
    state = np.random.RandomState(seed)
    state.randint(input_range[0], input_range[1] + 1, size=n)
    state.randint(output_range[0], output_range[1] + 1, size=n)
    state.randint(0, vocab_size, size=n)
    gaps = [state.gamma(shape=burstiness, scale=1.0 / (rate * burstiness)) for _ in range(n)]
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])


def run_trace(run, seed: int = 0):
    """``run`` as a trace table, the replay's keyword arguments and the client's send times.

    Returns
    -------
    (pyarrow.Table, dict, numpy.ndarray)
        The trace (request ids ``r0``, ``r1``, ... in send order), ``{"max_concurrency": C}``
        when the run had a cap, and the send time of each request.
    """
    import pyarrow as pa

    from aisim.traces import from_frame

    n = run.num_prompts
    prompt, out = request_lengths(run)
    sends = send_times(n, run.request_rate, run.burstiness, seed)
    prefix = min(run.random_prefix_len or 0, int(prompt.min()))
    cols = {"request_id": [f"r{i}" for i in range(n)], "prompt_len": prompt.tolist(), "max_tokens": out.tolist(),
            "arrival_time": sends.tolist(),
            "prefix_group": [0] * n if prefix else list(range(n)), "prefix_len": [prefix] * n}
    kw = {"max_concurrency": run.max_concurrency} if run.max_concurrency is not None else {}
    return from_frame(pa.table(cols)), kw, sends
