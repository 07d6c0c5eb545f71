"""The decision log: one JSON line per ``schedule()`` call, in the oracle's format.

The fields are those of the recorded vLLM runs (``tests/data/oracle/README.md``):
``step``, ``clock`` (time-driven traces), ``arrived``, ``sched``, ``new``,
``resumed``, ``preempted``, ``finished``, ``free_blocks_sched``,
``free_blocks``, ``kv_usage``, ``running``, ``waiting``, ``total_tokens`` and,
with async scheduling, ``updated_step`` plus ``drain`` lines for iterations
that only processed an output.  With speculative decoding a step also lists
``spec`` (request -> [drafts verified, drafts accepted], in scheduling order)
and ``spec_padded`` (requests admitted with vLLM's -1 draft padding).  A
header line opens the log (with speculative decoding, its ``speculative``
block holds what the scheduler derived) and a summary line with
``prefix_cache_stats`` (and ``spec``, ``spec_decoding_stats``) closes it.
"""

from __future__ import annotations

import json

import numpy as np

from aisim._core.constants import EVENT_KINDS
from aisim.files import write_text
from aisim.replay import ReplayResult

# Event kinds written by the core (ext/engine.pxd EventKind).
EV_ARRIVED = EVENT_KINDS["arrived"]
EV_SCHED = EVENT_KINDS["sched"]
EV_NEW = EVENT_KINDS["new"]
EV_RESUMED = EVENT_KINDS["resumed"]
EV_PREEMPTED = EVENT_KINDS["preempted"]
EV_FINISHED = EVENT_KINDS["finished"]
EV_SPEC = EVENT_KINDS["spec"]
EV_SPEC_ACCEPTED = EVENT_KINDS["spec_accepted"]
EV_SPEC_PADDED = EVENT_KINDS["spec_padded"]
# The KV offload connector's events (a step's `offload` object).
_OFF = {k: EVENT_KINDS[k] for k in EVENT_KINDS if k.startswith("off_")}


def decision_lines(result: ReplayResult):
    """Yield the decision log of ``result`` as dictionaries, header first.

    Raises
    ------
    ValueError
        When the replay was run without ``record_decisions=True``.
    """
    if not result.events:
        raise ValueError("this replay was run without record_decisions=True")
    eng = result.engine
    ids = result.requests.column("request_id").to_pylist()
    usable = float(eng.usable_blocks)
    steps = result.steps
    cols = {c: steps.column(c).to_pylist() for c in
            ("step", "kind", "updated_step", "clock_s", "free_blocks_sched", "free_blocks", "running", "waiting")}
    ev = result.events
    line_of = ev["line"]
    order = np.argsort(line_of, kind="stable")
    bounds = np.searchsorted(line_of[order], np.arange(len(steps) + 1))
    if eng.kv_offload is not None:
        cols.update({c: steps.column(c).to_pylist() for c in
                     ("offload_cpu_evicted", "offload_cpu_used", "offload_cpu_evictable")})
    header = {"type": "header", "simulator": "aisim", "vllm_version": eng.version}
    header.update(eng.to_dict())
    header["time_model"] = dict(header["time_model"])
    speculative = result.speculative is not None
    offload = eng.kv_offload is not None
    if offload:
        header["kv_offload"] = {**eng.kv_offload.to_dict(), "cpu_num_chunks": result.summary["kv_offload"]["cpu_chunks"]}
    if speculative:
        header["speculative"] = dict(result.speculative)
        if eng.speculative.drafter_cost is not None:
            header["speculative"]["drafter_cost"] = eng.speculative.drafter_cost
    yield header
    for row in range(len(steps)):
        sel = order[bounds[row]:bounds[row + 1]]
        arrived, finished, preempted, padded = [], [], [], []
        sched, new, resumed, spec = {}, {}, {}, {}
        off = _offload_object() if offload else None
        for i in sel:
            k, rid, val = int(ev["kind"][i]), ids[int(ev["req"][i])], int(ev["value"][i])
            if k in _OFF_KINDS:
                _offload_event(off, k, rid, val)
            elif k == EV_SPEC:
                spec[rid] = [val, 0]
            elif k == EV_SPEC_ACCEPTED:
                spec[rid][1] = val
            elif k == EV_SPEC_PADDED:
                padded.append(rid)
            elif k == EV_ARRIVED:
                arrived.append(rid)
            elif k == EV_SCHED:
                sched[rid] = val
            elif k == EV_NEW:
                new[rid] = val
            elif k == EV_RESUMED:
                resumed[rid] = val
            elif k == EV_PREEMPTED:
                preempted.append(rid)
            elif k == EV_FINISHED:
                finished.append(rid)
        free = cols["free_blocks"][row]
        line = {
            "finished": finished,  # update_from_output order
            "free_blocks": free,
            "kv_usage": round(1.0 - free / usable, 6),
            "running": cols["running"][row],
            "step": cols["step"][row],
            "waiting": cols["waiting"][row],
        }
        if cols["kind"][row] == "drain":  # a dictionary-encoded label
            line["type"] = "drain"
            line["updated_step"] = cols["updated_step"][row]
            yield line
            continue
        line.update(
            {
                "arrived": arrived,
                "free_blocks_sched": cols["free_blocks_sched"][row],
                "new": new,
                "preempted": sorted(preempted),
                "resumed": resumed,
                "sched": sched,
                "total_tokens": sum(sched.values()),
                "type": "step",
            }
        )
        if offload:
            _offload_finish(off, cols, row)
            line["offload"] = off
        if speculative:
            line["spec"] = spec  # scheduling order
            line["spec_padded"] = padded
        if result.timed:
            line["clock"] = round(cols["clock_s"][row], 6)
        if eng.async_scheduling:
            u = cols["updated_step"][row]
            line["updated_step"] = None if u < 0 else u
        yield line
    s = result.summary
    summary = {
        "type": "summary",
        "empty_steps": s["empty_steps"],
        "finished": s["finished"],
        "last_step_index": s["last_step_index"],
        "preemptions": s["preemptions"],
        "prefix_cache_stats": s["prefix_cache_stats"],
        "prefix_hit_tokens_at_admission": s["prefix_hit_tokens_at_admission"],
        "prompt_tokens": s["prompt_tokens"],
        "requests": s["requests"],
        "scheduled_req_steps": s["scheduled_req_steps"],
        "scheduled_tokens": s["scheduled_tokens"],
        "steps": s["steps"],
        "unfinished": s["unfinished"],
    }
    if offload:
        ko = s["kv_offload"]
        summary["connector_prefix_cache_stats"] = dict(ko["connector_prefix_cache_stats"])
        summary["kv_offload"] = {k: ko[k] for k in _OFF_TOTALS}
        if "disk" in ko:
            summary["kv_offload"]["disk"] = dict(ko["disk"])
    if speculative:
        sp = s["spec"]
        summary["spec"] = {k: sp[k] for k in ("draft_tokens", "accepted_tokens", "verifications",
                                                "padded_requests", "padded_tokens", "draft_feeds")}
        summary["spec_decoding_stats"] = dict(s["spec_decoding_stats"])
    if result.timed:
        summary["clock_end"] = round(s["clock_end_s"], 6)
    yield summary


