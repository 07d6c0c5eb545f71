"""``replay(trace, engine)``: the only door into the compiled replay core."""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from aisim._core.constants import GROUP_KINDS
from aisim.config.engine import EngineConfig
from aisim.config.speculative import scheduler_view
from aisim.core_input import CoreTrace, core_config, private_of_keys, private_requests
from aisim.result_tables import requests_table, steps_table
from aisim.errors import ConfigError, ReplayError, TraceError
from aisim.summary import REJECTED, Totals, summarize
from aisim.traces.frame import from_frame
from aisim.trace_checks import (  # noqa: F401  (check_trace: part of aisim.replay's public face)
    _faults_and_segments, _row_faults, _segments_arrays, _validate, check_trace, too_long,
)
from aisim.traces.schema import REQUIRED_COLUMNS, output_streams


@dataclass
class ReplayResult:
    """What a replay produced.

    Attributes
    ----------
    requests : pyarrow.Table
        One row per request (trace order): arrival, first scheduled, first token
        and finish times, TTFT, TPOT, E2E (seconds), prompt/output/cached tokens,
        preemptions, status.
    steps : pyarrow.Table
        One row per engine iteration: step, clock, duration, scheduled prefill
        and decode tokens, running, waiting, free blocks, usage, prefix-cache
        queries and hits.
    summary : dict
        Totals and latency percentiles.
    engine : EngineConfig
        The configuration replayed.
    events : dict of numpy arrays
        Decision-log events (only when recorded).
    timed : bool
        Arrivals by the clock (seconds) rather than by engine step.
    speculative : dict or None
        What vLLM's scheduler derives from the speculative-decoding
        configuration (:func:`aisim.config.speculative.scheduler_view`); None without it.
    """

    requests: pa.Table
    steps: pa.Table
    summary: dict
    engine: EngineConfig
    events: dict = field(default_factory=dict, repr=False)
    timed: bool = False
    speculative: dict | None = None


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
    out = np.zeros(n * width, dtype=np.uint8)
    rel = offsets[:-1] - offsets[0]
    out[np.repeat(np.arange(n, dtype=np.int64) * width - rel, lens) + np.arange(len(data))] = data
    return out.view(f"S{width}")


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
    if engine.speculative is not None and "accept" in trace.column_names:
        arrays["accept_off"], arrays["accept_cnt"], arrays["accept_values"] = _accept_arrays(trace)
    return arrays


