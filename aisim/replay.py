"""``replay(trace, engine)``: the only door into the compiled replay core."""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from aisim._core.constants import REQUEST_STATUS, names_by_code
from aisim._core.constants import STEP_KINDS as STEP_KIND_CODES
from aisim.columns import LATENCIES, LATENCY_STATS, REQUESTS, STEPS
from aisim.config.engine import EngineConfig
from aisim.config.kvgroups import request_blocks
from aisim.config.speculative import scheduler_view
from aisim.core_input import CoreTrace, core_config
from aisim.errors import ConfigError, ReplayError, TraceError
from aisim.stats import percentiles
from aisim.traces.frame import from_frame
from aisim.traces.schema import OPTIONAL_COLUMNS, TRACE_SCHEMA, output_streams

# Request status and step-line names, listed by the core's codes (aisim._core.constants).
STATUS_NAMES = names_by_code(REQUEST_STATUS)
STEP_KINDS = names_by_code(STEP_KIND_CODES)


def _labels(codes, names) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(_arrow(codes.astype(np.int8), pa.int8()), pa.array(names, pa.string()))


def _arrow(values, typ: pa.DataType):
    """``values`` as an Arrow array of ``typ``; a numpy array already of that type is wrapped, not copied.

    NaN stays a value, not a null, as with ``pa.array``; wrapping the buffer directly also keeps
    ``numpy.ma`` (which ``pa.array`` consults) out of a short replay's start-up.  Anything else
    goes to Arrow's own conversion, with its checks.
    """
    if (isinstance(values, np.ndarray) and values.ndim == 1
            and (pa.types.is_integer(typ) or pa.types.is_floating(typ))
            and values.dtype == typ.to_pandas_dtype()):
        data = np.ascontiguousarray(values)
        return pa.Array.from_buffers(typ, len(data), [None, pa.py_buffer(data)])
    return values


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


def _segments_arrays(trace: pa.Table):
    seg = trace.column("segments").combine_chunks()
    offsets = seg.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    values = seg.values
    stream = values.field("stream").to_numpy(zero_copy_only=False).astype(np.uint64)
    first = values.field("first").to_numpy(zero_copy_only=False).astype(np.int64)
    length = values.field("length").to_numpy(zero_copy_only=False).astype(np.int64)
    start = offsets[:-1] - offsets[0]
    count = np.diff(offsets)
    return start.astype(np.int32), count.astype(np.int32), stream, first, length


def _validate(trace: pa.Table, engine: EngineConfig):
    if not isinstance(trace, pa.Table):
        raise TypeError("trace must be a pyarrow.Table with the trace schema (aisim.traces)")
    missing = [f.name for f in TRACE_SCHEMA if f.name not in trace.column_names and f.name not in OPTIONAL_COLUMNS]
    if missing:
        raise TraceError(f"trace table lacks column(s): {', '.join(missing)}")
    ids = trace.column("request_id").to_pylist()
    prompt = trace.column("prompt_tokens").to_numpy(zero_copy_only=False)
    out = trace.column("output_tokens").to_numpy(zero_copy_only=False)
    bad = np.flatnonzero((prompt < 1) | (out < 1))
    if bad.size:
        raise TraceError(f"request '{ids[bad[0]]}': prompt_tokens and output_tokens must be at least 1")
    timed = (trace.schema.metadata or {}).get(b"clock") == b"time"
    name = "arrival_s" if timed else "arrival_step"
    arrival = trace.column(name)
    # A null arrival reads as NaN, refused with the finite check below.
    values = arrival.to_numpy(zero_copy_only=False).astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if bad.size:
        v = arrival[int(bad[0])].as_py()
        raise TraceError(f"request '{ids[bad[0]]}': {name} must be a finite non-negative number, got {v!r}")
    bad = np.flatnonzero(prompt >= engine.max_model_len)
    if bad.size:
        i = bad[0]
        raise TraceError(
            f"request '{ids[i]}': prompt_tokens ({prompt[i]}) must be below max_model_len "
            f"({engine.max_model_len}); vLLM rejects such a prompt"
        )
    # Every request must fit an empty pool, or the replay could never finish it.  With speculative
    # decoding its last verification reaches k drafts and the drafter's lookahead slots further.
    extra = 0
    if engine.speculative is not None:
        view = scheduler_view(engine)
        extra = view["num_speculative_tokens"] - 1 + view["num_lookahead_tokens"]
    longest = np.minimum(prompt.astype(np.int64) + out + extra, engine.max_model_len)
    need = request_blocks(engine, longest)
    bad = np.flatnonzero(need > engine.num_gpu_blocks - 1)
    if bad.size:
        i = bad[0]
        raise TraceError(
            f"request '{ids[i]}' needs {need[i]} KV-cache blocks for {longest[i]} tokens but the pool has "
            f"only {engine.num_gpu_blocks - 1} usable blocks (num_gpu_blocks={engine.num_gpu_blocks})"
        )
    start, count, _, _, length = _segments_arrays(trace)
    cum = np.concatenate([[0], np.cumsum(length)])
    covered = cum[start + count] - cum[start]
    bad = np.flatnonzero(covered != prompt)
    if bad.size:
        i = bad[0]
        raise TraceError(
            f"request '{ids[i]}': its segments cover {covered[i]} tokens, not prompt_tokens ({prompt[i]})"
        )


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


