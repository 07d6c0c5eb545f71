"""``replay_stream``: the replay of a trace given in pieces, holding only the requests in flight,
and ``stream_private``, the private requests of such a trace."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aisim.config.engine import EngineConfig
from aisim.core_input import core_config, private_of_keys
from aisim.errors import ReplayError, TraceError
from aisim.replay_input import _check_concurrency, _core_chunk
from aisim.replay_result import _rejected_mask, _with_rejected, offload_summary
from aisim.result_tables import requests_table, steps_table
from aisim.summary import SUMMARY_COLUMNS, Totals
from aisim.trace_checks import _faults_and_segments, _row_faults


# Columns a streamed trace chunk may carry besides the trace table's (see replay_stream).
STREAM_COLUMNS = ("id_rank", "next_turn", "think_s", "next_think", "follows")


def replay_stream(batches, engine: EngineConfig, *, timed: bool, expected: int, out_rows: int = 65536,
                  stats: dict | None = None, reject_too_long: bool = False, max_concurrency: int | None = None,
                  macro_steps: bool = True, private=None):
    """Replay a trace given in pieces, holding only the requests in flight; yield the results in pieces.

    The same replay as :func:`replay`, row for row and bit for bit, for a
    trace too long to hold: the core takes arrivals chunk by chunk as its
    clock advances and hands back finished requests (in trace order, once
    every earlier request has finished too) and steps as they pile up.

    Parameters
    ----------
    batches : iterable of pyarrow.Table or pyarrow.RecordBatch
        The trace (the columns of :data:`aisim.traces.schema.TRACE_SCHEMA`)
        in trace order, in pieces of any size, optionally with
        :data:`STREAM_COLUMNS`: ``id_rank`` (each request id's rank in the
        whole trace, string order; needed by the priority policy), and for a
        closed loop ``next_turn`` (trace index of the request's next turn, -1
        for none), ``think_s`` (its own think time), ``next_think`` (its next
        turn's) and ``follows`` (it is an earlier request's next turn).
    engine : EngineConfig
    timed : bool
        Arrivals in seconds (``arrival_s``), else by engine step.
    expected : int
        The trace's requests.
    out_rows : int
        Hand results over when this many rows are waiting.
    stats : dict, optional
        Filled at the end with ``slots``: the request slots the core grew to
        (its memory follows them: the requests in flight, not the trace).
    reject_too_long : bool
        Reject over-long prompts as :func:`replay` does (not with the
        closed-loop columns).
    max_concurrency : int, optional
        Cap the requests in flight as :func:`replay` does (not with the
        closed-loop columns).
    macro_steps : bool
        Replay quiet stretches of decoding in one move, as :func:`replay` does.
    private : numpy.ndarray of int8, optional
        Every trace row's :func:`stream_private` flag: the core caches the blocks of requests
        sharing none with any other without computing their keys, as :func:`replay` does.
        The results are the same without it.

    Yields
    ------
    ("requests", pyarrow.Table, pyarrow.Table)
        Finished requests (the schema of :attr:`ReplayResult.requests`) and
        their trace rows, in trace order.
    ("steps", pyarrow.Table)
        Steps (the schema of :attr:`ReplayResult.steps`), in order.
    ("summary", dict)
        Last: :attr:`ReplayResult.summary`.

    Raises
    ------
    TraceError
        A bad request, reported as :func:`replay` reports it (the whole input
        is checked before the error is raised).
    ReplayError
        The core refused to go on (a stalled engine, a step outside a profile).
    """
    from collections import deque

    from aisim._core.engine import ADVANCE, Engine

    config = core_config(engine)
    core = Engine(config, timed=timed, expected=max(int(expected), 1), out_rows=out_rows,
                  max_concurrency=_check_concurrency(max_concurrency, False), macro_steps=macro_steps)
    # Trace rows fed and not yet handed back, in trace order, each piece with its rejected rows (or None).
    pending = deque()
    faults = {}
    totals = Totals()
    source = iter(batches)
    fed = 0
    row = 0  # trace rows read, rejected ones included
    offload = engine.kv_offload is not None
    loaded = hit_tokens = 0  # requests that loaded from the KV offload tier, tokens at first admission

    def feed() -> None:
        nonlocal fed, row
        piece = next(source, None)
        if piece is None:
            core.end_input()
            return
        table = piece if isinstance(piece, pa.Table) else pa.Table.from_batches([piece])
        found, segs = _faults_and_segments(table, engine, timed, reject_too_long)
        for k, msg in found.items():
            faults.setdefault(k, msg)
        if faults:
            return  # nothing more is replayed; the rest of the input is only checked
        rejected = _rejected_mask(table, engine, reject_too_long)
        kept = table if rejected is None else table.filter(pa.array(~rejected))
        flags = None
        if private is not None:
            flags = private[row:row + table.num_rows]
            flags = flags if rejected is None else flags[~rejected]
        row += table.num_rows
        if kept.num_rows:  # a piece of rejected rows only: the core asks for input again
            core.feed(_core_chunk(kept, timed, fed, engine.speculative is not None, segs if rejected is None else None,
                                  flags, engine))
        rows = table.select(_ROW_COLUMNS + (["arrival_s"] if reject_too_long and timed else []))
        if table.num_rows:
            pending.append((rows, rejected))
        fed += kept.num_rows

    def check_rest():
        for piece in source:
            table = piece if isinstance(piece, pa.Table) else pa.Table.from_batches([piece])
            for k, msg in _row_faults(table, engine, timed).items():
                faults.setdefault(k, msg)
        if faults:
            raise TraceError(faults[min(faults)])

    while True:
        if faults:
            check_rest()
        try:
            code = core.advance()
        except (ValueError, RuntimeError) as exc:
            check_rest()  # a bad request later in the input is what replay() would report
            raise ReplayError(str(exc)) from None
        if code == ADVANCE["input"]:
            feed()
            continue
        st = core.take_steps()
        totals.add_gaps(core.take_gaps())
        if len(st["step"]):
            totals.add_steps(st)
            yield "steps", steps_table(st, engine)
        r = core.take_requests()
        n = len(r["status"])
        # At the end, the rejected rows after the last request the core finished.
        if n or (code == ADVANCE["done"] and pending):
            rows, rejected = _take_rows(pending, n, until_end=code == ADVANCE["done"])
            if rejected is not None:
                r = _with_rejected(r, rejected, rows, timed)
            rows = rows.select(_ROW_COLUMNS)
            requests = requests_table(rows, r)
            totals.add_requests(_summary_columns(requests, r))
            if offload:
                loaded += int(np.count_nonzero(r["offload_loads"]))
                hit_tokens += int(r["offload_hit_tokens"].sum())
            yield "requests", requests, rows
        if code == ADVANCE["done"]:
            break
    check_rest()
    if stats is not None:
        stats["slots"] = core.slots
    summary = totals.summary(engine, timed, core.spec_counts)
    if offload:
        # The requests that loaded were counted piece by piece (replay_result.offload_summary counts a
        # whole table's).
        summary["kv_offload"] = offload_summary(core.offload_counts, {"offload_loads": np.zeros(0)})
        summary["kv_offload"]["loaded_requests"] = loaded
        summary["prefix_hit_tokens_at_admission"] += hit_tokens  # as result_of: the tier's tokens too
    yield "summary", summary


# The trace columns a streamed replay hands back with each request row.
_ROW_COLUMNS = ["request_id", "prompt_tokens", "session_id", "turn", "priority"]


def _take_rows(pending, n: int, until_end: bool = False):
    """The trace rows of the next ``n`` requests the core handed back, removed from ``pending``.

    ``pending`` is a deque of ``(rows, rejected)`` pieces (``rejected``: a
    mask, or None).  Rejected rows before and among those ``n`` come along in
    trace order (every row left with ``until_end``).  Returns the rows and
    their rejected mask (None when none is rejected).
    """
    parts, masks, left = [], [], n
    while pending and (left or until_end or _rejected_head(pending)):
        head, mask = pending[0]
        if mask is None:
            take = head.num_rows if until_end else min(head.num_rows, left)
        else:
            kept = np.cumsum(~mask)  # requests the core saw, up to and with each row
            if until_end or kept[-1] <= left:
                take = head.num_rows
            elif left:
                take = int(np.searchsorted(kept, left)) + 1  # through the left-th request the core saw
            else:
                take = int(np.argmin(mask))  # the rejected rows in front
        if take < head.num_rows:
            pending[0] = (head.slice(take), None if mask is None else mask[take:])
        else:
            pending.popleft()
        part_mask = np.zeros(take, dtype=bool) if mask is None else mask[:take]
        parts.append(head.slice(0, take))
        masks.append(part_mask)
        left -= int((~part_mask).sum())
    rows = pa.concat_tables(parts).combine_chunks() if len(parts) > 1 else parts[0]
    rejected = np.concatenate(masks) if len(masks) > 1 else masks[0]
    return rows, (rejected if rejected.any() else None)


def _rejected_head(pending) -> bool:
    """Whether ``pending`` starts with a rejected row (handed back with the requests before it)."""
    mask = pending[0][1]
    return mask is not None and bool(mask[0])


def _summary_columns(requests: pa.Table, r: dict) -> dict:
    rq = {c: requests.column(c).to_numpy(zero_copy_only=False) for c in SUMMARY_COLUMNS}
    rq["status"] = r["status"]
    return rq


def stream_private(batches, engine: EngineConfig, *, timed: bool):
    """The private requests of a trace given in pieces, for :func:`replay_stream`'s ``private``.

    :func:`aisim.core_input.private_requests` over the whole trace, one pass over ``batches``
    (holding 8 bytes a request); None when the engine caches no prefix.

    Parameters
    ----------
    batches : iterable of pyarrow.Table or pyarrow.RecordBatch
        The trace in trace order, as :func:`replay_stream` takes it.
    engine : EngineConfig
    timed : bool
        Arrivals in seconds (``arrival_s``), else by engine step.

    Returns
    -------
    numpy.ndarray of int8, or None
        One flag per trace row, in trace order.
    """
    from aisim._core.hashing import first_block_keys

    config = core_config(engine)
    if not config.enable_prefix_caching:
        return None
    keys = [np.zeros(0, dtype=np.uint64)]
    for piece in batches:
        table = piece if isinstance(piece, pa.Table) else pa.Table.from_batches([piece])
        if table.num_rows:
            keys.append(first_block_keys(_core_chunk(table, timed, 0, False), config.hash_block_size))
    return private_of_keys(np.concatenate(keys))