_OFF_KINDS = frozenset(_OFF.values())
# The summary's `kv_offload` totals, in the recorded logs' order.
_OFF_TOTALS = ("lookups", "lookups_with_hit", "lookups_deferred", "loads", "load_tokens", "load_chunks",
               "loaded_requests", "stores", "store_chunks", "flushed_jobs", "cpu_evicted_chunks", "completed_jobs",
               "finished_recving", "max_remote_wait")


def _offload_object() -> dict:
    # vLLM's key order of the step's `offload` object (tests/data/oracle/README.md, KV offload).
    return {"lookups": {}, "loads": {}, "stores": {}, "flush": [], "remote_wait": [], "cpu_evicted": 0,
            "done": [], "recving": [], "cpu_used": 0, "cpu_evictable": 0}


def _offload_event(off: dict, k: int, rid: str, val: int) -> None:
    """One offload event into the step's object (events of one job or lookup come in a row)."""
    if k == _OFF["off_lookup"]:
        off["lookups"][rid] = [val, None]
    elif k == _OFF["off_lookup_ext"]:
        off["lookups"][rid][1] = None if val < 0 else val
    elif k == _OFF["off_load"]:
        off["_job"] = str(val)
        off["loads"][off["_job"]] = [rid, 0, 0]
    elif k == _OFF["off_load_tokens"]:
        off["loads"][off["_job"]][1] = val
    elif k == _OFF["off_load_chunks"]:
        off["loads"][off["_job"]][2] = val
    elif k == _OFF["off_store"]:
        off["_job"] = str(val)
        off["stores"][off["_job"]] = [rid, 0]
    elif k == _OFF["off_store_chunks"]:
        off["stores"][off["_job"]][1] = val
    elif k == _OFF["off_flush"]:
        off["flush"].append(val)
    elif k == _OFF["off_wait"]:
        off["remote_wait"].append(rid)
    elif k == _OFF["off_done"]:
        off["done"].append(val)
    elif k == _OFF["off_recv"]:
        off["recving"].append(rid)


def _offload_finish(off: dict, cols: dict, row: int) -> None:
    off.pop("_job", None)
    off["flush"].sort()
    off["remote_wait"].sort()
    off["recving"].sort()
    for k in ("cpu_evicted", "cpu_used", "cpu_evictable"):
        off[k] = cols["offload_" + k][row]


def log_line_json(line: dict) -> str:
    """One decision-log line as the recorded logs write it.

    Top-level keys are sorted; nested maps (``sched``, ``new``, ``resumed``,
    ``spec``) keep the order in which the scheduler produced their entries,
    which is part of what a log records (vLLM's scheduling order).
    """
    return json.dumps({k: line[k] for k in sorted(line)})


def write_decision_log(result: ReplayResult, path, label: str = "--decision-log") -> None:
    """Write the decision log of ``result`` to ``path`` (JSON lines, see :func:`log_line_json`), through
    :mod:`aisim.files` (a file atomically, a stream as it goes)."""
    write_text(path, (log_line_json(line) + "\n" for line in decision_lines(result)), label)
