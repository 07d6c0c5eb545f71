"""A replay's results as files: Parquet tables, a summary and the decision log."""

from __future__ import annotations

import json
import os

from aisim.decisionlog import write_decision_log
from aisim.files import output_directory, outputs
from aisim.replay import ReplayResult

RESULT_FILES = ("requests.parquet", "steps.parquet", "summary.json")


def write_result(result: ReplayResult, out_dir: str, decision_log: str | None = None,
                 inputs: dict | None = None) -> None:
    """Write ``requests.parquet``, ``steps.parquet`` and ``summary.json`` into ``out_dir``.

    The three files (and the decision log) land together or not at all, through
    :mod:`aisim.files`: inside a run's :func:`aisim.files.outputs` block with the
    rest of its outputs, else as a transaction of their own.

    Parameters
    ----------
    result : ReplayResult
    out_dir : str
    decision_log : str, optional
        Also write the decision log here (the replay must have recorded it).
    inputs : dict, optional
        ``{label: path}`` of the run's inputs, which no output may be.
    """
    import pyarrow.parquet as pq  # only when results are written: a replay that prints starts faster

    with outputs(inputs):
        with output_directory(out_dir, RESULT_FILES, "--out") as tmp:
            pq.write_table(result.requests, os.path.join(tmp, "requests.parquet"))
            pq.write_table(result.steps, os.path.join(tmp, "steps.parquet"))
            with open(os.path.join(tmp, "summary.json"), "w", encoding="utf-8") as fh:
                json.dump({"engine": result.engine.to_dict(), **result.summary}, fh, indent=2, sort_keys=True)
                fh.write("\n")
        if decision_log:
            write_decision_log(result, decision_log)
