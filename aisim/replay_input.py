"""A trace as the replay core takes it: the request arrays of a whole trace or of a streamed piece,
closed-loop links, id ranks, accepted-draft lists, private requests, and the checks of the replay
options (think time, concurrency)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pyarrow as pa

from aisim.config.engine import EngineConfig
from aisim.core_input import CoreTrace, private_requests
from aisim.errors import ConfigError, TraceError
from aisim.perf.frontend import request_costs
from aisim.trace_checks import _segments_arrays
from aisim.traces.schema import REQUIRED_COLUMNS, output_streams


def _is_trace_table(trace) -> bool:
    """Whether ``trace`` is a table with the trace schema's columns (else a frame for ``from_frame``)."""
    if not isinstance(trace, pa.Table):
        return False
    return set(REQUIRED_COLUMNS).issubset(trace.schema.names)


def _accept_arrays(trace: pa.Table):
    """Each request's slice of the concatenated ``accept`` lists (count 0: null)."""
    acc = trace.column("accept").combine_chunks()
    offsets = acc.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    start = offsets[:-1] - offsets[0]
    count = np.diff(offsets)
    count[acc.is_null().to_numpy(zero_copy_only=False)] = 0
    values = acc.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    values = values.to_numpy(zero_copy_only=False).astype(np.int64)
    if np.any(values < 0):
        raise TraceError("column 'accept' holds a negative count of accepted drafts")
    return start.astype(np.int32), count.astype(np.int32), values


def _closed_loop(trace: pa.Table, think_time_s):
    """Next-turn links and think times of multi-turn sessions (closed loop).

    Turn k + 1 of a session is sent when turn k finishes plus a think time:
    ``think_time_s`` when given, else the gap between the two turns' arrivals
    in the trace (the pacing it recorded).
    """
    n = len(trace)
    nxt = np.full(n, -1, dtype=np.int32)
    think = np.zeros(n, dtype=np.float64)
    sessions = trace.column("session_id").to_pylist()
    turns = trace.column("turn").to_pylist()
    arrival = trace.column("arrival_s").to_numpy(zero_copy_only=False)
    by_session = {}
    for i, sid in enumerate(sessions):
        if sid is not None:
            by_session.setdefault(sid, []).append(i)
    for rows in by_session.values():
        rows.sort(key=lambda i: (turns[i], i))
        for a, b in zip(rows, rows[1:]):
            nxt[a] = b
            think[b] = think_time_s if think_time_s is not None else max(0.0, arrival[b] - arrival[a])
    return nxt, think


def _id_rank(ids: pa.ChunkedArray) -> np.ndarray:
    """Each request id's rank in string order, ties in trace order (int32).

    Python's ``str`` order (code points) is the order of the ids' UTF-8 bytes: the ids are
    compared as numpy byte strings built from the Arrow buffers, without a Python string per
    id (and without ``pyarrow.compute``, a short replay's start-up).  Byte strings drop trailing
    zero bytes, so ids holding a zero byte, a null id, or ids too long to lay out side by side
    are sorted as Python strings.
    """
    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    n = len(arr)
    rank = np.empty(n, dtype=np.int32)
    if n == 0:
        return rank
    keys = None if arr.null_count else _id_bytes(arr)
    if keys is None:  # a null id is refused as Python's sort refuses it (None is no string)
        keys = np.array(arr.to_pylist(), dtype=object)
    rank[np.argsort(keys, kind="stable")] = np.arange(n, dtype=np.int32)
    return rank


# Ids laid out side by side as byte strings at most this many bytes in all (else sorted as str).
_ID_BYTES_MAX = 1 << 26


def _id_bytes(arr: pa.Array):
    """The ids of a string array as one numpy byte-string array, or None (see :func:`_id_rank`)."""
    n = len(arr)
    wide = arr.type == pa.large_string()
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64 if wide else np.int32)[arr.offset:arr.offset + n + 1]
    offsets = offsets.astype(np.int64)
    lens = np.diff(offsets)
    width = int(lens.max())
    if width == 0:
        return np.zeros(n, dtype="S1")
    if n * width > _ID_BYTES_MAX:
        return None
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
    if not data.all():
        return None
    # Row i's first lens[i] bytes, row by row: the order of the ids' bytes in the buffer.
    out = np.zeros((n, width), dtype=np.uint8)
    out[np.arange(width) < lens[:, None]] = data
    return out.reshape(-1).view(f"S{width}")


