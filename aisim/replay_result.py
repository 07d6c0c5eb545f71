"""What a replay produced: :class:`ReplayResult`, built from the core's columns (:func:`result_of`),
with the rows vLLM's server rejects put back in trace order."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from aisim.config.engine import EngineConfig
from aisim.config.speculative import scheduler_view
from aisim.result_tables import requests_table, steps_table
from aisim.summary import REJECTED, SUMMARY_COLUMNS, summarize
from aisim.trace_checks import too_long


@dataclass
class ReplayResult:
    """What a replay produced.

    Attributes
    ----------
    requests : pyarrow.Table
        One row per request (trace order): the client's send (``arrival_s``), the
        engine's pick-up, first scheduled, first token and finish times, TTFT, TPOT,
        E2E (seconds, from the send), prompt/output/cached tokens, preemptions, status.
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
    gaps : dict of numpy arrays
        The gaps between every request's streamed outputs (one output per engine step that
        sampled for it: a token, or 1 + the accepted drafts), pooled: ``gap_s`` (distinct
        gaps, ascending) and ``count`` (how many outputs came that long after their
        request's previous one).  vLLM's ITL list, as (value, count) pairs.
    """

    requests: pa.Table
    steps: pa.Table
    summary: dict
    engine: EngineConfig
    events: dict = field(default_factory=dict, repr=False)
    timed: bool = False
    speculative: dict | None = None
    gaps: dict = field(default_factory=dict, repr=False)


def result_of(trace: pa.Table, engine: EngineConfig, out: dict, timed: bool, events: bool,
              rejected=None) -> ReplayResult:
    """The :class:`ReplayResult` of the core's columns ``out`` (``Engine.run``'s) for ``trace``.

    ``rejected`` marks the rows of ``trace`` the core never saw (``reject_too_long``); they
    are put back in trace order.
    """
    r = out["requests"] if rejected is None else _with_rejected(out["requests"], rejected, trace, timed)
    requests = requests_table(trace, r)
    steps = steps_table(out["steps"], engine)
    rq = {c: requests.column(c).to_numpy(zero_copy_only=False) for c in SUMMARY_COLUMNS}
    rq["status"] = r["status"]
    gaps = merged_gaps([out["gaps"]])  # sorted once: the summary's statistics then sort a sorted array
    summary = summarize(out["steps"], rq, engine, timed, out["spec"], gaps)
    if engine.kv_offload is not None:
        summary["kv_offload"] = offload_summary(out["offload"], r)
        # vLLM's num_cached_tokens at admission counts the tokens loaded from the tier too.
        summary["prefix_hit_tokens_at_admission"] += int(np.asarray(r["offload_hit_tokens"]).sum())
    return ReplayResult(requests, steps, summary, engine, out["events"] if events else {}, timed,
                        scheduler_view(engine), gaps)


def merged_gaps(parts) -> dict:
    """Gap records (``Engine.take_gaps``'s dicts) merged: each distinct gap once, ascending, with its count."""
    from aisim.stats import Tally

    tally = Tally()
    for g in parts:
        tally.add(g["gap_s"], g["count"])
    values, counts = tally.pairs()
    return {"gap_s": values, "count": counts}


def offload_summary(counts: dict, r: dict) -> dict:
    """The replay summary's ``kv_offload``: the connector's totals (the oracle's names and order), the
    requests that loaded, vLLM's ``connector_prefix_cache_stats`` and the tier's size."""
    keys = ("lookups", "lookups_with_hit", "lookups_deferred", "loads", "load_tokens", "load_chunks")
    out = {k: int(counts[k]) for k in keys}
    out["loaded_requests"] = int(np.count_nonzero(np.asarray(r["offload_loads"]) > 0))
    for k in ("stores", "store_chunks", "flushed_jobs", "cpu_evicted_chunks", "completed_jobs", "finished_recving",
              "max_remote_wait"):
        out[k] = int(counts[k])
    out["load_bytes"] = int(counts["load_chunks"] * counts["chunk_bytes"])
    out["store_bytes"] = int(counts["store_chunks"] * counts["chunk_bytes"])
    out["cpu_chunks"] = int(counts["cpu_chunks"])
    out["connector_prefix_cache_stats"] = {k: int(v) for k, v in counts["connector_prefix_cache_stats"].items()}
    if counts.get("disk") is not None:
        out["disk"] = {k: int(v) for k, v in counts["disk"].items()}
    return out


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
        if k in ("picked_up_s", "first_scheduled_s", "first_token_s", "finish_s") or (k == "arrival_s" and not timed):
            full[rejected] = -1
        elif k == "arrival_s":
            full[rejected] = trace.column("arrival_s").to_numpy(zero_copy_only=False)[rejected]
        elif k == "status":
            full[rejected] = REJECTED
        out[k] = full
    return out
