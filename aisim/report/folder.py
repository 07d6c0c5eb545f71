"""A replay's output folder (``aisim replay --out DIR``) as report data, without a database.

The folder holds ``requests.parquet``, ``steps.parquet`` and ``summary.json`` (:mod:`aisim.output`,
:func:`aisim.deploy.write_deployment`).  :func:`load_folder` reads it into the
:class:`~aisim.report.data.ShardData` a pipeline run's shard gives: the ``summaries`` row is the
summary flattened by the column catalogue's paths (:attr:`aisim.columns.Column.summary`), as the
pipeline lands it, and so are a deployment's ``replicas`` rows.  :func:`folders_run` makes one
:class:`~aisim.report.data.RunData` of one or more folders, a shard each (``aisim report --replay``,
``aisim compare --report``).
"""

from __future__ import annotations

import json
import os

import numpy as np

from aisim.columns import REPLICAS, SUMMARIES
from aisim.errors import ReportError
from aisim.report.data import REQUEST_COLUMNS, STEP_COLUMNS, RunData, ShardData

FILES = ("requests.parquet", "steps.parquet", "summary.json")


def folder_files(path: str) -> list:
    """The files a replay folder's report reads (``path`` itself when it is not a folder), so that an
    output is checked against each of them (:func:`aisim.files.check_outputs`)."""
    return [os.path.join(path, f) for f in FILES] if os.path.isdir(path) else [path]


def is_replay_folder(path: str) -> bool:
    """Whether ``path`` is a folder holding a replay's three result files."""
    return os.path.isdir(path) and all(os.path.isfile(os.path.join(path, f)) for f in FILES)


def _walk(d: dict, path: tuple):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def _flat(summary: dict, table) -> dict:
    return {c.name: _walk(summary, c.summary) for c in table.columns if c.summary is not None}


def _numbers(table, names) -> dict:
    out = {}
    for n in names:
        if n in table.schema.names:
            col = table.column(n)
            out[n] = col.to_numpy(zero_copy_only=False).astype(np.float64) if col.null_count == 0 else \
                np.asarray([np.nan if v is None else v for v in col.to_pylist()], dtype=np.float64)
        else:
            out[n] = np.full(table.num_rows, np.nan)
    return out


def load_folder(path: str, shard_id: int = 0, label: str | None = None) -> ShardData:
    """The replay in folder ``path`` as a report shard.

    Raises
    ------
    ReportError
        ``path`` is not a replay's output folder, or a file in it cannot be read.
    """
    import pyarrow.parquet as pq

    if not is_replay_folder(path):
        missing = [f for f in FILES if not os.path.isfile(os.path.join(path, f))] if os.path.isdir(path) else []
        what = f"lacks {', '.join(missing)}" if missing else "is not a folder"
        raise ReportError(f"{path} {what}: give a folder aisim replay --out wrote (requests.parquet, steps.parquet, "
                          "summary.json)")
    name = os.path.join(path, "summary.json")  # the file being read, for the message
    try:
        with open(name, encoding="utf-8") as fh:
            summary = json.load(fh)
        if not isinstance(summary, dict):
            raise ValueError("not a JSON object")
        name = os.path.join(path, "steps.parquet")
        steps_t = pq.read_table(name)
        name = os.path.join(path, "requests.parquet")
        req_t = pq.read_table(name)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{name}:{exc.lineno}: not valid JSON ({exc.msg}); is {path} a folder aisim replay "
                          "--out wrote?") from None
    except (OSError, ValueError) as exc:
        raise ReportError(f"cannot read the replay in {path}: {name}: {exc}") from None
    engine = summary.get("engine") or {}
    steps = _numbers(steps_t, STEP_COLUMNS)
    if "replica" in steps_t.schema.names:  # a deployment's steps, every replica's by start time
        order = np.lexsort((steps["step"], steps_t.column("replica").to_numpy(), steps["clock_s"]))
        steps = {k: v[order] for k, v in steps.items()}
    requests = _numbers(req_t, REQUEST_COLUMNS)
    status = {}
    for s in req_t.column("status").cast("string").to_pylist():
        status[s] = status.get(s, 0) + 1
    row = _flat(summary, SUMMARIES)
    if len(steps["kv_usage"]):
        row["kv_usage_mean"] = float(np.nanmean(steps["kv_usage"]))
        row["kv_usage_max"] = float(np.nanmax(steps["kv_usage"]))
        row["kv_physical_usage_max"] = float(np.nanmax(steps["physical_usage"]))
    row["summary_json"] = json.dumps(summary, sort_keys=True)
    row["summary_detail"] = summary
    dep = summary.get("deployment")
    shard = {"shard_id": shard_id, "model": engine.get("model") or "-",
             "engine": label or os.path.basename(os.path.normpath(path)), "engine_path": None,
             "engine_config": json.dumps(engine, sort_keys=True), "config": engine,
             "vllm_version": engine.get("vllm_version"), "clock": "time" if summary.get("timed") else "step",
             "replicas": None, "router": None, "folder": os.path.abspath(path),
             "deployment_config": json.dumps(dep, sort_keys=True) if dep is not None else None}
    replicas = []
    if dep is not None:
        shard["replicas"] = len(summary.get("replicas") or [])
        router = dep.get("router") if "prefill" not in dep else dep["prefill"].get("router")
        shard["router"] = router.get("kind") if isinstance(router, dict) else router
        replicas = [_flat(rep, REPLICAS) for rep in summary.get("replicas") or []]
    return ShardData(shard=shard, summary=row, steps=steps, requests=requests, status=dict(sorted(status.items())),
                     replicas=replicas)


def folders_run(paths, labels=None, slo: dict | None = None, name: str | None = None) -> RunData:
    """One report run of the replays in ``paths``, a shard each, in order."""
    from aisim import __version__

    labels = list(labels) if labels else [None] * len(paths)
    shards = [load_folder(p, i, labels[i]) for i, p in enumerate(paths)]
    folders = ", ".join(os.path.abspath(p) for p in paths)
    run = {"name": name or " vs ".join(sd.shard["engine"] for sd in shards), "run_id": "replay output",
           "folders": [os.path.abspath(p) for p in paths], "aisim_version": __version__}
    return RunData(database=folders, run=run, shards=shards, runs_in_db=0, same_name=0,
                   note="aisim replay --out", slo=dict(slo or {}))
