"""Reader of Mooncake JSONL traces (kvcache-ai/Mooncake ``FAST25-release``), full and delta.

One JSON object a line:

- ``timestamp``: arrival in milliseconds (any origin; the earliest request
  becomes ``arrival_s = 0``);
- ``input_length``, ``output_length``: prompt and output tokens (at least 1);
- ``hash_ids``: one id per ``unit_tokens``-token block of the prompt (512 in
  the published traces); the last block may be partial.  Id ``u`` stands for
  the tokens ``(unit_stream(u), 0 .. unit_tokens)`` (:func:`unit_stream`), so
  two requests share a block iff they share its id.  The list must have exactly
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

The file is read in blocks (:mod:`aisim.traces.blockread`): ``pyarrow.json``
parses a block and every field is checked at once (a block it refuses, or
with a value a check finds wrong, is read line by line); what a line owes to
earlier lines -- its session's previous turn, a request id used before, the
earliest timestamp -- is settled in file order by :meth:`MooncakeFormat.resolve`.
A bad line raises :class:`TraceError` naming ``file:line`` and the field, or
with ``skip_bad_rows=True`` is counted (metadata ``bad_rows``, see
:func:`aisim.traces.common.bad_rows`); a skipped line also spoils the later
turns of its session, which are skipped and counted too.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from aisim._core import tracescan
from aisim.arrowwrap import arrow_array
from aisim.errors import TraceError
from aisim.traces.blockread import BadLine, Bad, Parsed, Resolved, arrow_pays, ids_named_twice, no_requests, read_blocks, \
    segments_array, trace_rows
from aisim.traces.blocks import line_numbers, lines, plain_lines
from aisim.traces.jsonlines import read_uniform
from aisim.traces.common import (check_option, file_stem, hash_id_list, id_field, int_field, json_object,
                                 number_field, unit_segments)
from aisim.traces.oracle import _read_json
from aisim.traces.schema import canonical_segments, output_stream, stream_id

_JSON_SCHEMA = pa.schema([("timestamp", pa.float64()), ("input_length", pa.int64()), ("output_length", pa.int64()),
                          ("hash_ids", pa.list_(pa.int64())), ("session_id", pa.string()), ("delay", pa.float64()),
                          ("request_id", pa.string()), ("model", pa.string()), ("priority", pa.int64())])


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
    fmt = MooncakeFormat(unit_tokens=unit_tokens, model=model, delta=delta, namespace=namespace,
                         skip_bad_rows=skip_bad_rows)
    return read_blocks(os.fspath(path), fmt)


def read_mooncake_delta(path: str | os.PathLike, *, unit_tokens: int = 512, model: str | None = None,
                        namespace: str | None = None, skip_bad_rows: bool = False):
    """Read a ``mooncake-delta`` trace: :func:`read_mooncake` with ``delta=True``."""
    return read_mooncake(path, unit_tokens=unit_tokens, model=model, delta=True, namespace=namespace,
                         skip_bad_rows=skip_bad_rows)


class MooncakeFormat:
    """Mooncake JSONL as a block format (see :mod:`aisim.traces.blockread`).

    A block's parse checks what a line says on its own; its rows keep the
    timestamp in milliseconds (``ts_ms``, null when a ``delay`` stands in)
    and the ``delay``.  :meth:`resolve` gives sessions their turns, arrivals
    and (delta) prompts, refuses ids used twice and finds the earliest
    arrival; :meth:`finish` makes arrivals seconds from it.
    """

    def __init__(self, *, unit_tokens: int = 512, model: str | None = None, delta: bool = False,
                 namespace: str | None = None, skip_bad_rows: bool = False):
        check_option("unit_tokens", unit_tokens)
        self.unit = unit_tokens
        self.model = model
        self.delta = bool(delta)
        self.namespace = namespace
        self.skip = bool(skip_bad_rows)
        self.name = "mooncake-delta" if delta else "mooncake"
        self._units = {}  # the line path's streams of the ids it met

    def _unit(self, u):
        s = self._units.get(u)
        if s is None:
            s = self._units[u] = unit_stream(u, self.namespace)
        return s

    # ------------------------------------------------------------------ parse

    def parse(self, path: str, data: bytes, first_line: int, carry=None) -> Parsed:
        """One block's rows as far as each line says on its own, and its bad lines."""
        fast = self._fast(path, data, first_line) if arrow_pays(data) else None
        return fast if fast is not None else self._slow(path, data, first_line)

    def _fast(self, path, data, first_line):
        # pyarrow.compute is imported only where a column has nulls or ids of its own: a plain trace's
        # short replay starts without it.
        if self.model is not None and b"null" in data:
            # A null reads as an absent field everywhere but in 'model', whose absence means the option.
            return None
        table = read_uniform(data, _JSON_SCHEMA)  # its lines end in "\n" or "\r\n" (no lone "\r")
        uniform = table is not None
        if not uniform:
            table = _read_json(data, _JSON_SCHEMA, "ignore") if plain_lines(data) else None
        if table is None:
            return None
        n = table.num_rows
        if n == 0:
            return Parsed(_empty(), [], {})
        # A uniform block is one row a line (no blank ones); else the JSON reader skipped the blank lines.
        line = np.arange(first_line, first_line + n, dtype=np.int64) if uniform else line_numbers(data, first_line, n)
        if line is None:
            return None
        inp, out = table.column("input_length"), table.column("output_length")
        if inp.null_count or out.null_count:
            return None
        inp, out = inp.to_numpy(), out.to_numpy()
        if (inp < 1).any() or (out < 1).any() or (inp >= 2**31).any() or (out >= 2**31).any():
            return None
        rid = table.column("request_id")
        if rid.null_count < n:
            import pyarrow.compute as pc

            if rid.null_count or pc.any(pc.equal(rid, "")).as_py():
                return None
        sid = table.column("session_id")
        if sid.null_count < n:
            import pyarrow.compute as pc

            if pc.any(pc.equal(sid, "")).as_py():  # nulls skipped
                return None
        ts = table.column("timestamp")
        delay = table.column("delay")
        ts_np = ts.to_numpy(zero_copy_only=False)
        no_ts = ts.is_null().to_numpy(zero_copy_only=False) if ts.null_count else np.zeros(n, dtype=bool)
        if not np.isfinite(ts_np[~no_ts]).all():
            return None
        if no_ts.any():
            # A delay stands in for the timestamp: only on a session's line, with a valid delay.
            d = delay.to_numpy(zero_copy_only=False)
            s_null = sid.is_null().to_numpy(zero_copy_only=False)
            if (s_null[no_ts]).any() or np.isnan(d[no_ts]).any() or not np.isfinite(d[no_ts]).all() \
                    or (d[no_ts] < 0).any():
                return None
        prio = table.column("priority")
        prio = (np.zeros(n, dtype=np.int64) if prio.null_count == n
                else (prio.fill_null(0) if prio.null_count else prio).to_numpy())
        if (prio < -2**31).any() or (prio >= 2**31).any():
            return None
        ids = table.column("hash_ids")
        has_ids = ids.null_count < n
        counts = np.zeros(n, dtype=np.int64)
        flat = np.zeros(0, dtype=np.int64)
        if has_ids:
            ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
            counts, flat = _list_values(ids)
            if flat.size and (flat < 0).any():
                return None
        blocks = -(-inp // self.unit)
        if ((counts != 0) & (counts != blocks)).any():
            return None  # too many ids, or too few for the prompt: the line path says which
        line_ids = rid.null_count == n
        if line_ids:
            rid = _line_id_column(file_stem(path), line)
        elif pc.count_distinct(rid).as_py() != n:
            return None
        # Segments: one per hash id (the last one partial); a prompt without ids is private.
        private = counts == 0
        seg_counts = np.where(private, 1, counts)
        offsets = np.concatenate([[0], np.cumsum(seg_counts)]).astype(np.int32)
        m = int(offsets[-1])
        s_stream = np.zeros(m, dtype=np.uint64)
        s_first = np.zeros(m, dtype=np.int64)
        s_len = np.zeros(m, dtype=np.int64)
        if flat.size and not private.any():
            # Every prompt is its ids: one segment each, of unit tokens but a prompt's last.
            s_stream = unit_streams(flat, self.namespace)
            s_len = np.full(m, self.unit, dtype=np.int64)
            s_len[offsets[1:] - 1] = inp - (counts - 1) * self.unit
        elif flat.size:
            row_of = np.repeat(np.arange(n), counts)
            pos = np.arange(flat.size) - np.repeat(np.concatenate([[0], np.cumsum(counts)])[:-1], counts)
            where = offsets[:-1].astype(np.int64)[row_of] + pos
            s_stream[where] = unit_streams(flat, self.namespace)
            s_len[where] = np.minimum(self.unit, inp[row_of] - pos * self.unit)
        if private.any():
            rids = rid.to_pylist() if isinstance(rid, pa.Array) else rid.combine_chunks().to_pylist()
            at = offsets[:-1][private]
            s_stream[at] = np.fromiter((stream_id("prompt", rids[i]) for i in np.flatnonzero(private)),
                                       dtype=np.uint64, count=int(private.sum()))
            s_len[at] = inp[private]
        model_col = table.column("model")
        if self.model is not None:
            model_col = model_col.fill_null(self.model)
        cols = {"model": model_col, "request_id": rid, "session_id": sid,
                # Each checked within int32 above: wrapped as it is converted, without pa.array's numpy.ma.
                "prompt_tokens": arrow_array(inp.astype(np.int32), pa.int32()),
                "output_tokens": arrow_array(out.astype(np.int32), pa.int32()),
                "priority": arrow_array(prio.astype(np.int32), pa.int32()),
                "segments": segments_array(offsets, s_stream, s_first, s_len),
                "line": arrow_array(np.asarray(line, np.int64), pa.int64())}
        rows = trace_rows(cols, n)
        rows = rows.append_column("ts_ms", ts.combine_chunks() if isinstance(ts, pa.ChunkedArray) else ts)
        rows = rows.append_column("delay_ms", delay.combine_chunks() if isinstance(delay, pa.ChunkedArray) else delay)
        return Parsed(rows, [], {"line_ids": True} if line_ids else {})

    def _slow(self, path, data, first_line):
        """The block line by line, each line on its own (:meth:`_local`)."""
        stem = file_stem(path)
        rows, bad = [], []
        for lineno, line in lines(data, first_line):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            sid = None
            try:
                obj = json_object(line, where)
                sid = id_field(obj, "session_id", where)
                rows.append(self._local(obj, where, stem, lineno, sid))
            except TraceError as exc:
                bad.append(BadLine(lineno, line, str(exc), _loose_id(line, stem, lineno), sid))
                if not self.skip:
                    break
        return Parsed(_rows_table(rows), bad, {})

    def _local(self, obj, where, stem, lineno, sid) -> dict:
        """What a line says on its own, checked as :func:`_row` checks it; a delay waits for its session.

        Raises
        ------
        TraceError
            A fault that no earlier line could excuse.  A line whose fault
            depends on its session (a bad ``delay``) is raised too; the
            resolve pass names it as the whole-file reader would.
        """
        rid = id_field(obj, "request_id", where) or f"{stem}:{lineno}"
        inp = int_field(obj, "input_length", where, 1)
        out = int_field(obj, "output_length", where, 1)
        ids = hash_id_list(obj, "hash_ids", where)
        new = unit_segments(ids, inp, self.unit, lambda u: (self._unit(u), 0), stream_id("prompt", rid), where,
                            partial_ok=False)
        ts = delay = None
        if obj.get("timestamp") is not None:
            ts = number_field(obj, "timestamp", where)
        elif obj.get("delay") is not None:
            if sid is None:
                raise TraceError(f"{where}: field 'timestamp' is missing and 'delay' needs an earlier turn of "
                                 "the same session_id")
            delay = number_field(obj, "delay", where, low=0)
        else:
            raise TraceError(f"{where}: missing field 'timestamp'")
        m = obj.get("model", self.model)
        if m is not None and not isinstance(m, str):
            raise TraceError(f"{where}: field 'model' must be a string, got {m!r}")
        priority = int_field(obj, "priority", where, -(2**31), default=0)
        return {"model": m, "request_id": rid, "session_id": sid, "prompt_tokens": inp, "output_tokens": out,
                "priority": priority, "segments": canonical_segments(new), "ts_ms": ts, "delay_ms": delay,
                "line": lineno}

    # ------------------------------------------------------------------ resolve

    def resolve(self, path: str, blocks, reparse, emit) -> Resolved:
        """Sessions, ids used twice and the earliest arrival, in file order.

        Rows of a session, rows whose id occurs on another line, and bad lines
        go one by one (a bad line is read again, whole, from the state before
        it, so its message is the whole-file reader's); the others stay as
        parsed.
        """
        bad = Bad(self.skip)
        twice = ids_named_twice(blocks)
        state = {"sessions": {}, "seen": {}, "t0": None}
        stem = file_stem(path)
        total = 0
        for k in range(len(blocks)):
            p = blocks[k]
            table = self._resolve_block(path, stem, p, twice, state, bad)
            total += table.num_rows
            emit(k, table)
        if total == 0:
            raise no_requests(path, bad)
        return Resolved({"clock": "time", "t0_ms": state["t0"]}, rows=total, bad_rows=bad.count, first_bad=bad.first,
                        meta={"unit_tokens": self.unit})

    def _resolve_block(self, path, stem, p, twice, state, bad) -> pa.Table:
        rows = p.rows
        n = rows.num_rows
        sids = rows.column("session_id")
        plain = not p.bad and sids.null_count == n
        if plain and twice:
            import pyarrow.compute as pc

            plain = not pc.any(pc.is_in(rows.column("request_id"), value_set=pa.array(sorted(twice)))).as_py()
        if plain:
            if n:
                t = _min(rows.column("ts_ms"))
                state["t0"] = t if state["t0"] is None or t < state["t0"] else state["t0"]
            return rows.append_column("arrival_ms", rows.column("ts_ms"))
        turns = self._session_turns(rows, p, twice, state)
        if turns is not None:
            return turns
        sessions, seen = state["sessions"], state["seen"]
        cols = {c: rows.column(c).to_pylist() for c in ("request_id", "session_id", "prompt_tokens", "output_tokens",
                                                        "ts_ms", "delay_ms", "line")}
        segs = rows.column("segments").to_pylist() if self.delta else None
        keep = np.ones(n, dtype=bool)
        arrival = [None] * n
        turn = [0] * n
        prompt = list(cols["prompt_tokens"])
        new_segs = {}
        events = [(ln, 0, i) for i, ln in enumerate(cols["line"])] + [(b.line, 1, j) for j, b in enumerate(p.bad)]
        events.sort()
        for ln, is_bad, i in events:
            where = f"{path}:{ln}"
            if is_bad:
                b = p.bad[i]
                msg, sid = self._whole_line(b.text, where, stem, ln, sessions, seen)
                bad.add(msg)
                if sid is not None and not isinstance(sessions.get(sid), _Broken):
                    sessions[sid] = _Broken(ln)
                continue
            sid, rid = cols["session_id"][i], cols["request_id"][i]
            prev = sessions.get(sid) if sid is not None else None
            try:
                if isinstance(prev, _Broken):
                    raise TraceError(f"{where}: field 'session_id': session '{sid}' follows its bad line {prev.line}")
                t = cols["ts_ms"][i]
                if t is None:
                    if prev is None:
                        raise TraceError(f"{where}: field 'timestamp' is missing and 'delay' needs an earlier turn "
                                         "of the same session_id")
                    t = prev.arrival_ms + cols["delay_ms"][i]
                if self.delta and prev is not None:
                    prompt[i] = prev.prompt + prev.output + cols["prompt_tokens"][i]
                    if prompt[i] >= 2**31:
                        raise TraceError(f"{where}: field 'input_length': the prompt grows to {prompt[i]} tokens, "
                                         "beyond int32")
                    new_segs[i] = canonical_segments(
                        prev.segments + [(output_stream(prev.request_id), 0, prev.output)]
                        + [(x["stream"], x["first"], x["length"]) for x in segs[i]])
                if rid in seen:
                    raise TraceError(f"{where}: field 'request_id': '{rid}' already used on line {seen[rid]}")
            except TraceError as exc:
                bad.add(str(exc))
                keep[i] = False
                if sid is not None and not isinstance(prev, _Broken):
                    sessions[sid] = _Broken(ln)
                continue
            if rid in twice:
                seen[rid] = ln
            arrival[i] = t
            if sid is not None:
                turn[i] = prev.turn + 1 if prev is not None else 0
                if self.delta:
                    this = new_segs.get(i) or [(x["stream"], x["first"], x["length"]) for x in segs[i]]
                else:
                    this = None
                sessions[sid] = _Turn(turn[i], t, this, prompt[i], cols["output_tokens"][i], rid)
            state["t0"] = t if state["t0"] is None or t < state["t0"] else state["t0"]
        out = rows.set_column(rows.schema.get_field_index("turn"), "turn", pa.array(turn, pa.int32()))
        out = out.set_column(out.schema.get_field_index("prompt_tokens"), "prompt_tokens", pa.array(prompt, pa.int32()))
        if new_segs:
            merged = [new_segs.get(i) or [(x["stream"], x["first"], x["length"]) for x in segs[i]] for i in range(n)]
            out = out.set_column(out.schema.get_field_index("segments"), "segments", _segments(merged))
        out = out.append_column("arrival_ms", pa.array(arrival, pa.float64()))
        return out.filter(pa.array(keep)) if not keep.all() else out

    def _session_turns(self, rows, p, twice, state):
        """A block whose only cross-line business is turn numbers, settled at once; None otherwise.

        That is: every line timestamped and good, no id met twice, no session
        spoilt, no delta prompts.  A turn is its session's count of earlier
        good lines (carried over from earlier blocks).
        """
        import pyarrow.compute as pc

        n = rows.num_rows
        if self.delta or p.bad or rows.column("ts_ms").null_count:
            return None
        if twice and pc.any(pc.is_in(rows.column("request_id"), value_set=pa.array(sorted(twice)))).as_py():
            return None
        sessions = state["sessions"]
        enc = pc.dictionary_encode(rows.column("session_id")).combine_chunks()
        names = enc.dictionary.to_pylist()
        code = enc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        carry = np.zeros(len(names), dtype=np.int64)
        for j, sid in enumerate(names):
            prev = sessions.get(sid)
            if isinstance(prev, _Broken):
                return None
            carry[j] = prev.turn + 1 if prev is not None else 0
        turn = np.zeros(n, dtype=np.int64)
        has = code >= 0
        if has.any():
            idx = np.flatnonzero(has)
            order = idx[np.argsort(code[idx], kind="stable")]
            grouped = code[order]
            starts = np.concatenate([[True], grouped[1:] != grouped[:-1]])
            first_of = np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))
            turn[order] = np.arange(len(order)) - first_of + carry[grouped]
            last = order[np.concatenate([grouped[1:] != grouped[:-1], [True]])]
            at = pa.array(last)
            ts, prompt, out, rid = (rows.column(c).take(at).to_pylist()
                                    for c in ("ts_ms", "prompt_tokens", "output_tokens", "request_id"))
            for c, tn, a, pr, o, r in zip(code[last].tolist(), turn[last].tolist(), ts, prompt, out, rid):
                sessions[names[c]] = _Turn(tn, a, None, pr, o, r)
        t = pc.min(rows.column("ts_ms")).as_py()
        state["t0"] = t if state["t0"] is None or t < state["t0"] else state["t0"]
        out = rows.set_column(rows.schema.get_field_index("turn"), "turn", pa.array(turn.astype(np.int32)))
        return out.append_column("arrival_ms", rows.column("ts_ms"))

    def _whole_line(self, text, where, stem, lineno, sessions, seen):
        """``(message, session)`` of a bad line read whole from the state before it, as the whole-file reader."""
        sid = None
        try:
            obj = json_object(text, where)
            sid = id_field(obj, "session_id", where)
        except TraceError as exc:
            return str(exc), None
        prev = sessions.get(sid) if sid is not None else None
        try:
            if isinstance(prev, _Broken):
                raise TraceError(f"{where}: field 'session_id': session '{sid}' follows its bad line {prev.line}")
            row = _row(obj, where, stem, lineno, prev, self.delta, self.unit, lambda u: (self._unit(u), 0), self.model)
            rid = row["request_id"]
            if rid in seen:
                raise TraceError(f"{where}: field 'request_id': '{rid}' already used on line {seen[rid]}")
        except TraceError as exc:
            return str(exc), sid
        raise AssertionError(f"{where}: a line refused on its own was accepted whole")  # pragma: no cover

    def finish(self, table: pa.Table, info: dict) -> pa.Table:
        """Arrivals in seconds from the trace's earliest one; the rows sorted by arrival."""
        from aisim.traces.blockread import sort_by_arrival

        ms = table.column("arrival_ms")
        if ms.null_count:
            import pyarrow.compute as pc

            seconds = pc.divide(pc.subtract(ms, pa.scalar(info["t0_ms"], pa.float64())), pa.scalar(1000.0))
        else:  # the same IEEE operations, without pyarrow.compute's start-up
            seconds = (ms.to_numpy() - np.float64(info["t0_ms"])) / np.float64(1000.0)
            seconds = arrow_array(seconds, pa.float64())
        table = table.set_column(table.schema.get_field_index("arrival_s"), "arrival_s", seconds)
        table = table.drop_columns(["ts_ms", "delay_ms", "arrival_ms"])
        return sort_by_arrival(table, "time")


