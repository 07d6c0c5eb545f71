"""Reader of the oracle trace format (``trace.jsonl`` of the recorded vLLM runs).

One JSON object per line: ``request_id``, ``prompt_len``, ``max_tokens``,
``arrival_step`` (engine iteration) or ``arrival_time`` (seconds), optional
``prefix_group``/``prefix_len`` (the first ``prefix_len`` prompt tokens are
the shared stream of that group), ``priority`` and ``accept`` (speculative
decoding: drafts accepted at the request's 1st, 2nd, ... verification, cycled).  Every prefix group and
every request owns a token stream; the token at position ``p`` of the prompt
is ``(group stream, p)`` below ``prefix_len`` and ``(request stream, p)`` from
there on.
"""

from __future__ import annotations

import os

from aisim.errors import TraceError
from aisim.traces.common import INT32_LIMIT, BadRows, finish, int_field, json_object, number_field, open_text
from aisim.traces.schema import canonical_segments, stream_id, trace_table

_KEYS = {"request_id", "prompt_len", "max_tokens", "arrival_step", "arrival_time",
         "prefix_group", "prefix_len", "priority", "accept"}


def read_oracle_trace(path: str | os.PathLike, max_model_len: int | None = None, *, skip_bad_rows: bool = False):
    """Read an oracle ``trace.jsonl`` into the trace table.

    Parameters
    ----------
    path : path-like
        The JSONL file.
    max_model_len : int, optional
        When given, a prompt that leaves no room for an output token
        (``prompt_len >= max_model_len``) is an error naming its line, as vLLM
        rejects over-long prompts before they reach the scheduler.
    skip_bad_rows : bool
        Skip and count bad lines instead of raising (metadata ``bad_rows``,
        see :func:`aisim.traces.common.bad_rows`).

    Returns
    -------
    pyarrow.Table
        Rows in arrival order; metadata ``clock`` is ``step`` or ``time``,
        ``format=oracle`` and ``bad_rows``.

    Raises
    ------
    TraceError
        A malformed line, naming ``file:line`` and the field (unless skipped).
    """
    path = os.fspath(path)
    rows = {k: [] for k in ("request_id", "arrival_step", "arrival_s", "prompt_tokens",
                            "output_tokens", "priority", "segments", "accept")}
    state = {"clock": None}
    seen = {}
    bad = BadRows(skip_bad_rows)
    with open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = _row(line, where, max_model_len, state, seen)
            except TraceError as exc:
                bad.record(exc)
                continue
            seen[row["request_id"]] = lineno
            for k, v in row.items():
                rows[k].append(v)
    if state["clock"] is None:
        raise TraceError(f"{path}: the trace has no requests"
                         + (f" ({bad.count} bad lines skipped)" if bad.count else ""))
    return finish(trace_table(rows, state["clock"]), "oracle", bad)


def _row(line, where, max_model_len, state, seen) -> dict:
    """One line as the trace table's row; ``state["clock"]`` is set by the first good line."""
    obj = json_object(line, where)
    for k in obj:
        if k not in _KEYS:
            raise TraceError(f"{where}: unknown field '{k}'")
    rid = obj.get("request_id")
    if not isinstance(rid, str) or not rid:
        raise TraceError(f"{where}: field 'request_id' must be a non-empty string")
    if rid in seen:
        raise TraceError(f"{where}: request_id '{rid}' already used on line {seen[rid]}")
    prompt = int_field(obj, "prompt_len", where, 1)
    max_tokens = int_field(obj, "max_tokens", where, 1)
    if max_model_len is not None and prompt >= max_model_len:
        raise TraceError(
            f"{where}: field 'prompt_len' ({prompt}) must be below max_model_len "
            f"({max_model_len}); vLLM rejects such a prompt"
        )
    has_step, has_time = "arrival_step" in obj, "arrival_time" in obj
    if has_step == has_time:
        raise TraceError(f"{where}: exactly one of 'arrival_step' and 'arrival_time' is required")
    kind = "step" if has_step else "time"
    clock = state["clock"]
    if clock is not None and clock != kind:
        raise TraceError(f"{where}: mixes 'arrival_{kind}' with earlier 'arrival_{clock}' lines")
    if has_step:
        step, seconds = int_field(obj, "arrival_step", where, 0, high=2**63), None
    else:
        step, seconds = None, number_field(obj, "arrival_time", where, low=0)
    prefix_len = int_field(obj, "prefix_len", where, 0, default=0)
    if prefix_len > prompt:
        raise TraceError(f"{where}: field 'prefix_len' ({prefix_len}) exceeds 'prompt_len' ({prompt})")
    segs = []
    if prefix_len > 0:
        if "prefix_group" not in obj:
            raise TraceError(f"{where}: field 'prefix_group' is required with 'prefix_len'")
        group = int_field(obj, "prefix_group", where, 0, high=2**63)
        segs.append((stream_id("prefix-group", str(group)), 0, prefix_len))
    segs.append((stream_id("prompt", rid), prefix_len, prompt - prefix_len))
    priority = int_field(obj, "priority", where, -INT32_LIMIT, default=0)
    accept = obj.get("accept")
    if accept is not None:
        if not isinstance(accept, list) or not accept or not all(
                isinstance(a, int) and not isinstance(a, bool) and 0 <= a < INT32_LIMIT for a in accept):
            raise TraceError(f"{where}: field 'accept' must be a non-empty list of non-negative integers, "
                             f"got {accept!r}")
    state["clock"] = kind
    return {"request_id": rid, "arrival_step": step, "arrival_s": seconds, "prompt_tokens": prompt,
            "output_tokens": max_tokens, "priority": priority, "segments": canonical_segments(segs),
            "accept": accept}
