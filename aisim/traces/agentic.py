"""Reader of agentic coding traces in the kv-cache-tester JSON format (callanjfox/kv-cache-tester).

One conversation a file::

    {"id": "trace_0277", "models": [...], "block_size": 64, "hash_id_scope": "local",
     "tool_tokens": 12166, "system_tokens": 2875,
     "requests": [
        {"t": 0.0, "type": "n", "model": "...", "in": 19560, "out": 1017, "hash_ids": [1, 2, ...],
         "api_time": 18.78, "think_time": 0.0, ...},
        {"t": 79.2, "type": "subagent", "agent_id": "agent_001", "models": [...],
         "tool_tokens": 7401, "system_tokens": 1022, "requests": [{"t": 0.0, ...}, ...]},
        ...]}

How it becomes the trace table:

- Every request (sub-agents' included, at any depth) is one row.  A
  top-level request arrives at ``t``; a sub-agent's request at the sub-agent's
  ``t`` plus its own ``t`` (its times count from the sub-agent's start).
  Conversation ``k`` of a multi-file read starts at ``k * stagger_s``
  (default: all at 0).
- ``session_id`` is the conversation id (``id``, else the file stem); a
  sub-agent is its own session ``<id>/<agent_id>``; ``turn`` is the request's
  index in its session; ``request_id`` is ``<session>:<turn>``.
- ``model`` is the request's ``model``, else its container's single entry
  of ``models``, else the ``model`` option.
- ``hash_ids`` are ids of ``block_size``-token blocks (the traces give ids
  for the full blocks only; the remaining ``in % block_size`` tokens are
  private to the request).  With ``hash_id_scope: "local"`` (the default) ids
  are private to the file, sub-agents sharing the parent's namespace: no two
  files share a block.  With ``"global"`` equal ids share tokens across files.
  Block ``u`` is the tokens ``u * block_size ..`` of its namespace's stream,
  so a run of consecutive ids is one segment.
- The traces' tool and system prompts are not in the ids.  With
  ``warm_prefix_pct = p`` the first ``floor(p * (tool_tokens + system_tokens))``
  tokens of every request (the container's token counts) are instead one
  prefix shared by every conversation of the same model, as the tester's
  ``--warm-prefix-pct`` does; the default 0 keeps the ids as they are.
- ``api_time``, ``think_time``, ``stop`` and the type fields are ignored (the
  replay times requests by ``t``, the tester's ``original`` strategy).

``path`` is a file, a directory (every ``*.json`` in it) or a glob; the files
are read one at a time in sorted order into one table.  A bad request raises
:class:`TraceError` naming ``file:line``, its position (``requests[3]``) and
the field, or with ``skip_bad_rows=True`` is counted (a file that cannot be
read at all counts as one bad row).
"""

from __future__ import annotations

import glob
import json
import math
import os

from aisim.errors import TraceError
from aisim.traces.common import (BadRows, drop_prefix, file_stem, finish, hash_id_list, id_field, int_field,
                                 new_rows, number_field, unit_segments)
from aisim.textin import DuplicateKey, decode_utf8, duplicate_message, read_bytes
from aisim.traces.jsonpos import Located, load_with_lines
from aisim.traces.schema import canonical_segments, stream_id, trace_table

_SHARED_STREAM_IDS = 1 << 40


def trace_files(path: str) -> list[str]:
    """The files ``path`` names: itself, the ``*.json`` of a directory, or a glob's matches (sorted)."""
    if any(c in path for c in "*?["):
        files = sorted(f for f in glob.glob(path) if os.path.isfile(f))
    elif os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path)
                       if f.endswith(".json") and os.path.isfile(os.path.join(path, f)))
    else:
        files = [path]
    if not files:
        raise TraceError(f"{path}: no agentic trace files (*.json) found")
    return files


def read_agentic(path: str | os.PathLike, *, model: str | None = None, warm_prefix_pct: float = 0.0,
                 stagger_s: float = 0.0, skip_bad_rows: bool = False):
    """Read kv-cache-tester agentic conversations into one trace table (clock ``time``).

    Parameters
    ----------
    path : path-like
        A JSON file, a directory of them or a glob pattern.
    model : str, optional
        Model of the requests that name none (and whose container names not exactly one).
    warm_prefix_pct : float
        Fraction (0 to 1) of each request's tool and system tokens treated as
        one prefix shared by every conversation of the same model.
    stagger_s : float
        Start of conversation ``k`` (in sorted file order) is ``k * stagger_s``.
    skip_bad_rows : bool
        Skip and count bad requests (and unreadable files) instead of raising.

    Returns
    -------
    pyarrow.Table
        Rows in arrival order; metadata ``clock=time``, ``format=agentic``,
        ``unit_tokens`` (the block size, when every file agrees) and ``bad_rows``.

    Raises
    ------
    TraceError
        A malformed file or request, naming ``file:line``, its position and the field.
    """
    path = os.fspath(path)
    if isinstance(warm_prefix_pct, bool) or not isinstance(warm_prefix_pct, (int, float)) \
            or not 0 <= warm_prefix_pct <= 1:
        raise TraceError(f"option 'warm_prefix_pct' must be a number from 0 to 1, got {warm_prefix_pct!r}")
    if isinstance(stagger_s, bool) or not isinstance(stagger_s, (int, float)) or not stagger_s >= 0 \
            or not math.isfinite(stagger_s):
        raise TraceError(f"option 'stagger_s' must be a non-negative number, got {stagger_s!r}")
    reader = _Reader(model, float(warm_prefix_pct), BadRows(skip_bad_rows))
    for k, f in enumerate(trace_files(path)):
        try:
            reader.conversation(f, k * float(stagger_s))
        except TraceError as exc:
            reader.bad.record(exc)
    if not reader.rows["request_id"]:
        raise TraceError(f"{path}: the trace has no requests"
                         + (f" ({reader.bad.count} bad rows skipped)" if reader.bad.count else ""))
    sizes = reader.block_sizes
    table = trace_table(reader.rows, "time")
    return finish(table, "agentic", reader.bad, sizes.pop() if len(sizes) == 1 else None)


