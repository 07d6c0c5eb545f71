"""``replay(trace, engine)``: the only door into the compiled replay core.

The replay's parts live beside it, one job each: :mod:`aisim.replay_input` (a trace as the core
takes it), :mod:`aisim.replay_result` (what a replay produced), :mod:`aisim.replay_stream` (a trace
in pieces) and :mod:`aisim.replay_deployment` (replicas behind a router).  This module is their one
public face: it re-exports their names, and is callable as :func:`replay`.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pyarrow as pa

from aisim.config.engine import EngineConfig
from aisim.core_input import CoreTrace, core_config
from aisim.errors import ConfigError, ReplayError, TraceError
# The parts' public names (and two that tests use), re-exported: this module is the replay's face.
from aisim.replay_deployment import run_deployment  # noqa: F401
from aisim.replay_input import (  # noqa: F401
    _check_concurrency, _check_think, _closed_loop, _is_trace_table, _whole_arrays, _with_private,
)
from aisim.replay_result import ReplayResult, _rejected_mask, merged_gaps, result_of  # noqa: F401
from aisim.replay_stream import STREAM_COLUMNS, replay_stream, stream_private  # noqa: F401
from aisim.trace_checks import _validate, check_trace  # noqa: F401  (check_trace: part of aisim.replay's face)
from aisim.traces.frame import from_frame


def replay(trace, engine: EngineConfig, *, record_decisions: bool = False,
           closed_loop: bool = False, think_time_s: float | None = None,
           reject_too_long: bool = False, max_concurrency: int | None = None,
           macro_steps: bool = True, lazy_keys: bool = True) -> ReplayResult:
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
    lazy_keys : bool
        Cache the blocks that no other request of the trace can share (those
        past the leading tokens it has in common with any other request)
        without computing their keys: only the request itself could look them
        up, after a preemption, and they get their keys then.  The results are
        byte-identical either way; off, every block gets its key when it is
        cached, block by block, as vLLM does.

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
        trace = _kept(trace, ~rejected)  # the core never sees them
        segs = None
    # Ids are ranked for the priority heap, and for the order the KV offload manager is told of finishes.
    arrays = _whole_arrays(trace, engine, timed, segs, rank=engine.policy == "priority" or engine.kv_offload is not None)
    if closed_loop:
        arrays["next_turn"], arrays["think_s"] = _closed_loop(trace, think_time_s)
    config = core_config(engine)
    core_trace = CoreTrace(**arrays)
    if lazy_keys:
        core_trace = _with_private(core_trace, config, shared=True)
    try:
        out = Engine(config, core_trace, record_events=record_decisions, max_concurrency=max_concurrency,
                     macro_steps=macro_steps).run()
    except (ValueError, RuntimeError) as exc:
        # The core's own refusals (ext/engine.pyx): a stalled engine, a step
        # outside the step-time profile's measured range.
        raise ReplayError(str(exc)) from None
    return result_of(whole, engine, out, timed, record_decisions, rejected)


def _kept(trace: pa.Table, keep: np.ndarray) -> pa.Table:
    """The rows of ``trace`` where ``keep`` holds, in order, one chunk a column: ``trace.filter(keep)``
    read as runs of kept rows, without ``pyarrow.compute`` (a short replay's start-up)."""
    rows = np.flatnonzero(keep)
    if rows.size == 0:
        return trace.slice(0, 0).combine_chunks()
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = rows[np.concatenate([[0], breaks])]
    ends = rows[np.concatenate([breaks - 1, [rows.size - 1]])] + 1
    return pa.concat_tables([trace.slice(int(a), int(b - a)) for a, b in zip(starts, ends)]).combine_chunks()


class _ReplayModule(types.ModuleType):
    """This module, callable as :func:`replay`.

    Importing ``aisim.replay`` binds the package attribute ``aisim.replay`` to this module,
    replacing the package's ``replay`` shortcut; calling the module keeps ``aisim.replay(...)``
    working whatever was imported before.
    """

    def __call__(self, trace, engine, **kwargs):
        return replay(trace, engine, **kwargs)


sys.modules[__name__].__class__ = _ReplayModule
