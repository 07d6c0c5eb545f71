"""Reader of the oracle trace format (``trace.jsonl`` of the recorded vLLM runs).

One JSON object per line: ``request_id``, ``prompt_len``, ``max_tokens``,
``arrival_step`` (engine iteration) or ``arrival_time`` (seconds), optional
``prefix_group``/``prefix_len`` (the first ``prefix_len`` prompt tokens are
the shared stream of that group), ``priority`` and ``accept`` (speculative
decoding: drafts accepted at the request's 1st, 2nd, ... verification, cycled).  Every prefix group and
every request owns a token stream; the token at position ``p`` of the prompt
is ``(group stream, p)`` below ``prefix_len`` and ``(request stream, p)`` from
there on.

The file is read in blocks (:mod:`aisim.traces.blockread`): ``pyarrow.json``
parses a block and its columns are checked at once; a block it refuses, or
with a value a check finds wrong, is read line by line (:func:`_row`), which
names ``file:line`` and the field.  What depends on earlier lines -- a
``request_id`` used before, the trace's clock (set by its first good line) --
is settled by :meth:`OracleFormat.resolve`, in file order.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pyarrow as pa

from aisim.errors import TraceError
from aisim.traces.blockread import BadLine, Bad, Parsed, Resolved, arrow_pays, ids_named_twice, no_requests, read_blocks, \
    rows_from_dicts, segments_array, trace_rows
from aisim.traces.blocks import line_numbers, lines, plain_lines
from aisim.traces.common import INT32_LIMIT, int_field, json_object, number_field
from aisim.traces.schema import canonical_segments, stream_id

_KEYS = {"request_id", "prompt_len", "max_tokens", "arrival_step", "arrival_time",
         "prefix_group", "prefix_len", "priority", "accept"}

# What pyarrow.json reads a block as; any other field or type sends the block line by line.
_JSON_SCHEMA = pa.schema([("request_id", pa.string()), ("prompt_len", pa.int64()), ("max_tokens", pa.int64()),
                          ("arrival_step", pa.int64()), ("arrival_time", pa.float64()),
                          ("prefix_group", pa.int64()), ("prefix_len", pa.int64()), ("priority", pa.int64())])


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
    return read_blocks(os.fspath(path), OracleFormat(max_model_len, skip_bad_rows))


class OracleFormat:
    """The oracle format as a block format (see :mod:`aisim.traces.blockread`)."""

    name = "oracle"

    def __init__(self, max_model_len: int | None = None, skip_bad_rows: bool = False):
        self.max_model_len = max_model_len
        self.skip = bool(skip_bad_rows)

    # ------------------------------------------------------------------ parse

    def parse(self, path: str, data: bytes, first_line: int, carry=None) -> Parsed:
        """One block's good rows and bad lines.

        ``carry`` (the resolve pass's state: the trace's clock and the ids seen
        before the block) reads the block line by line as the whole-file reader
        would at that point; without it the block is read on its own.
        """
        if carry is None and arrow_pays(data):
            fast = self._fast(path, data, first_line)
            if fast is not None:
                return fast
        return self._slow(path, data, first_line, carry)

    def _fast(self, path, data, first_line):
        """The block through pyarrow.json with every check vectorised; None sends it line by line."""
        import pyarrow.compute as pc

        if b"null" in data or not plain_lines(data):
            return None  # null and an absent key read alike in Arrow; a lone "\r" breaks a line only here
        table = _read_json(data, _JSON_SCHEMA, "error")
        if table is None:
            return None
        n = table.num_rows
        if n == 0:
            return Parsed(_empty_rows(), [], {"kind": None})
        line = line_numbers(data, first_line, n)
        if line is None:
            return None
        rid = table.column("request_id")
        if rid.null_count or pc.any(pc.equal(pc.utf8_length(rid), 0)).as_py() or pc.count_distinct(rid).as_py() != n:
            return None
        prompt = _ints(table, "prompt_len")
        out = _ints(table, "max_tokens")
        if prompt is None or out is None or (prompt < 1).any() or (out < 1).any() or (prompt >= INT32_LIMIT).any() \
                or (out >= INT32_LIMIT).any():
            return None
        if self.max_model_len is not None and (prompt >= self.max_model_len).any():
            return None
        step_c, time_c = table.column("arrival_step"), table.column("arrival_time")
        has_step = step_c.null_count < n
        has_time = time_c.null_count < n
        if has_step == has_time or (has_step and step_c.null_count) or (has_time and time_c.null_count):
            return None  # mixed clocks, or a line with neither: line by line
        kind = "step" if has_step else "time"
        if kind == "step":
            step = step_c.to_numpy()
            if (step < 0).any():
                return None
            seconds = None
        else:
            seconds = time_c.to_numpy()
            if not np.isfinite(seconds).all() or (seconds < 0).any():
                return None
            step = None
        plen = table.column("prefix_len").fill_null(0).to_numpy()
        if (plen < 0).any() or (plen > prompt).any():
            return None
        group_c = table.column("prefix_group")
        shared = plen > 0
        if shared.any():
            if group_c.is_null().to_numpy(zero_copy_only=False)[shared].any():
                return None
            group = group_c.fill_null(0).to_numpy()
            if (group[shared] < 0).any():
                return None
        prio = table.column("priority").fill_null(0).to_numpy()
        if (prio < -INT32_LIMIT).any() or (prio >= INT32_LIMIT).any():
            return None
        ids = rid.to_pylist()
        own = np.fromiter((stream_id("prompt", r) for r in ids), dtype=np.uint64, count=n)
        gstream = np.zeros(n, dtype=np.uint64)
        if shared.any():
            names = {}
            for i in np.flatnonzero(shared):
                g = int(group[i])
                s = names.get(g)
                if s is None:
                    s = names[g] = stream_id("prefix-group", str(g))
                gstream[i] = s
            if (gstream[shared] == own[shared]).any():
                return None  # a 64-bit collision the line path merges: let it
        rest = prompt - plen
        has_own = rest > 0
        counts = shared.astype(np.int64) + has_own.astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        m = int(offsets[-1])
        s_stream = np.zeros(m, dtype=np.uint64)
        s_first = np.zeros(m, dtype=np.int64)
        s_len = np.zeros(m, dtype=np.int64)
        at = offsets[:-1].astype(np.int64)
        gi = at[shared]
        s_stream[gi], s_first[gi], s_len[gi] = gstream[shared], 0, plen[shared]
        oi = (at + shared)[has_own]
        s_stream[oi], s_first[oi], s_len[oi] = own[has_own], plen[has_own], rest[has_own]
        cols = {"request_id": rid, "arrival_step": pa.array(step, pa.int64()) if step is not None else None,
                "arrival_s": pa.array(seconds, pa.float64()) if seconds is not None else None,
                "prompt_tokens": pa.array(prompt, pa.int32()), "output_tokens": pa.array(out, pa.int32()),
                "priority": pa.array(prio, pa.int32()), "segments": segments_array(offsets, s_stream, s_first, s_len),
                "line": pa.array(line, pa.int64())}
        return Parsed(trace_rows(cols, n), [], {"kind": kind})

    def _slow(self, path, data, first_line, carry):
        """The block line by line (:func:`_row`); with ``carry``, from the trace's state before it."""
        state = {"clock": carry["clock"] if carry else None}
        seen = carry["seen"] if carry else {}
        rows, where_lines, bad = [], [], []
        for lineno, line in lines(data, first_line):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = _row(line, where, self.max_model_len, state, seen)
            except TraceError as exc:
                bad.append(BadLine(lineno, line, str(exc), *_loose_id_kind(line)))
                if not self.skip:
                    break
                continue
            seen[row["request_id"]] = lineno
            rows.append(row)
            where_lines.append(lineno)
        table = rows_from_dicts(rows, where_lines) if rows else _empty_rows()
        return Parsed(table, bad, {"kind": _first_kind(rows), "line_by_line": True})

    # ------------------------------------------------------------------ resolve

    def resolve(self, path: str, blocks, reparse, emit) -> Resolved:
        """Settle every block in file order: the trace's clock and ids used twice.

        ``blocks`` (:class:`~aisim.traces.blockread.Blocks`) loads each block's :class:`Parsed`; ``reparse(k, carry)``
        reads block ``k`` line by line from a given state; ``emit(k, table)``
        takes block ``k``'s final rows (with their ``line``).
        """
        bad = Bad(self.skip)
        twice = ids_named_twice(blocks)
        clock = None
        seen = _Seen(twice)
        total = 0
        for k in range(len(blocks)):
            p = blocks[k]
            kind = p.info.get("kind")
            # A block read on its own saw neither the trace's clock nor the ids before it: when
            # either could change what it says about a line, it is read again from that state.
            needs_state = (clock is not None and (kind not in (None, clock)
                                                  or any(b.kind not in (None, clock) for b in p.bad))) or \
                any(b.request_id in twice for b in p.bad)
            if needs_state:
                p = reparse(k, {"clock": clock, "seen": seen})
                kind = p.info.get("kind") or clock
            clock = clock or kind
            table = p.rows
            msgs = [(b.line, b.message) for b in p.bad]
            drop = None
            if not needs_state and twice:
                ids = table.column("request_id").to_pylist()
                line = table.column("line").to_numpy()
                for i in np.flatnonzero([r in twice for r in ids]):
                    r = ids[i]
                    if r in seen:
                        msgs.append((int(line[i]), f"{path}:{line[i]}: request_id '{r}' already used on line "
                                                   f"{seen[r]}"))
                        drop = np.zeros(table.num_rows, dtype=bool) if drop is None else drop
                        drop[i] = True
                    else:
                        seen[r] = int(line[i])
            elif needs_state:
                for r, ln in zip(table.column("request_id").to_pylist(), table.column("line").to_pylist()):
                    if r in twice:
                        seen[r] = ln
            for _, msg in sorted(msgs):
                bad.add(msg)
            if drop is not None:
                table = table.filter(pa.array(~drop))
            total += table.num_rows
            emit(k, table)
        if total == 0:
            raise no_requests(path, bad)
        return Resolved({"clock": clock}, rows=total, bad_rows=bad.count, first_bad=bad.first)

    def finish(self, table: pa.Table, info: dict) -> pa.Table:
        from aisim.traces.blockread import sort_by_arrival

        return sort_by_arrival(table, info["clock"])