def run_deployment(trace, engine: EngineConfig, deployment, *, name: str | None = None,
                   record_events: bool = False, record_routing: bool = False, max_concurrency: int | None = None,
                   closed_loop: bool = False, think_time_s: float | None = None, macro_steps: bool = True):
    """Run ``trace`` through ``deployment.replicas`` copies of ``engine`` behind its router.

    The one way into the core's deployments (``aisim._core.deploy.Deployment``);
    :func:`aisim.deploy.deploy` is its public face.  ``trace`` must be clocked in seconds
    (``arrival_s``); its turns arrive at their timestamps (open loop) unless ``closed_loop``.  ``name`` names the trace
    in errors.  ``max_concurrency`` caps the client's requests in flight, and ``closed_loop``
    (``think_time_s``) sends a session's next turn when its previous turn finishes, as
    :func:`replay`'s do; ``macro_steps`` as :func:`aisim.deploy.deploy`'s.  Returns the validated trace
    table and the core's columns (``Deployment.run``).
    """
    from aisim._core.deploy import Deployment

    if not _is_trace_table(trace):
        trace = from_frame(trace)
    if (trace.schema.metadata or {}).get(b"clock") != b"time":
        raise TraceError(f"{name or 'the trace'}: arrivals are engine steps (arrival_step); a deployment "
                         "needs arrivals in seconds (arrival_s), the one clock its replicas share")
    _check_think(closed_loop, think_time_s)
    sessions = np.full(trace.num_rows, -1, dtype=np.int64)
    if "session_id" in trace.column_names:
        sid = trace.column("session_id").to_pylist()
        seen: dict = {}
        for i, s in enumerate(sid):
            if s is not None:
                sessions[i] = seen.setdefault(s, len(seen))
    pd = None
    if deployment.disaggregated:
        from aisim.config.deployment import deployment_engines

        p_eng, d_eng = deployment_engines(deployment, engine)
        for eng in (p_eng, d_eng):
            _validate(trace, eng)
            _pd_supported(eng)
        config = core_config(p_eng)
        d_config = core_config(d_eng)
        link = deployment.link
        d_router = _router(deployment.decode.router, deployment.decode.options, d_config, d_eng, sessions)
        if link.transfer == "missing" and d_router["group"] < 0:
            raise ConfigError("'deployment.link.transfer' missing reads the decode engine's prefix cache of a "
                              "full-attention group; it has none")
        from aisim.config.kvgroups import block_bytes

        bb = block_bytes(p_eng)
        if bb == 0 and math.isfinite(link.bandwidth_gb_s):
            raise ConfigError("'deployment.link.bandwidth_gb_s': the prefill engine's block bytes are unknown "
                              "(give the model's geometry), so a transfer cannot be timed; use inf")
        pd = {"config": d_config, "replicas": deployment.decode.replicas, "router": d_router,
              "bandwidth": link.bandwidth_gb_s * 1e9, "latency_s": link.latency_s,
              "missing": link.transfer == "missing", "block_bytes": float(bb)}
        n_rep, router = deployment.prefill.replicas, _router(deployment.prefill.router, deployment.prefill.options,
                                                             config, p_eng, sessions)
    else:
        _validate(trace, engine)
        config = core_config(engine)
        n_rep, router = deployment.replicas, _router(deployment.router, deployment.options, config, engine, sessions)
    arrays = _whole_arrays(trace, engine, True)
    if closed_loop:
        arrays["next_turn"], arrays["think_s"] = _closed_loop(trace, think_time_s)
    core_trace = _with_private(CoreTrace(**arrays), config, *([pd["config"]] if pd else []))
    cap = _check_concurrency(max_concurrency, closed_loop)
    try:
        out = Deployment(config, core_trace, n_rep, router, record_events, record_routing, pd, cap,
                         macro_steps).run()
    except (ValueError, RuntimeError) as exc:
        raise ReplayError(str(exc)) from None
    return trace, out


def _with_private(core_trace: CoreTrace, *configs) -> CoreTrace:
    """``core_trace`` with its private requests marked (:func:`aisim.core_input.private_requests`)
    when an engine of ``configs`` caches prefixes; at the smallest hash block of them, as a request
    private there is private at every larger one (its first block holds the smaller one's)."""
    caching = [c.hash_block_size for c in configs if c.enable_prefix_caching]
    if not caching or len(core_trace.prompt_len) == 0:
        return core_trace
    return replace(core_trace, private=private_requests(core_trace, min(caching)))


def _pd_supported(engine: EngineConfig) -> None:
    """Refuse what disaggregated pools do not model: drafts and Mamba state groups."""
    if engine.speculative is not None:
        raise ConfigError("a disaggregated deployment does not model speculative decoding yet; "
                          "remove the engine's 'speculative' section")
    if any(g["kind"] == GROUP_KINDS["state"] for g in core_config(engine).groups):
        raise ConfigError("a disaggregated deployment does not model Mamba state groups yet (vLLM's connectors "
                          "back off one token for them)")


def _router(name: str, opts: dict, config, engine: EngineConfig, sessions) -> dict:
    """The core's settings of one router over replicas of ``engine``."""
    from aisim.config.routers import ROUTER_BY_NAME, router_code

    row = ROUTER_BY_NAME[name]
    kv = row.reads_prefix_cache or ("fallback" in row.options and ROUTER_BY_NAME[opts["fallback"]].reads_prefix_cache)
    full = [i for i, g in enumerate(config.groups) if g["kind"] == GROUP_KINDS["full"]]
    if kv and not full:
        raise ConfigError(f"router {name!r} reads the prefix cache of a full-attention group; "
                          "this engine has none")
    if kv and config.speculative is not None and config.speculative["num_hash_lookahead_tokens"] > 0:
        raise ConfigError(f"router {name!r}: the engine's block keys cover EAGLE lookahead tokens "
                          f"(vLLM {engine.version}), which the router cannot see; use another router")
    return {
        "kind": router_code(name), "by_tokens": opts["by"] == "tokens", "weight": opts["overlap_weight"],
        "fallback": router_code(opts["fallback"]), "slack": opts["slack"],
        "view_delay_s": opts["view_delay_s"], "seed": opts["seed"], "session": sessions,
        "n_sessions": int(sessions.max()) + 1 if len(sessions) else 0,
        "group": full[0] if full else -1, "block": config.groups[full[0]]["block_size"] if full else 1,
    }


