"""Deployments: replicas of one engine behind a router, replayed on one simulated clock.

:func:`deploy` replays a time-clocked trace through ``replicas`` copies of an engine; each is
the exact engine of :func:`aisim.replay.replay` (its own scheduler, KV cache and step time), so
a replica's decisions equal a single-engine replay of the requests routed to it.  The router
places each request at its arrival, from what the replicas have reported so far (see
``ext/deploy.pyx`` and ``docs/deployments.md`` for the routers' formulas).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aisim.arrowwrap import arrow_array
from aisim.columns import (DEPLOYMENT_REQUESTS, DEPLOYMENT_STEPS, DISK_REQUESTS, DISK_STEPS, OFFLOAD_REQUESTS,
                           OFFLOAD_STEPS, REQUESTS, STEPS, deployment_schema)
from aisim.config.deployment import DeploymentConfig, deployment_engines, parse_deployment
from aisim.config.engine import EngineConfig
from aisim.decisionlog import write_decision_log
from aisim.output import write_result
from aisim.replay import merged_gaps, result_of, run_deployment
from aisim.summary import SUMMARY_COLUMNS, Totals

# Router inputs recorded per decision and replica (``deploy(..., record_routing=True)``),
# in the order of the core's ROUTING_FIELDS.
ROUTING_FIELDS = ("outstanding_requests", "outstanding_tokens", "overlap_blocks", "overlap_blocks_true",
                  "prefill_tokens", "decode_blocks", "cost")


@dataclass
class DeploymentResult:
    """What a deployment replay produced.

    Attributes
    ----------
    requests : pyarrow.Table
        One row per request, in trace order: ``replica``, ``routed_s``, ``transfer_s`` (null for
        aggregated replicas), then the replay's request columns.
    steps : pyarrow.Table
        ``replica`` then the replay's step columns; replica 0's steps first, then replica 1's ...
    summary : dict
        The deployment's totals and latencies, ``deployment`` (its settings), ``load_balance`` and
        ``replicas`` (one summary per replica, with its ``utilisation``).
    engine : EngineConfig
    deployment : DeploymentConfig
    replicas : list of ReplayResult
        Each replica as a replay of its share (requests in trace order); with
        ``record_decisions``, :func:`aisim.decisionlog.decision_lines` writes its log.
    routing : dict or None
        With ``record_routing``: ``replica`` (the choice) and one array per
        :data:`ROUTING_FIELDS` name, shaped (requests, replicas): the router's inputs at
        each decision (``overlap_blocks_true`` read off the replicas' own caches).
    gaps : dict of numpy arrays
        The gaps between every request's streamed outputs, over all replicas
        (:attr:`aisim.replay.ReplayResult.gaps`; disaggregated, a request's first gap runs from
        its prefill replica's first token to its decode replica's first output).
    """

    requests: pa.Table
    steps: pa.Table
    summary: dict
    engine: EngineConfig
    deployment: DeploymentConfig
    replicas: list = field(default_factory=list, repr=False)
    routing: dict | None = field(default=None, repr=False)
    gaps: dict = field(default_factory=dict, repr=False)


def deploy(trace, engine: EngineConfig, deployment: DeploymentConfig | dict | None = None, *,
           record_decisions: bool = False, record_routing: bool = False, name: str | None = None,
           max_concurrency: int | None = None, closed_loop: bool = False,
           think_time_s: float | None = None, macro_steps: bool = True) -> DeploymentResult:
    """Replay ``trace`` through a deployment of ``engine``.

    Parameters
    ----------
    trace : pyarrow.Table or a DataFrame
        A trace clocked in seconds (``arrival_s``), in arrival order.  Session turns arrive at
        their timestamps (but with ``closed_loop``).
    engine : EngineConfig
        Every replica's engine.
    deployment : DeploymentConfig or dict, optional
        :func:`aisim.config.deployment.parse_deployment`'s result, or the ``deployment``
        mapping itself (``{"replicas": 4, "router": "kv_aware"}``); default one replica.
    record_decisions : bool
        Keep every replica's scheduling decisions (its decision log).
    record_routing : bool
        Keep the router's inputs at every decision.
    name : str, optional
        The trace's name in error messages (its file).
    max_concurrency : int, optional
        The client sends at most this many requests at a time (``vllm bench serve
        --max-concurrency``): a request due while that many are in flight (routed and not
        finished) is sent, in trace order, when one finishes; it is routed then.
    closed_loop : bool
        Send a session's next turn when its previous turn finishes (on its decode replica when
        disaggregated), plus its think time, and route it then, instead of at its timestamp.
    think_time_s : float, optional
        Think time of every closed-loop turn; default: the trace's gap between the two turns.
    macro_steps : bool
        Let a replica replay a quiet stretch of decoding in one move, up to the deployment's
        next event, where that cannot change a decision (``aisim._core.deploy.Deployment``);
        the results are byte-identical either way.

    Returns
    -------
    DeploymentResult

    Raises
    ------
    aisim.errors.TraceError
        A trace clocked in engine steps, or a bad row.
    aisim.errors.ConfigError
        A bad deployment.
    """
    if deployment is None:
        deployment = DeploymentConfig()
    elif isinstance(deployment, dict):
        deployment = parse_deployment(deployment)
    table, out = run_deployment(trace, engine, deployment, name=name, record_events=record_decisions,
                                record_routing=record_routing, max_concurrency=max_concurrency,
                                closed_loop=closed_loop, think_time_s=think_time_s, macro_steps=macro_steps)
    route = out["route"]
    n_p = deployment.prefill.replicas if deployment.disaggregated else len(out["replicas"])
    engines = deployment_engines(deployment, engine) if deployment.disaggregated else (engine, engine)
    parts = []
    for w, rep in enumerate(out["replicas"]):
        share = table.take(pa.array(rep["index"], pa.int64()))
        parts.append(result_of(share, engines[0] if w < n_p else engines[1], rep, True, record_decisions))
    if deployment.disaggregated:
        requests, status = _pd_requests(table, parts, out, n_p)
    else:
        requests = _requests(table, parts, out["replicas"], route, out["sent"], _tier_columns(engine, "requests"))
        status = None
    steps = _steps(parts, _tier_columns(engine, "steps"))
    routing = None
    if record_routing:
        routing = {"replica": route}
        for k, name_ in enumerate(ROUTING_FIELDS):
            routing[name_] = out["routing"][:, :, k]
    summary = _summary(parts, out["replicas"], engine, deployment, requests, status, n_p)
    return DeploymentResult(requests, steps, summary, engine, deployment, parts, routing,
                            merged_gaps([rep["gaps"] for rep in out["replicas"]]))


def _in_trace_order(n: int, parts: list, reps: list) -> pa.Table:
    """The replicas' request rows (each replica's share) put back in trace order."""
    order = np.concatenate([r["index"] for r in reps]) if reps else np.zeros(0, np.int64)
    where = np.empty(n, dtype=np.int64)
    where[order] = np.arange(n)
    return pa.concat_tables([p.requests for p in parts]).take(pa.array(where, pa.int64())) if n else \
        parts[0].requests


def _tier_columns(engine: EngineConfig, kind: str):
    """The KV offload columns a replica's ``kind`` table ends with (the disk tier's after the CPU tier's), or None."""
    off = engine.kv_offload
    if off is None:
        return None
    cpu, disk = (OFFLOAD_STEPS, DISK_STEPS) if kind == "steps" else (OFFLOAD_REQUESTS, DISK_REQUESTS)
    return replace(cpu, columns=cpu.columns + disk.columns) if off.disk_tier else cpu