class _Seen(dict):
    """Ids seen on good lines, kept only for ``twice`` (the ids that occur more than once at all)."""

    def __init__(self, twice):
        super().__init__()
        self.twice = twice

    def __setitem__(self, key, value):
        if key in self.twice and key not in self:
            super().__setitem__(key, value)


def _first_kind(rows):
    for r in rows:
        return "step" if r["arrival_step"] is not None else "time"
    return None


def _loose_id_kind(line: str):
    """``(request_id, None, kind)`` of a bad line, each None when it cannot be told."""
    import json

    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None, None, None
    if not isinstance(obj, dict):
        return None, None, None
    rid = obj.get("request_id")
    kind = "step" if "arrival_step" in obj else "time" if "arrival_time" in obj else None
    return (rid if isinstance(rid, str) else None), None, kind


def _ints(table, name):
    col = table.column(name)
    if col.null_count:
        return None
    return col.to_numpy()


def _empty_rows():
    return rows_from_dicts([], [])


def _read_json(data: bytes, schema, unexpected: str):
    """``data`` through pyarrow.json with ``schema`` (other fields: ``unexpected``), or None when it refuses."""
    import pyarrow.json as pj

    opts = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior=unexpected)
    for size in (1 << 22, len(data) + 1):
        try:
            return pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(use_threads=False, block_size=size),
                                parse_options=opts)
        except pa.ArrowInvalid as exc:
            if "straddl" not in str(exc) or size > len(data):
                return None
        except (pa.ArrowException, UnicodeDecodeError, ValueError):
            return None
    return None


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