def replay(trace, engine: EngineConfig, *, record_decisions: bool = False,
           closed_loop: bool = False, think_time_s: float | None = None) -> ReplayResult:
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

    Returns
    -------
    ReplayResult
    """
    from aisim._core.engine import Engine

    if not (isinstance(trace, pa.Table) and all(f.name in trace.column_names or f.name in OPTIONAL_COLUMNS
                                                for f in TRACE_SCHEMA)):
        trace = from_frame(trace)  # a DataFrame or a plain table of requests
    if think_time_s is not None:
        if not closed_loop:
            raise ConfigError("think_time_s applies to closed-loop replays only; set closed_loop=True")
        if isinstance(think_time_s, bool) or not isinstance(think_time_s, (int, float)) \
                or not math.isfinite(think_time_s) or think_time_s < 0:
            raise ConfigError(f"think_time_s must be a finite non-negative number of seconds, got {think_time_s!r}")
    timed = isinstance(trace, pa.Table) and (trace.schema.metadata or {}).get(b"clock") == b"time"
    if closed_loop and not timed:
        raise TraceError("a closed-loop replay needs a trace clocked in seconds (arrival_s)")
    _validate(trace, engine)
    ids = trace.column("request_id").to_pylist()
    seg_off, seg_cnt, stream, first, length = _segments_arrays(trace)
    arrival = trace.column("arrival_s" if timed else "arrival_step").to_numpy(zero_copy_only=False)
    id_rank = np.empty(len(ids), dtype=np.int32)
    id_rank[np.argsort(np.array(ids, dtype=object), kind="stable")] = np.arange(len(ids), dtype=np.int32)
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
    if closed_loop:
        arrays["next_turn"], arrays["think_s"] = _closed_loop(trace, think_time_s)
    if engine.speculative is not None and "accept" in trace.column_names:
        arrays["accept_off"], arrays["accept_cnt"], arrays["accept_values"] = _accept_arrays(trace)
    config, core_trace = core_config(engine), CoreTrace(**arrays)
    try:
        out = Engine(config, core_trace, record_events=record_decisions).run()
    except (ValueError, RuntimeError) as exc:
        # The core's own refusals (ext/engine.pyx): a stalled engine, a step
        # outside the step-time profile's measured range.
        raise ReplayError(str(exc)) from None
    requests = _requests_table(trace, out["requests"])
    steps = _steps_table(out["steps"], engine)
    rq = {c: requests.column(c).to_numpy(zero_copy_only=False)
          for c in ("arrival_s", "ttft_s", "tpot_s", "e2e_s", "prompt_tokens", "output_tokens", "cached_tokens")}
    rq["status"] = out["requests"]["status"]
    summary = summarize(out["steps"], rq, engine, timed)
    if engine.speculative is not None:
        summary.update(_spec_summary(out["steps"], out["requests"], out["spec"]))
    return ReplayResult(requests, steps, summary, engine, out["events"] if record_decisions else {}, timed,
                        scheduler_view(engine))


def _spec_summary(st: dict, rq: dict, counts: dict) -> dict:
    """Speculative-decoding totals: aisim's verifications and vLLM's ``SpecDecodingStats``."""
    drafts, accepted = int(st["spec_tokens"].sum()), int(st["spec_accepted"].sum())
    return {
        "spec": {
            "draft_tokens": drafts,
            "accepted_tokens": accepted,
            "verifications": counts["verifications"],
            "padded_requests": counts["padded_requests"],
            "padded_tokens": counts["padded_tokens"],
            "draft_feeds": counts["draft_feeds"],
            "acceptance_rate": accepted / drafts if drafts else None,
            "accepted_per_verification": accepted / counts["verifications"] if counts["verifications"] else None,
        },
        # vLLM's SpecDecodingStats, summed over update_from_output calls (padding included).
        "spec_decoding_stats": {k: counts[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")},
    }


def _nan_where(mask, values):
    v = values.astype(np.float64, copy=True)
    v[mask] = np.nan
    return v


def _requests_table(trace: pa.Table, r: dict) -> pa.Table:
    """The replay's ``requests`` table, columns and types as :data:`aisim.columns.REQUESTS` declares them."""
    arrival = r["arrival_s"]
    first_tok = r["first_token_s"]
    finish = r["finish_s"]
    out_tok = r["output_tokens"]
    done = finish >= 0
    ttft = _nan_where(first_tok < 0, first_tok - arrival)
    e2e = _nan_where(~done, finish - arrival)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(done & (out_tok > 1), (finish - first_tok) / np.maximum(out_tok - 1, 1), np.nan)
    cols = {
        "request_id": trace.column("request_id"),
        "arrival_s": _nan_where(arrival < 0, arrival),
        "first_scheduled_s": _nan_where(r["first_scheduled_s"] < 0, r["first_scheduled_s"]),
        "first_token_s": _nan_where(first_tok < 0, first_tok),
        "finish_s": _nan_where(~done, finish),
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": e2e,
        "prompt_tokens": trace.column("prompt_tokens"),
        "output_tokens": out_tok.astype(np.int32),
        "cached_tokens": r["cached_tokens"].astype(np.int32),
        "cached_tokens_all_admissions": r["cached_tokens_all_admissions"].astype(np.int32),
        "preemptions": r["preemptions"],
        "status": _labels(r["status"], STATUS_NAMES),
        "spec_drafts": r["spec_drafts"].astype(np.int32),
        "spec_accepted": r["spec_accepted"].astype(np.int32),
    }
    return _table(cols, REQUESTS.replay_schema())


