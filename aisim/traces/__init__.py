"""Trace readers; every reader returns the Arrow trace table of :mod:`aisim.traces.schema`.

:func:`read_trace` dispatches on a format name; each format lives in its own
module and registers itself in ``READERS``.  :func:`from_frame` builds the
trace table from a pandas or polars DataFrame or an Arrow table of requests.
"""

from __future__ import annotations

import os

from aisim.errors import TraceError
from aisim.traces.agentic import read_agentic
from aisim.traces.azure import read_azure
from aisim.traces.frame import from_frame
from aisim.traces.mooncake import read_mooncake, read_mooncake_delta
from aisim.traces.oracle import read_oracle_trace
from aisim.traces.parquet import read_parquet
from aisim.traces.schema import TRACE_SCHEMA, stream_id

# format name -> reader(path, **options) -> pyarrow.Table
READERS = {
    "oracle": read_oracle_trace,
    "mooncake": read_mooncake,
    "mooncake-delta": read_mooncake_delta,
    "azure": read_azure,
    "agentic": read_agentic,
    "parquet": read_parquet,
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
    """The trace format a path suggests.

    ``.parquet`` is ``parquet``, ``.csv`` ``azure``, ``.json``, a directory or
    a glob ``agentic``; a ``.jsonl`` file is ``mooncake`` when its first line
    has ``input_length`` or ``hash_ids``, else ``oracle``.  ``mooncake-delta``
    is never guessed.
    """
    lower = path.lower()
    if lower.endswith(".parquet"):
        return "parquet"
    if lower.endswith(".csv"):
        return "azure"
    if lower.endswith(".json") or any(c in path for c in "*?[") or os.path.isdir(path):
        return "agentic"
    try:
        with open(path, encoding="utf-8") as fh:
            first = fh.readline(1 << 20)
    except (OSError, UnicodeDecodeError):
        return "oracle"
    if '"input_length"' in first or '"hash_ids"' in first:
        return "mooncake"
    return "oracle"


__all__ = ["READERS", "TRACE_SCHEMA", "from_frame", "read_oracle_trace", "read_trace", "stream_id"]
