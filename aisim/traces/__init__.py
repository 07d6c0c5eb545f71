"""Trace readers; every reader returns the Arrow trace table of :mod:`aisim.traces.schema`.

:func:`read_trace` dispatches on a format name.  Every format is one row of
:data:`TRACE_FORMATS` (its module, its whole-file reader and, when it is read in
blocks, its block reader); ``READERS``, :data:`FORMATS` and the block readers of
:mod:`aisim.traces.blockread` are read from that table.  :func:`from_frame`
builds the trace table from a pandas or polars DataFrame or an Arrow table of
requests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from aisim.errors import TraceError


@dataclass(frozen=True)
class TraceFormat:
    """One trace format aisim reads: a row of :data:`TRACE_FORMATS`.

    Attributes
    ----------
    name : str
        The format's name (``--format``).
    module : str
        The module that reads it (imported when the format is first used).
    reader : str
        Its whole-file reader, ``reader(path, **options) -> pyarrow.Table``.
    block_reader : str or None
        Its block reader class (:mod:`aisim.traces.blockread`); None: read whole.
    text : bool
        Read in byte ranges (a text format); else in the file's own pieces (Parquet row groups).
    block_options : dict
        Options the block reader always gets (one class serving two formats).
    positional : tuple of str
        Reader options the block reader takes by position, first.
    options_from : str or None
        The function whose parameters are the format's options, when the reader forwards them.
    """

    name: str
    module: str
    reader: str
    block_reader: str | None = None
    text: bool = False
    block_options: dict = field(default_factory=dict)
    positional: tuple = ()
    options_from: str | None = None


# Every trace format, one row each.  The reader modules (and pyarrow) are imported when a format is
# first used, not when ``aisim`` starts (``__getattr__`` below).
TRACE_FORMATS = (
    TraceFormat("oracle", "aisim.traces.oracle", "read_oracle_trace", "OracleFormat", text=True,
                positional=("max_model_len",)),
    TraceFormat("mooncake", "aisim.traces.mooncake", "read_mooncake", "MooncakeFormat", text=True),
    TraceFormat("mooncake-delta", "aisim.traces.mooncake", "read_mooncake_delta", "MooncakeFormat", text=True,
                block_options={"delta": True}, options_from="read_mooncake"),
    TraceFormat("azure", "aisim.traces.azure", "read_azure", "AzureFormat", text=True),
    TraceFormat("agentic", "aisim.traces.agentic", "read_agentic"),
    TraceFormat("parquet", "aisim.traces.parquet", "read_parquet", "ParquetFormat"),
)
FORMAT_BY_NAME = {f.name: f for f in TRACE_FORMATS}
# The format names aisim reads, known without importing any reader (``--help`` lists them).
FORMATS = tuple(sorted(FORMAT_BY_NAME))
# Other names this package exports, and the module each lives in.
_LAZY_NAMES = {"read_oracle_trace": "aisim.traces.oracle", "TRACE_SCHEMA": "aisim.traces.schema",
               "stream_id": "aisim.traces.schema", "from_frame": "aisim.traces.frame"}


def __getattr__(name):
    from importlib import import_module

    if name == "READERS":
        value = {f.name: getattr(import_module(f.module), f.reader) for f in TRACE_FORMATS}
    elif name in _LAZY_NAMES:
        value = getattr(import_module(_LAZY_NAMES[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups (and changes to READERS) find the same object
    return value


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
    given = fmt is not None
    if fmt is None:
        fmt = guess_format(path)
    if "READERS" in globals():  # the registry, once anything asked for it (and as it may have been changed)
        known = globals()["READERS"]
        reader = known.get(fmt)
    else:  # only the format's own module: a replay starts without the other readers
        from importlib import import_module

        known = FORMATS
        row = FORMAT_BY_NAME.get(fmt)
        reader = getattr(import_module(row.module), row.reader) if row is not None else None
    if reader is None:
        raise TraceError(f"{path}: unknown trace format '{fmt}'; known: {', '.join(sorted(known))}")
    import inspect

    # An option the format's reader does not take is refused, never passed on to fail (or be ignored).
    params = inspect.signature(reader).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        for k in options:
            if k not in params or k == "path":
                raise TraceError(f"{path}: the '{fmt}' trace reader takes no option '{k}' (the format is "
                                 f"{'given' if given else 'guessed from the file; give format'})")
    return reader(path, **options)


def guess_format(path: str) -> str:
    """The trace format a path suggests.

    ``.parquet`` is ``parquet``, ``.csv`` ``azure``, ``.json``, a directory or
    a glob ``agentic``; another file is ``parquet`` when it starts with
    Parquet's magic bytes, ``mooncake`` when its first line has
    ``input_length`` or ``hash_ids``, else ``oracle``.  ``mooncake-delta`` is
    never guessed.
    """
    lower = path.lower()
    if lower.endswith(".parquet"):
        return "parquet"
    if lower.endswith(".csv"):
        return "azure"
    if lower.endswith(".json") or any(c in path for c in "*?[") or os.path.isdir(path):
        return "agentic"
    try:
        with open(path, "rb") as fh:
            first = fh.readline(1 << 20)
    except OSError:
        return "oracle"
    if first.startswith(b"PAR1"):  # a Parquet file under another name
        return "parquet"
    first = first.decode("utf-8", "replace")
    if '"input_length"' in first or '"hash_ids"' in first:
        return "mooncake"
    return "oracle"


__all__ = ["FORMATS", "FORMAT_BY_NAME", "READERS", "TRACE_FORMATS", "TraceFormat", "TRACE_SCHEMA", "from_frame",
           "read_oracle_trace", "read_trace", "stream_id"]