def _steps_table(s: dict, engine: EngineConfig) -> pa.Table:
    """Step columns plus KV-cache occupancy in blocks, bytes and usage.

    ``active`` blocks are referenced by requests; ``cached`` blocks are free
    (evictable) but still hold a reusable prefix; ``empty`` blocks hold nothing.
    ``kv_usage`` is vLLM's (``KVCacheManager.usage``: active / usable blocks);
    physical usage counts cached blocks too.  Columns and types are
    :data:`aisim.columns.STEPS`'s.
    """
    from aisim.config.kvgroups import block_bytes

    usable = float(engine.num_gpu_blocks - 1)
    cols = dict(s)
    cols["kind"] = _labels(s["kind"], STEP_KINDS)
    active = (engine.num_gpu_blocks - 1) - s["free_blocks"].astype(np.int64)
    cols["active_blocks"] = active.astype(np.int32)
    cols["empty_blocks"] = (s["free_blocks"] - s["cached_blocks"]).astype(np.int32)
    cols["kv_usage"] = active / usable
    cols["physical_usage"] = (active + s["cached_blocks"]) / usable
    bpb = block_bytes(engine)
    cols["kv_cache_active_bytes"] = active * bpb
    cols["kv_cache_cached_bytes"] = s["cached_blocks"].astype(np.int64) * bpb
    return _table(cols, STEPS.replay_schema())


