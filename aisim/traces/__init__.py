"""Trace readers; every reader returns the Arrow trace table of :mod:`aisim.traces.schema`.

:func:`read_trace` dispatches on a format name; each format lives in its own
module and registers itself in ``READERS``.
"""

from __future__ import annotations

import os

from aisim.errors import TraceError
from aisim.traces.oracle import read_oracle_trace
from aisim.traces.schema import TRACE_SCHEMA, stream_id

# format name -> reader(path, **options) -> pyarrow.Table
READERS = {
    "oracle": read_oracle_trace,
}


def read_trace(path, fmt: str | None = None, **options):
    """Read a trace file in format ``fmt`` (guessed from the name when None).

    Parameters
    ----------
    path : path-like
    fmt : str, optional
        One of ``READERS``.
    **options
        Passed to the reader (e.g. ``max_model_len``).

    Returns
    -------
    pyarrow.Table
        The trace table.
    """
    path = os.fspath(path)
    if fmt is None:
        fmt = guess_format(path)
    if fmt not in READERS:
        raise TraceError(f"{path}: unknown trace format '{fmt}'; known: {', '.join(sorted(READERS))}")
    return READERS[fmt](path, **options)


def guess_format(path: str) -> str:
    """The trace format a file name suggests (``oracle`` for ``.jsonl``)."""
    lower = path.lower()
    if lower.endswith(".parquet"):
        return "parquet"
    if lower.endswith(".csv"):
        return "azure"
    return "oracle"


__all__ = ["READERS", "TRACE_SCHEMA", "read_oracle_trace", "read_trace", "stream_id"]