def replay(trace, engine: EngineConfig, *, record_decisions: bool = False,
           closed_loop: bool = False, think_time_s: float | None = None,
           reject_too_long: bool = False, max_concurrency: int | None = None,
           macro_steps: bool = True) -> ReplayResult:
    """Replay ``trace`` through the vLLM scheduler model configured by ``engine``.

    Parameters
    ----------
    trace : pyarrow.Table, pandas.DataFrame or polars.DataFrame
        A trace table (:mod:`aisim.traces.schema`), in arrival order; or a
        frame of requests (``prompt_len``, ``max_tokens``, ``arrival_time`` or
        ``arrival_step``, ...), built into one by :func:`aisim.traces.from_frame`.
    engine : EngineConfig
        The engine to model.
    record_decisions : bool
        Keep every scheduling decision, for :func:`aisim.decisionlog.write_decision_log`.
    closed_loop : bool
        Send a session's next turn when its previous turn finishes, plus its
        think time, instead of at its trace timestamp (time-clocked traces).
    think_time_s : float, optional
        Think time of every closed-loop turn; default: the trace's gap between
        the two turns' arrivals.
    reject_too_long : bool
        Reject a prompt of ``max_model_len`` tokens or more, as vLLM's server
        does (an error for that request; the engine never sees it), instead of
        refusing the trace.  A rejected request keeps its row in
        ``requests``, status ``rejected``, with no times (its ``arrival_s``
        only on a trace clocked in seconds) and no tokens out; the summary
        counts it in ``requests`` and ``rejected``.  Not with ``closed_loop``.
    max_concurrency : int, optional
        The client sends at most this many requests at a time, as ``vllm bench
        serve --max-concurrency``: a request due while that many are in flight
        is sent when one finishes, in trace order; its ``arrival_s`` (and so
        its latencies) count from then.  Not with ``closed_loop``.
    macro_steps : bool
        Replay quiet stretches of decoding (every running request decodes one
        token a step, nothing arrives that could be admitted, nothing finishes)
        in one move.  The results are byte-identical either way; off, every
        engine step is replayed one at a time.

    Returns
    -------
    ReplayResult
    """
    from aisim._core.engine import Engine

    if not _is_trace_table(trace):
        trace = from_frame(trace)  # a DataFrame or a plain table of requests
    _check_think(closed_loop, think_time_s)
    max_concurrency = _check_concurrency(max_concurrency, closed_loop)
    if reject_too_long and closed_loop:
        raise ConfigError("reject_too_long does not apply to closed-loop replays (a session's next turn "
                          "would follow a turn that never ran)")
    timed = isinstance(trace, pa.Table) and (trace.schema.metadata or {}).get(b"clock") == b"time"
    if closed_loop and not timed:
        raise TraceError("a closed-loop replay needs a trace clocked in seconds (arrival_s)")
    segs = _validate(trace, engine, reject_too_long)
    whole = trace
    rejected = _rejected_mask(trace, engine, reject_too_long)
    if rejected is not None:
        trace = trace.filter(pa.array(~rejected))  # the core never sees them
        segs = None
    arrays = _whole_arrays(trace, engine, timed, segs, rank=engine.policy == "priority")
    if closed_loop:
        arrays["next_turn"], arrays["think_s"] = _closed_loop(trace, think_time_s)
    config = core_config(engine)
    core_trace = _with_private(CoreTrace(**arrays), config)
    try:
        out = Engine(config, core_trace, record_events=record_decisions, max_concurrency=max_concurrency,
                     macro_steps=macro_steps).run()
    except (ValueError, RuntimeError) as exc:
        # The core's own refusals (ext/engine.pyx): a stalled engine, a step
        # outside the step-time profile's measured range.
        raise ReplayError(str(exc)) from None
    return result_of(whole, engine, out, timed, record_decisions, rejected)


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