# splitmix64 (Steele, Lea and Flood 2014, aisim._core.tracescan): an odd multiple of the id plus the namespace's
# seed, then a bijective avalanche; two ids of one namespace never share a stream.


def unit_streams(ids: np.ndarray, namespace: str | None = None) -> np.ndarray:
    """The token streams of Mooncake hash ids below 2**64 (uint64, never 0).

    Parameters
    ----------
    ids : numpy.ndarray
        Non-negative integer ids (int64 or uint64).
    namespace : str, optional
        The reader's ``namespace`` option: equal ids of two namespaces (or
        of a namespace and none) get unrelated streams.

    Returns
    -------
    numpy.ndarray
        uint64, one per id: splitmix64 of ``id * golden + seed``, ``seed``
        the :func:`~aisim.traces.schema.stream_id` of the namespace.  Only
        their equality matters (the prefix cache's), and distinct ids of one
        namespace never share one.
    """
    seed = stream_id("mooncake-units", "" if namespace is None else "=" + namespace)
    x = np.asarray(ids)
    # The id's 64 bits as uint64 (an int64 id is non-negative: the same number).
    x = np.ascontiguousarray(x).view(np.uint64) if x.dtype in (np.int64, np.uint64) else x.astype(np.uint64)
    out = np.empty(x.shape[0], np.uint64)
    tracescan.unit_streams(x, seed, out)
    return out


