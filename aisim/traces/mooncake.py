"""Reader of Mooncake JSONL traces (kvcache-ai/Mooncake ``FAST25-release``), full and delta.

One JSON object a line:

- ``timestamp``: arrival in milliseconds (any origin; the earliest request
  becomes ``arrival_s = 0``);
- ``input_length``, ``output_length``: prompt and output tokens (at least 1);
- ``hash_ids``: one id per ``unit_tokens``-token block of the prompt (512 in
  the published traces); the last block may be partial.  Id ``u`` stands for
  the tokens ``(stream_id("mooncake-unit", u), 0 .. unit_tokens)``, so two
  requests share a block iff they share its id.  The list must have exactly
  ``ceil(input_length / unit_tokens)`` ids, which catches a wrong unit size;
  an empty or absent list makes the whole prompt private;
- optional ``session_id`` (multi-turn: ``turn`` counts the session's lines in
  file order), ``delay`` (milliseconds after the previous turn of the session
  *arrived*, used when ``timestamp`` is absent; an open-loop stand-in for the
  closed-loop "after the previous turn completed"), ``request_id`` (else
  ``<file stem>:<line>``), ``model`` (else the ``model`` option) and
  ``priority``.  Other fields are ignored.

In the ``mooncake-delta`` variant a later turn of a session carries only its
new input: its prompt is the previous turn's prompt, then the previous turn's
output tokens (``output_stream(previous request_id)``), then the new input.

The file is read line by line.  A bad line raises :class:`TraceError`
naming ``file:line`` and the field, or with ``skip_bad_rows=True`` is counted
(metadata ``bad_rows``, see :func:`aisim.traces.common.bad_rows`); a skipped
line also spoils the later turns of its session, which are skipped and counted
too.
"""

from __future__ import annotations

import os

from aisim.errors import TraceError
from aisim.traces.common import (BadRows, check_option, file_stem, finish, hash_id_list, id_field, int_field,
                                 json_object,
                                 new_rows, number_field, open_text, unit_segments)
from aisim.traces.schema import canonical_segments, output_stream, stream_id, trace_table


class _Turn:
    """What the next turn of a session needs from the previous one."""

    __slots__ = ("turn", "arrival_ms", "segments", "prompt", "output", "request_id")

    def __init__(self, turn, arrival_ms, segments, prompt, output, request_id):
        self.turn, self.arrival_ms, self.segments = turn, arrival_ms, segments
        self.prompt, self.output, self.request_id = prompt, output, request_id


class _Broken:
    """A session whose earlier line was bad."""

    __slots__ = ("line",)

    def __init__(self, line):
        self.line = line


