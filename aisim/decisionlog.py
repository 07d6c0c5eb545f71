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
    header = {"type": "header", "simulator": "aisim", "vllm_version": eng.version}
    header.update(eng.to_dict())
    header["time_model"] = dict(header["time_model"])
    speculative = result.speculative is not None
    if speculative:
        header["speculative"] = dict(result.speculative)
        if eng.speculative.drafter_cost is not None:
            header["speculative"]["drafter_cost"] = eng.speculative.drafter_cost
    yield header
    for row in range(len(steps)):
        sel = order[bounds[row]:bounds[row + 1]]
        arrived, finished, preempted, padded = [], [], [], []
        sched, new, resumed, spec = {}, {}, {}, {}
        for i in sel:
            k, rid, val = int(ev["kind"][i]), ids[int(ev["req"][i])], int(ev["value"][i])
            if k == EV_SPEC:
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
    if speculative:
        sp = s["spec"]
        summary["spec"] = {k: sp[k] for k in ("draft_tokens", "accepted_tokens", "verifications",
                                                "padded_requests", "padded_tokens", "draft_feeds")}
        summary["spec_decoding_stats"] = dict(s["spec_decoding_stats"])
    if result.timed:
        summary["clock_end"] = round(s["clock_end_s"], 6)
    yield summary


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