def unit_stream(u: int, namespace: str | None = None) -> int:
    """The token stream of one hash id (:func:`unit_streams`; an id of 2**64 or more: a hash of its text)."""
    if u < 2**64:
        return int(unit_streams(np.array([u], dtype=np.uint64), namespace)[0])
    return stream_id("mooncake-unit", str(u) if namespace is None else f"{namespace}:{u}")


def _min(col) -> float:
    """The least value of a float64 column without nulls or NaN, as ``pyarrow.compute.min`` gives it."""
    if col.null_count:
        import pyarrow.compute as pc

        return pc.min(col).as_py()
    return float(np.min(col.to_numpy()))


def _list_values(ids: pa.ListArray):
    """Each list's length (int64, a null list 0) and the lists' values end to end, as numpy arrays.

    As ``pyarrow.compute``'s ``list_value_length`` (nulls filled with an empty list) and
    ``list_flatten`` give them; read from the offsets when no list is null.
    """
    if ids.null_count:
        import pyarrow.compute as pc

        ids = ids.fill_null(pa.scalar([], ids.type))
        return (pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64),
                pc.list_flatten(ids).to_numpy(zero_copy_only=False))
    off = ids.offsets.to_numpy().astype(np.int64)
    flat = ids.values.slice(int(off[0]), int(off[-1] - off[0])).to_numpy(zero_copy_only=False)
    return np.diff(off), flat


