"""Reader of the oracle trace format (``trace.jsonl`` of the recorded vLLM runs).

One JSON object per line: ``request_id``, ``prompt_len``, ``max_tokens``,
``arrival_step`` (engine iteration) or ``arrival_time`` (seconds), optional
``prefix_group``/``prefix_len`` (the first ``prefix_len`` prompt tokens are
the shared stream of that group) and ``priority``.  Every prefix group and
every request owns a token stream; the token at position ``p`` of the prompt
is ``(group stream, p)`` below ``prefix_len`` and ``(request stream, p)`` from
there on.
"""

from __future__ import annotations

import os

from aisim.errors import TraceError
from aisim.traces.common import int_field, json_object
from aisim.traces.schema import canonical_segments, stream_id, trace_table

_KEYS = {"request_id", "prompt_len", "max_tokens", "arrival_step", "arrival_time",
         "prefix_group", "prefix_len", "priority"}


def read_oracle_trace(path: str | os.PathLike, max_model_len: int | None = None):
    """Read an oracle ``trace.jsonl`` into the trace table.

    Parameters
    ----------
    path : path-like
        The JSONL file.
    max_model_len : int, optional
        When given, a prompt that leaves no room for an output token
        (``prompt_len >= max_model_len``) is an error naming its line, as vLLM
        rejects over-long prompts before they reach the scheduler.

    Returns
    -------
    pyarrow.Table
        Rows in arrival order; metadata ``clock`` is ``step`` or ``time``.

    Raises
    ------
    TraceError
        A malformed line, naming ``file:line`` and the field.
    """
    path = os.fspath(path)
    rows = {k: [] for k in ("request_id", "arrival_step", "arrival_s", "prompt_tokens",
                            "output_tokens", "priority", "segments")}
    clock = None
    seen = {}
    try:
        fh = open(path, encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            where = f"{path}:{lineno}"
            if not line.strip():
                continue
            obj = json_object(line, where)
            for k in obj:
                if k not in _KEYS:
                    raise TraceError(f"{where}: unknown field '{k}'")
            rid = obj.get("request_id")
            if not isinstance(rid, str) or not rid:
                raise TraceError(f"{where}: field 'request_id' must be a non-empty string")
            if rid in seen:
                raise TraceError(f"{where}: request_id '{rid}' already used on line {seen[rid]}")
            seen[rid] = lineno
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
            if clock is None:
                clock = kind
            elif clock != kind:
                raise TraceError(f"{where}: mixes 'arrival_{kind}' with earlier 'arrival_{clock}' lines")
            if has_step:
                rows["arrival_step"].append(int_field(obj, "arrival_step", where, 0))
                rows["arrival_s"].append(None)
            else:
                t = obj["arrival_time"]
                if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
                    raise TraceError(f"{where}: field 'arrival_time' must be a non-negative number, got {t!r}")
                rows["arrival_step"].append(None)
                rows["arrival_s"].append(float(t))
            prefix_len = int_field(obj, "prefix_len", where, 0, default=0)
            if prefix_len > prompt:
                raise TraceError(f"{where}: field 'prefix_len' ({prefix_len}) exceeds 'prompt_len' ({prompt})")
            segs = []
            if prefix_len > 0:
                if "prefix_group" not in obj:
                    raise TraceError(f"{where}: field 'prefix_group' is required with 'prefix_len'")
                group = int_field(obj, "prefix_group", where, 0)
                segs.append((stream_id("prefix-group", str(group)), 0, prefix_len))
            segs.append((stream_id("prompt", rid), prefix_len, prompt - prefix_len))
            priority = obj.get("priority", 0)
            if isinstance(priority, bool) or not isinstance(priority, int):
                raise TraceError(f"{where}: field 'priority' must be an integer, got {priority!r}")
            rows["request_id"].append(rid)
            rows["prompt_tokens"].append(prompt)
            rows["output_tokens"].append(max_tokens)
            rows["priority"].append(priority)
            rows["segments"].append(canonical_segments(segs))
    if clock is None:
        raise TraceError(f"{path}: the trace has no requests")
    return trace_table(rows, clock)