def result_of(trace: pa.Table, engine: EngineConfig, out: dict, timed: bool, events: bool,
              rejected=None) -> ReplayResult:
    """The :class:`ReplayResult` of the core's columns ``out`` (``Engine.run``'s) for ``trace``.

    ``rejected`` marks the rows of ``trace`` the core never saw (``reject_too_long``); they
    are put back in trace order.
    """
    r = out["requests"] if rejected is None else _with_rejected(out["requests"], rejected, trace, timed)
    requests = requests_table(trace, r)
    steps = steps_table(out["steps"], engine)
    rq = {c: requests.column(c).to_numpy(zero_copy_only=False)
          for c in ("arrival_s", "ttft_s", "tpot_s", "e2e_s", "prompt_tokens", "output_tokens", "cached_tokens")}
    rq["status"] = r["status"]
    summary = summarize(out["steps"], rq, engine, timed, out["spec"])
    return ReplayResult(requests, steps, summary, engine, out["events"] if events else {}, timed,
                        scheduler_view(engine))


def _rejected_mask(trace: pa.Table, engine: EngineConfig, reject_too_long: bool):
    """The rows vLLM's server rejects (:func:`too_long`), or None when there are none to reject."""
    if not reject_too_long or trace.num_rows == 0:
        return None
    mask = too_long(trace.column("prompt_tokens").to_numpy(zero_copy_only=False), engine)
    return mask if mask.any() else None


def _with_rejected(r: dict, rejected, trace: pa.Table, timed: bool) -> dict:
    """The core's request columns ``r`` (rows not rejected) with the rejected rows put back, in trace order.

    A rejected request never reached the engine: no times (-1, NULL in the
    table) but its arrival on a trace clocked in seconds, no tokens, status
    :data:`REJECTED`.
    """
    out = {}
    for k, v in r.items():
        full = np.zeros(len(rejected), dtype=v.dtype)
        full[~rejected] = v
        if k in ("first_scheduled_s", "first_token_s", "finish_s") or (k == "arrival_s" and not timed):
            full[rejected] = -1
        elif k == "arrival_s":
            full[rejected] = trace.column("arrival_s").to_numpy(zero_copy_only=False)[rejected]
        elif k == "status":
            full[rejected] = REJECTED
        out[k] = full
    return out


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
                                  flags))
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
            yield "requests", requests, rows
        if code == ADVANCE["done"]:
            break
    check_rest()
    if stats is not None:
        stats["slots"] = core.slots
    yield "summary", totals.summary(engine, timed, core.spec_counts)


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
    rq = {c: requests.column(c).to_numpy(zero_copy_only=False)
          for c in ("arrival_s", "ttft_s", "tpot_s", "e2e_s", "prompt_tokens", "output_tokens", "cached_tokens")}
    rq["status"] = r["status"]
    return rq


def _core_chunk(table: pa.Table, timed: bool, offset: int, speculative: bool, segs=None,
                private=None) -> CoreTrace:
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
    if speculative and "accept" in names:
        arrays["accept_off"], arrays["accept_cnt"], arrays["accept_values"] = _accept_arrays(table)
    return CoreTrace(**arrays, private=private)


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


class _ReplayModule(types.ModuleType):
    """This module, callable as :func:`replay`.

    Importing ``aisim.replay`` binds the package attribute ``aisim.replay`` to this module,
    replacing the package's ``replay`` shortcut; calling the module keeps ``aisim.replay(...)``
    working whatever was imported before.
    """

    def __call__(self, trace, engine, **kwargs):
        return replay(trace, engine, **kwargs)


sys.modules[__name__].__class__ = _ReplayModule