def _line_id_column(stem: str, line: np.ndarray) -> pa.Array:
    """The request ids ``<stem>:<line>`` of lines without one (a string column)."""
    try:
        prefix = f"{stem}:".encode()
    except UnicodeEncodeError:  # a file name that is not UTF-8: as Arrow takes it
        import pyarrow.compute as pc

        return pc.binary_join_element_wise(pa.scalar(f"{stem}:"), pa.array(line, pa.int64()).cast(pa.string()), "")
    offsets = np.empty(len(line) + 1, np.int32)
    text = tracescan.line_ids(prefix, np.ascontiguousarray(line, np.int64), offsets)
    return pa.Array.from_buffers(pa.string(), len(line), [None, pa.py_buffer(offsets), pa.py_buffer(text)])


def _segments(rows) -> pa.Array:
    n = len(rows)
    counts = np.fromiter((len(s) for s in rows), dtype=np.int64, count=n)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    flat = [x for s in rows for x in s]
    return segments_array(offsets, np.fromiter((x[0] for x in flat), np.uint64, len(flat)),
                          np.fromiter((x[1] for x in flat), np.int64, len(flat)),
                          np.fromiter((x[2] for x in flat), np.int64, len(flat)))


def _rows_table(rows) -> pa.Table:
    from aisim.traces.blockread import rows_from_dicts

    table = rows_from_dicts(rows, [r["line"] for r in rows])
    table = table.append_column("ts_ms", pa.array([r["ts_ms"] for r in rows], pa.float64()))
    return table.append_column("delay_ms", pa.array([r["delay_ms"] for r in rows], pa.float64()))


def _empty() -> pa.Table:
    return _rows_table([])


def _loose_id(line, stem, lineno):
    """The request id a bad line would have (its ``request_id``, else ``stem:line``), if it can be told."""
    import json

    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    rid = obj.get("request_id")
    if rid is None:
        return f"{stem}:{lineno}"
    return str(rid) if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None


def _row(obj, where, stem, lineno, prev, delta, unit, unit_place, model) -> dict:
    """One line as the whole-file reader reads it, given its session's previous turn."""
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
