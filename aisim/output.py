"""Writing a replay's results to a directory, all or nothing."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import pyarrow.parquet as pq

from aisim.replay import ReplayResult


def write_result(result: ReplayResult, out_dir: str, decision_log: str | None = None) -> None:
    """Write ``requests.parquet``, ``steps.parquet`` and ``summary.json`` into ``out_dir``.

    Files are written to a temporary directory next to ``out_dir`` first and
    moved into place only when every one was written, so a failure leaves no
    partial output.
    """
    from aisim.decisionlog import write_decision_log

    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".aisim-", dir=parent)
    try:
        pq.write_table(result.requests, os.path.join(tmp, "requests.parquet"))
        pq.write_table(result.steps, os.path.join(tmp, "steps.parquet"))
        with open(os.path.join(tmp, "summary.json"), "w", encoding="utf-8") as fh:
            json.dump({"engine": result.engine.to_dict(), **result.summary}, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.makedirs(out_dir, exist_ok=True)
        for name in ("requests.parquet", "steps.parquet", "summary.json"):
            os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if decision_log:
        write_decision_log(result, decision_log)


def write_atomic_text(path: str, lines) -> None:
    """Write ``lines`` to ``path`` through a temporary file renamed into place."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".aisim-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for line in lines:
                fh.write(line)
        # mkstemp creates 0600; give the file the permissions of an ordinary one.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