def _requests(table: pa.Table, parts: list, reps: list, route, sent, offload=None) -> pa.Table:
    """Every replica's request rows put back in trace order, the placement (``route``, at ``sent``) in front;
    with ``offload``, each replica's KV offload columns at the end (its own tier's)."""
    n = table.num_rows
    merged = _in_trace_order(n, parts, reps)
    cols = {
        "replica": route.astype(np.int32),
        "prefill_replica": route.astype(np.int32),
        "decode_replica": route.astype(np.int32),
        "routed_s": sent,  # its arrival, or later when the client's cap held it
    }
    schema = deployment_schema(DEPLOYMENT_REQUESTS, REQUESTS, offload)
    arrays = [arrow_array(cols[f.name], f.type) if f.name in cols else pa.nulls(n, f.type) if f.name == "transfer_s"
              else merged.column(f.name) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _pd_requests(table: pa.Table, parts: list, out: dict, n_p: int):
    """A disaggregated deployment's request rows: the prefill replica's row (arrival, first
    scheduling, first token, prompt cache hit), completed by the decode replica's (finish, output
    tokens, status); the latencies recomputed over the two.  Also the core status codes."""
    n = table.num_rows
    reps = out["replicas"]
    pre = _in_trace_order(n, parts[:n_p], reps[:n_p])
    dec_w = out["decode"]
    routed = dec_w >= 0
    d_idx = np.nonzero(routed)[0]
    p_status = np.empty(n, dtype=np.int8)
    p_status[np.concatenate([r["index"] for r in reps[:n_p]])] = np.concatenate(
        [np.asarray(r["requests"]["status"]) for r in reps[:n_p]]) if n else []

    def col(t, name):
        return t.column(name).to_numpy(zero_copy_only=False)

    cols = {c: col(pre, c).copy() for c in ("finish_s", "output_tokens", "cached_tokens_all_admissions",
                                            "preemptions", "spec_drafts", "spec_accepted")}
    status = p_status.copy()
    if len(d_idx):
        d_parts, d_reps = parts[n_p:], reps[n_p:]
        rows = pa.concat_tables([p.requests for p in d_parts])
        glob = np.concatenate([r["index"] for r in d_reps])
        for c in cols:
            v = col(rows, c)
            cols[c][glob] = v if c in ("finish_s", "output_tokens") else cols[c][glob] + v
        status[glob] = np.concatenate([np.asarray(r["requests"]["status"]) for r in d_reps])
    arrival, first = col(pre, "arrival_s"), col(pre, "first_token_s")
    out_tok = cols["output_tokens"]
    with np.errstate(invalid="ignore", divide="ignore"):
        cols["e2e_s"] = cols["finish_s"] - arrival
        cols["tpot_s"] = np.where(out_tok > 1, (cols["finish_s"] - first) / (out_tok - 1), np.nan)
    labels = dict(zip(p_status.tolist(), pre.column("status").to_pylist()))
    for part, rep in zip(parts[n_p:], reps[n_p:]):
        labels.update(zip(np.asarray(rep["requests"]["status"]).tolist(), part.requests.column("status").to_pylist()))
    cols["status"] = [labels[c] for c in status.tolist()]
    front = {
        "replica": np.where(routed, dec_w, out["route"]).astype(np.int32),
        "prefill_replica": out["route"].astype(np.int32),
        "decode_replica": dec_w.astype(np.int32),
        "routed_s": out["routed_d"],
        "transfer_s": out["transfer_s"],
    }
    schema = deployment_schema(DEPLOYMENT_REQUESTS, REQUESTS)
    arrays = []
    for f in schema:
        if f.name in front:
            v = front[f.name]
            mask = ~routed if f.name in ("decode_replica", "routed_s", "transfer_s") else None
            arrays.append(pa.array(v, f.type, mask=mask))
        elif f.name in cols:
            v = cols[f.name]
            if f.name == "status":
                arrays.append(pa.array(v).cast(f.type) if not pa.types.is_dictionary(f.type) else
                              pa.array(v).dictionary_encode().cast(f.type))
            else:
                arrays.append(pa.array(v, f.type, from_pandas=True) if pa.types.is_floating(f.type)
                              else pa.array(v).cast(f.type))
        else:
            arrays.append(pre.column(f.name))
    return pa.Table.from_arrays(arrays, schema=schema), status


def _steps(parts: list, offload=None) -> pa.Table:
    """Every replica's step rows, replica 0's first, ``replica`` in front (with ``offload``, each replica's
    KV offload columns at the end)."""
    schema = deployment_schema(DEPLOYMENT_STEPS, STEPS, offload)
    tables = []
    for w, p in enumerate(parts):
        rep = arrow_array(np.full(p.steps.num_rows, w, dtype=np.int32), pa.int32())
        tables.append(pa.Table.from_arrays([rep] + [p.steps.column(f.name) for f in list(schema)[1:]], schema=schema))
    return pa.concat_tables(tables)


def _summary(parts: list, reps: list, engine: EngineConfig, deployment: DeploymentConfig, requests: pa.Table,
             status, n_p: int) -> dict:
    """The deployment's summary: every replica's rows added up, plus balance and utilisation
    (disaggregated: the steps of both pools, each request once, as the merged rows give it)."""
    totals = Totals()
    cols = SUMMARY_COLUMNS
    for p, rep in zip(parts, reps):
        totals.add_steps(rep["steps"])
        totals.add_gaps(rep["gaps"])
        if status is None:
            rq = {c: p.requests.column(c).to_numpy(zero_copy_only=False) for c in cols}
            rq["status"] = rep["requests"]["status"]
            totals.add_requests(rq)
    if status is not None:
        rq = {c: requests.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
              if c.endswith("_s") else requests.column(c).to_numpy(zero_copy_only=False) for c in cols}
        rq["status"] = status
        totals.add_requests(rq)
    counts = {k: sum(rep["spec"][k] for rep in reps) for k in reps[0]["spec"]}
    summary = totals.summary(engine, True, counts)
    span = summary["duration_s"]
    per = []
    for w, (p, rep) in enumerate(zip(parts, reps)):
        s = dict(p.summary)
        s["replica"] = w
        if deployment.disaggregated:
            s["pool"] = "prefill" if w < n_p else "decode"
        busy = float(rep["steps"]["duration_s"].sum())
        s["busy_s"] = busy
        s["utilisation"] = busy / span if span > 0 else 0.0
        per.append(s)
    counts = np.array([s["requests"] for s in per], dtype=np.float64)
    mean = counts.mean() if len(counts) else 0.0
    if engine.kv_offload is not None:
        summary["kv_offload"] = offload_totals([p.summary["kv_offload"] for p in parts])
        # As each replica's (aisim.replay_result.result_of): vLLM's num_cached_tokens counts the tier's tokens.
        summary["prefix_hit_tokens_at_admission"] += sum(
            int(pc.sum(p.requests.column("offload_hit_tokens")).as_py() or 0) for p in parts)
    summary["deployment"] = deployment.to_dict()
    summary["load_balance"] = {
        "requests_min": int(counts.min()) if len(counts) else 0,
        "requests_max": int(counts.max()) if len(counts) else 0,
        # max / mean: 1.0 is a perfect balance.
        "requests_max_over_mean": float(counts.max() / mean) if mean > 0 else None,
        "utilisation_min": min(s["utilisation"] for s in per),
        "utilisation_max": max(s["utilisation"] for s in per),
    }
    summary["replicas"] = per
    return summary


def offload_totals(per: list) -> dict:
    """The deployment's ``kv_offload`` summary: every replica's tier added up (``cpu_chunks``: the tiers'
    chunks together; ``max_remote_wait``: the largest of the replicas')."""
    out = {}
    for k, v in per[0].items():
        if isinstance(v, dict):
            out[k] = {kk: sum(s[k][kk] for s in per) for kk in v}
        elif k == "max_remote_wait":
            out[k] = max(s[k] for s in per)
        else:
            out[k] = sum(s[k] for s in per)
    return out


def replica_log_path(path: str, replica: int) -> str:
    """Where replica ``replica``'s decision log goes when a deployment's log is asked for at ``path``:
    ``log.jsonl`` -> ``log.replica0.jsonl``, ``log.replica1.jsonl``, ..."""
    root, ext = os.path.splitext(path)
    return f"{root}.replica{replica}{ext}"


def write_deployment(result: DeploymentResult, out_dir: str | None = None, decision_log: str | None = None,
                     inputs: dict | None = None) -> list:
    """Write a deployment's tables and summary into ``out_dir`` (as :func:`aisim.output.write_result`
    does for one engine) and one decision log per replica (:func:`replica_log_path`), all together or
    none (:mod:`aisim.files`).  A ``decision_log`` that is a stream (``-``, a FIFO) gets every replica's
    log, one after the other in replica order.

    Returns
    -------
    list of str
        The decision logs written.
    """
    from aisim.decisionlog import decision_lines, log_line_json
    from aisim.files import is_stream, open_output, outputs

    logs = []
    with outputs(inputs):
        if out_dir:
            write_result(result, out_dir)
        if decision_log and is_stream(decision_log):
            logs.append(decision_log)
            with open_output(decision_log, "--decision-log") as fh:
                for rep in result.replicas:
                    for line in decision_lines(rep):
                        fh.write(log_line_json(line) + "\n")
        elif decision_log:
            for w, rep in enumerate(result.replicas):
                logs.append(replica_log_path(decision_log, w))
                write_decision_log(rep, logs[-1])
    return logs