def read_mooncake(path: str | os.PathLike, *, unit_tokens: int = 512, model: str | None = None,
                  delta: bool = False, namespace: str | None = None, skip_bad_rows: bool = False):
    """Read a Mooncake JSONL trace into the trace table (clock ``time``).

    Parameters
    ----------
    path : path-like
        The JSONL file.
    unit_tokens : int
        Tokens per hash id (the trace's block size; 512 for the published traces).
    model : str, optional
        Model of every request without a ``model`` field.
    delta : bool
        Later turns of a session carry only their new input (``mooncake-delta``).
    namespace : str, optional
        Keep this file's hash ids apart from another file's equal ids (ids
        ``u`` become ``namespace:u``); by default equal ids share tokens.
    skip_bad_rows : bool
        Skip and count bad lines instead of raising.

    Returns
    -------
    pyarrow.Table
        Rows in arrival order; metadata ``clock=time``, ``format``,
        ``unit_tokens`` and ``bad_rows``.

    Raises
    ------
    TraceError
        A malformed line, naming ``file:line`` and the field (unless skipped).
    """
    path = os.fspath(path)
    check_option("unit_tokens", unit_tokens)
    fmt = "mooncake-delta" if delta else "mooncake"
    stem = file_stem(path)
    rows = new_rows()
    arrival_ms = []
    bad = BadRows(skip_bad_rows)
    sessions = {}
    seen_ids = {}
    units = {}

    def unit_place(u):
        s = units.get(u)
        if s is None:
            s = units[u] = (stream_id("mooncake-unit", str(u) if namespace is None else f"{namespace}:{u}"), 0)
        return s

    with open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json_object(line, where)
                sid = id_field(obj, "session_id", where)
            except TraceError as exc:
                bad.record(exc)
                continue
            prev = sessions.get(sid) if sid is not None else None
            try:
                if isinstance(prev, _Broken):
                    raise TraceError(f"{where}: field 'session_id': session '{sid}' follows its bad line {prev.line}")
                row = _row(obj, where, stem, lineno, prev, delta, unit_tokens, unit_place, model)
                rid = row["request_id"]
                if rid in seen_ids:
                    raise TraceError(f"{where}: field 'request_id': '{rid}' already used on line {seen_ids[rid]}")
            except TraceError as exc:
                bad.record(exc)
                if sid is not None and not isinstance(prev, _Broken):
                    sessions[sid] = _Broken(lineno)
                continue
            seen_ids[rid] = lineno
            if sid is not None:
                row["session_id"] = sid
                row["turn"] = prev.turn + 1 if prev is not None else 0
                sessions[sid] = _Turn(row["turn"], row["arrival_ms"], row["segments"], row["prompt_tokens"],
                                      row["output_tokens"], rid)
            arrival_ms.append(row.pop("arrival_ms"))
            for k, v in row.items():
                rows[k].append(v)
    if not arrival_ms:
        raise TraceError(f"{path}: the trace has no requests" + (f" ({bad.count} bad lines skipped)"
                                                                  if bad.count else ""))
    t0 = min(arrival_ms)
    rows["arrival_s"] = [(t - t0) / 1000.0 for t in arrival_ms]
    return finish(trace_table(rows, "time"), fmt, bad, unit_tokens)


def read_mooncake_delta(path: str | os.PathLike, *, unit_tokens: int = 512, model: str | None = None,
                        namespace: str | None = None, skip_bad_rows: bool = False):
    """Read a ``mooncake-delta`` trace: :func:`read_mooncake` with ``delta=True``."""
    return read_mooncake(path, unit_tokens=unit_tokens, model=model, delta=True, namespace=namespace,
                         skip_bad_rows=skip_bad_rows)


def _row(obj, where, stem, lineno, prev, delta, unit, unit_place, model) -> dict:
    rid = id_field(obj, "request_id", where) or f"{stem}:{lineno}"
    inp = int_field(obj, "input_length", where, 1)
    out = int_field(obj, "output_length", where, 1)
    ids = hash_id_list(obj, "hash_ids", where)
    new = unit_segments(ids, inp, unit, unit_place, stream_id("prompt", rid), where, partial_ok=False)
    if obj.get("timestamp") is not None:
        t = number_field(obj, "timestamp", where)
    elif obj.get("delay") is not None:
        if prev is None:
            raise TraceError(f"{where}: field 'timestamp' is missing and 'delay' needs an earlier turn of "
                             "the same session_id")
        t = prev.arrival_ms + number_field(obj, "delay", where, low=0)
    else:
        raise TraceError(f"{where}: missing field 'timestamp'")
    if delta and prev is not None:
        segs = canonical_segments(prev.segments + [(output_stream(prev.request_id), 0, prev.output)] + new)
        prompt = prev.prompt + prev.output + inp
    else:
        segs = canonical_segments(new)
        prompt = inp
    if prompt >= 2**31:
        raise TraceError(f"{where}: field 'input_length': the prompt grows to {prompt} tokens, beyond int32")
    m = obj.get("model", model)
    if m is not None and not isinstance(m, str):
        raise TraceError(f"{where}: field 'model' must be a string, got {m!r}")
    priority = int_field(obj, "priority", where, -(2**31), default=0)
    return {"model": m, "request_id": rid, "session_id": None, "turn": 0, "arrival_step": None,
            "arrival_ms": t, "prompt_tokens": prompt, "output_tokens": out, "priority": priority,
            "segments": segs}