class _Reader:
    def __init__(self, model, warm_pct, bad):
        self.model = model
        self.warm_pct = warm_pct
        self.bad = bad
        self.rows = new_rows()
        self.conversations = {}
        self.request_ids = set()
        self.block_sizes = set()

    def conversation(self, f: str, start: float) -> None:
        """Read one file; a file-level error propagates (one bad row), request errors are recorded."""
        data = read_bytes(f, TraceError, "trace")
        text = decode_utf8(data, f, TraceError)
        try:
            doc = load_with_lines(text)
        except DuplicateKey as exc:
            raise TraceError(f"{f}:{exc.line}: {duplicate_message(exc.key)}") from None
        except json.JSONDecodeError as exc:
            raise TraceError(f"{f}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno})") from None
        where = f"{f}:1"
        if not isinstance(doc, dict):
            raise TraceError(f"{where}: expected a JSON object (one conversation)")
        block = int_field(doc, "block_size", where, 1)
        scope = doc.get("hash_id_scope", "local")
        if scope not in ("local", "global"):
            raise TraceError(f"{where}: field 'hash_id_scope' must be 'local' or 'global', got {scope!r}")
        conv = id_field(doc, "id", where) or file_stem(f)
        if conv in self.conversations:
            raise TraceError(f"{where}: field 'id': conversation '{conv}' was already read from "
                             f"{self.conversations[conv]}")
        self.conversations[conv] = f
        self.block_sizes.add(block)
        ns = "global" if scope == "global" else f"local:{conv}"
        stream = stream_id("agentic-units", ns)

        def unit_place(u):
            # Block u is tokens u*block.. of the namespace's stream, so runs of consecutive ids merge
            # into one segment; ids too large for that get a stream each (still one place per id).
            if u < _SHARED_STREAM_IDS:
                return stream, u * block
            return stream_id("agentic-unit", f"{ns}:{u}"), 0

        self._session(doc, f, where, "requests", conv, start, block, unit_place)

    def _session(self, container, f, where, jpath, session, start, block, unit_place):
        reqs = container.get("requests")
        if not isinstance(reqs, list):
            raise TraceError(f"{where}: field 'requests' must be a list")
        tokens = int_field(container, "tool_tokens", where, 0, default=0) \
            + int_field(container, "system_tokens", where, 0, default=0)
        warm = int(self.warm_pct * tokens)
        models = container.get("models")
        default_model = models[0] if isinstance(models, list) and len(models) == 1 and \
            isinstance(models[0], str) else self.model
        turn = 0
        for i, item in enumerate(reqs):
            obj = item.value if isinstance(item, Located) else item
            line = item.line if isinstance(item, Located) else 1
            here = f"{f}:{line}: {jpath}[{i}]"
            try:
                if not isinstance(obj, dict):
                    raise TraceError(f"{here}: expected a JSON object")
                if obj.get("type") == "subagent":
                    t = number_field(obj, "t", here, low=0)
                    agent = id_field(obj, "agent_id", here) or f"sa{i}"
                    self._session(obj, f, here, f"{jpath}[{i}].requests", f"{session}/{agent}", start + t,
                                  block, unit_place)
                    continue
                rid = f"{session}:{turn}"
                row = self._request(obj, here, rid, start, block, unit_place, warm, default_model)
                if rid in self.request_ids:
                    raise TraceError(f"{here}: field 'agent_id': request id '{rid}' is not unique")
            except TraceError as exc:
                self.bad.record(exc)
                if not (isinstance(obj, dict) and obj.get("type") == "subagent"):
                    turn += 1
                continue
            self.request_ids.add(rid)
            row["session_id"] = session
            row["turn"] = turn
            turn += 1
            for k, v in row.items():
                self.rows[k].append(v)

    def _request(self, obj, where, rid, start, block, unit_place, warm, default_model) -> dict:
        t = number_field(obj, "t", where, low=0)
        inp = int_field(obj, "in", where, 1)
        out = int_field(obj, "out", where, 1)
        if inp >= 2**31 or out >= 2**31:
            raise TraceError(f"{where}: field '{'in' if inp >= 2**31 else 'out'}' must be below 2**31")
        ids = hash_id_list(obj, "hash_ids", where)
        segs = unit_segments(ids, inp, block, unit_place, stream_id("prompt", rid), where)
        m = obj.get("model", default_model)
        if m is not None and not isinstance(m, str):
            raise TraceError(f"{where}: field 'model' must be a string, got {m!r}")
        p = min(warm, inp)
        if p > 0:
            segs = [(stream_id("agentic-warm-prefix", m or ""), 0, p)] + drop_prefix(segs, p)
        return {"model": m, "request_id": rid, "arrival_step": None, "arrival_s": start + t,
                "prompt_tokens": inp, "output_tokens": out, "priority": 0,
                "segments": canonical_segments(segs)}
