"""Trace readers; every reader returns the Arrow trace table of :mod:`aisim.traces.schema`.

:func:`read_trace` dispatches on a format name; each format lives in its own
module and registers itself in ``READERS``.  :func:`from_frame` builds the
trace table from a pandas or polars DataFrame or an Arrow table of requests.
"""

from __future__ import annotations

import os

from aisim.errors import TraceError

# format name -> (module, reader(path, **options) -> pyarrow.Table).  ``READERS`` maps each format
# to its reader; the reader modules (and pyarrow) are imported when it is first used, not when
# ``aisim`` starts (``__getattr__`` below).
_READER_PLACES = {
    "oracle": ("aisim.traces.oracle", "read_oracle_trace"),
    "mooncake": ("aisim.traces.mooncake", "read_mooncake"),
    "mooncake-delta": ("aisim.traces.mooncake", "read_mooncake_delta"),
    "azure": ("aisim.traces.azure", "read_azure"),
    "agentic": ("aisim.traces.agentic", "read_agentic"),
    "parquet": ("aisim.traces.parquet", "read_parquet"),
}
# The format names aisim reads, known without importing any reader (``--help`` lists them).
FORMATS = tuple(sorted(_READER_PLACES))
# Other names this package exports, and the module each lives in.
_LAZY_NAMES = {"read_oracle_trace": "aisim.traces.oracle", "TRACE_SCHEMA": "aisim.traces.schema",
               "stream_id": "aisim.traces.schema", "from_frame": "aisim.traces.frame"}


def __getattr__(name):
    from importlib import import_module

    if name == "READERS":
        value = {fmt: getattr(import_module(mod), fn) for fmt, (mod, fn) in _READER_PLACES.items()}
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
    readers = __getattr__("READERS") if "READERS" not in globals() else globals()["READERS"]
    if fmt not in readers:
        raise TraceError(f"{path}: unknown trace format '{fmt}'; known: {', '.join(sorted(readers))}")
    import inspect

    # An option the format's reader does not take is refused, never passed on to fail (or be ignored).
    params = inspect.signature(readers[fmt]).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        for k in options:
            if k not in params or k == "path":
                raise TraceError(f"{path}: the '{fmt}' trace reader takes no option '{k}' (the format is "
                                 f"{'given' if given else 'guessed from the file; give format'})")
    return readers[fmt](path, **options)


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


__all__ = ["FORMATS", "READERS", "TRACE_SCHEMA", "from_frame", "read_oracle_trace", "read_trace", "stream_id"]