def _table(cols: dict, schema: pa.Schema) -> pa.Table:
    """``cols`` as a table of exactly ``schema``: its columns, in its order, of its types (no casts)."""
    return pa.Table.from_arrays([_arrow(cols[f.name], f.type) for f in schema], schema=schema)


def time_model_label(engine: EngineConfig) -> str:
    """How the replay's step times were made: ``roofline``, ``table``, ``linear`` or ``linear-default``.

    ``linear-default`` is the bare default, a constant :data:`aisim.config.keys.TIME_MODEL_KEYS`
    ``base_s`` per step whatever ran: latencies then count steps, not seconds of any GPU.
    """
    tm = engine.time_model
    raw = engine.raw.get("time_model") or {}
    if tm.kind == "linear" and not set(raw) - {"kind"}:
        return "linear-default"
    return tm.kind


def summarize(st: dict, rq: dict, engine: EngineConfig, timed: bool) -> dict:
    """Totals, prefix-cache statistics and latency percentiles of one replay.

    ``st`` and ``rq`` are the step and request columns as numpy arrays.
    """
    n_steps, n_reqs = len(st["step"]), len(rq["status"])
    is_step = st["kind"] == STEP_KIND_CODES["step"]
    n_done = int((rq["status"] == REQUEST_STATUS["finished"]).sum())
    end = float((st["clock_s"] + st["duration_s"]).max()) if n_steps else 0.0
    start = float(np.nanmin(rq["arrival_s"])) if n_reqs else 0.0
    span = max(end - start, 0.0)
    out_tok = int(rq["output_tokens"].sum())
    caching = engine.enable_prefix_caching
    summary = {
        "requests": n_reqs,
        "finished": n_done,
        "unfinished": n_reqs - n_done,
        "steps": int(is_step.sum()),
        "empty_steps": int((is_step & (st["num_reqs"] == 0)).sum()),
        "last_step_index": int(st["step"][-1]) if n_steps else 0,
        "preemptions": int(st["num_preempted"].sum()),
        "scheduled_tokens": int(st["prefill_tokens"].sum() + st["decode_tokens"].sum()),
        "scheduled_req_steps": int(st["num_reqs"].sum()),
        "prompt_tokens": int(rq["prompt_tokens"].sum()),
        "output_tokens": out_tok,
        # PrefixCacheStats: one record per admission that performed a lookup.
        "prefix_cache_stats": {
            "requests": int(st["num_new"].sum()) if caching else 0,
            "queries": int(st["prefix_queries"].sum()),
            "hits": int(st["prefix_hits"].sum()),
            "preempted_requests": int(st["num_resumed"].sum()) if caching else 0,
            "preempted_queries": int(st["preempted_prefix_queries"].sum()),
            "preempted_hits": int(st["preempted_prefix_hits"].sum()),
        },
        "prefix_hit_tokens_at_admission": int(rq["cached_tokens"].sum()),
        "clock_end_s": end,
        "duration_s": span,
        "throughput_req_s": n_done / span if span > 0 else None,
        "throughput_tok_s": out_tok / span if span > 0 else None,
        "timed": timed,
        "time_model": time_model_label(engine),
    }
    # The statistics the summaries table flattens (aisim.columns.LATENCY_STATS; a test checks the keys).
    for name in LATENCIES:
        v = rq[name][~np.isnan(rq[name])]
        if v.size:
            p50, p90, p99 = percentiles(v)
            summary[name] = {"mean": float(v.mean()), "p50": p50, "p90": p90, "p99": p99}
        else:
            summary[name] = dict.fromkeys(LATENCY_STATS)
    q = summary["prefix_cache_stats"]
    summary["prefix_hit_rate"] = q["hits"] / q["queries"] if q["queries"] else 0.0
    return summary


class _ReplayModule(types.ModuleType):
    """This module, callable as :func:`replay`.

    Importing ``aisim.replay`` binds the package attribute ``aisim.replay`` to this module,
    replacing the package's ``replay`` shortcut; calling the module keeps ``aisim.replay(...)``
    working whatever was imported before.
    """

    def __call__(self, trace, engine, **kwargs):
        return replay(trace, engine, **kwargs)


sys.modules[__name__].__class__ = _ReplayModule