def _whole_arrays(trace: pa.Table, engine: EngineConfig, timed: bool, segs=None, rank: bool = True) -> dict:
    """A whole validated trace as the core's request arrays (:class:`CoreTrace` fields), open loop.

    ``segs``: the trace's :func:`_segments_arrays` when already read (validation reads them).
    ``rank``: rank the request ids (else zeros): only the priority policy's waiting heap compares
    ids (vllm/v1/request.py ``Request.__lt__``: priority, arrival time, then request id, used by
    ``PriorityRequestQueue`` in vllm/v1/core/sched/request_queue.py); FCFS never does.
    """
    ids = trace.column("request_id")
    seg_off, seg_cnt, stream, first, length = segs if segs is not None else _segments_arrays(trace)
    arrival = trace.column("arrival_s" if timed else "arrival_step").to_numpy(zero_copy_only=False)
    id_rank = _id_rank(ids) if rank else np.zeros(trace.num_rows, dtype=np.int32)
    arrays = dict(
        prompt_len=trace.column("prompt_tokens").to_numpy(zero_copy_only=False),
        max_tokens=trace.column("output_tokens").to_numpy(zero_copy_only=False),
        priority=trace.column("priority").to_numpy(zero_copy_only=False),
        arrival_key=arrival.astype(np.float64),
        id_rank=id_rank,
        seg_off=seg_off,
        seg_cnt=seg_cnt,
        out_stream=output_streams(ids),
        seg_stream=stream,
        seg_first=first,
        seg_len=length,
    )
    arrays["arrival_time" if timed else "arrival_step"] = arrival
    arrays["frontend_s"] = request_costs(engine, arrays["prompt_len"], timed)
    if engine.speculative is not None and "accept" in trace.column_names:
        arrays["accept_off"], arrays["accept_cnt"], arrays["accept_values"] = _accept_arrays(trace)
    return arrays


def _with_private(core_trace: CoreTrace, *configs, shared: bool = False) -> CoreTrace:
    """``core_trace`` with its private requests marked (:func:`aisim.core_input.private_requests`)
    when an engine of ``configs`` caches prefixes; at the smallest hash block of them, as a request
    private there is private at every larger one (its first block holds the smaller one's).
    ``shared``: also how many leading tokens of each request another request shares, and the
    nodes of its runs (``CoreTrace.shared_tokens``, ``CoreTrace.run_node``)."""
    caching = [c.hash_block_size for c in configs if c.enable_prefix_caching]
    if not caching or len(core_trace.prompt_len) == 0:
        return core_trace
    if shared:  # computed when the core asks (CoreTrace.with_shared_runs)
        return replace(core_trace, shared_block=min(caching))
    return replace(core_trace, private=private_requests(core_trace, min(caching)))


def _check_think(closed_loop: bool, think_time_s) -> None:
    """A ConfigError for a think time without a closed loop, or one that is no number of seconds."""
    if think_time_s is None:
        return
    if not closed_loop:
        raise ConfigError("think_time_s applies to closed-loop replays only; set closed_loop=True")
    if isinstance(think_time_s, bool) or not isinstance(think_time_s, (int, float)) \
            or not math.isfinite(think_time_s) or think_time_s < 0:
        raise ConfigError(f"think_time_s must be a finite non-negative number of seconds, got {think_time_s!r}")


def _check_concurrency(max_concurrency, closed_loop: bool) -> int:
    """``max_concurrency`` as the core takes it (0: no cap), or a ConfigError naming it."""
    if max_concurrency is None:
        return 0
    from aisim.traces.load import check_load

    n = check_load({"max_concurrency": max_concurrency})["max_concurrency"]
    if closed_loop:
        raise ConfigError("max_concurrency caps an open-loop client; a closed loop paces each session's turns itself")
    return n


def _core_chunk(table: pa.Table, timed: bool, offset: int, speculative: bool, segs=None,
                private=None, engine: EngineConfig | None = None) -> CoreTrace:
    """One streamed piece as the core's request arrays (trace indices from ``offset``).

    ``segs``: the piece's :func:`_segments_arrays` when already read (the checks read them);
    ``private``: its rows' :func:`stream_private` flags.
    """
    ids = table.column("request_id")
    n = len(ids)
    seg_off, seg_cnt, stream, first, length = segs if segs is not None else _segments_arrays(table)
    arrival = table.column("arrival_s" if timed else "arrival_step").to_numpy(zero_copy_only=False)
    names = table.column_names

    def opt(name, dtype, default):
        return table.column(name).to_numpy(zero_copy_only=False).astype(dtype) if name in names else default

    arrays = dict(
        prompt_len=table.column("prompt_tokens").to_numpy(zero_copy_only=False),
        max_tokens=table.column("output_tokens").to_numpy(zero_copy_only=False),
        priority=table.column("priority").to_numpy(zero_copy_only=False),
        arrival_key=arrival.astype(np.float64),
        id_rank=opt("id_rank", np.int32, np.zeros(n, np.int32)),
        seg_off=seg_off, seg_cnt=seg_cnt, out_stream=output_streams(ids),
        seg_stream=stream, seg_first=first, seg_len=length,
        next_turn=opt("next_turn", np.int64, None), think_s=opt("think_s", np.float64, None),
        next_think=opt("next_think", np.float64, np.zeros(n)), follows=opt("follows", np.int8, np.zeros(n, np.int8)),
    )
    arrays["arrival_time" if timed else "arrival_step"] = arrival
    if engine is not None:
        arrays["frontend_s"] = request_costs(engine, arrays["prompt_len"], timed)
    if speculative and "accept" in names:
        arrays["accept_off"], arrays["accept_cnt"], arrays["accept_values"] = _accept_arrays(table)
    return CoreTrace(**arrays, private=private)
