"""The public trace builder for data people: a pandas or polars DataFrame, or an Arrow table, as a trace.

:func:`from_frame` takes the columns of the oracle format (one row a
request) and returns the trace table of :mod:`aisim.traces.schema`, checked
row by row with errors naming the column and row.  pandas and polars are not
imported by aisim: a frame is handed to Arrow (``pyarrow.Table.from_pandas``,
polars' ``to_arrow``) only when one is given.

Columns:

- ``prompt_len``, ``max_tokens``: integers of at least 1 (and below 2**31);
- exactly one arrival column: ``arrival_time`` (seconds, finite and
  non-negative) or ``arrival_step`` (engine iteration, a non-negative integer);
- optional ``request_id`` (unique non-empty strings or integers; default
  ``row<i>``), ``prefix_group`` with ``prefix_len`` (the first ``prefix_len``
  prompt tokens are the group's shared tokens, as in the oracle format),
  ``session_id`` (with optional ``turn``; default: the session's rows in
  arrival order count 0, 1, ...), ``priority`` (integer), ``model`` and
  ``accept`` (speculative decoding: a list of drafts accepted at the
  request's 1st, 2nd, ... verification, cycled; null for the configured rule).

Other columns are an error, so a misspelt column is not silently ignored.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aisim.errors import TraceError
from aisim.traces.common import BadRows, finish
from aisim.traces.schema import canonical_segments, stream_id, trace_table

REQUIRED = ("prompt_len", "max_tokens")
ARRIVALS = ("arrival_time", "arrival_step")
OPTIONAL = ("request_id", "prefix_group", "prefix_len", "session_id", "turn", "priority", "model", "accept")
_INT32_LIMIT = 2**31


def _as_arrow(frame) -> pa.Table:
    if isinstance(frame, pa.Table):
        return frame
    if isinstance(frame, pa.RecordBatch):
        return pa.Table.from_batches([frame])
    module = type(frame).__module__.split(".", 1)[0]
    if module == "polars":
        return frame.to_arrow()
    if module == "pandas":
        return pa.Table.from_pandas(frame, preserve_index=False)
    raise TraceError(f"a trace frame must be a pandas or polars DataFrame or a pyarrow Table, "
                     f"got {type(frame).__name__}")


def from_frame(frame, *, name: str = "the frame", skip_bad_rows: bool = False) -> pa.Table:
    """Build the trace table from a DataFrame or an Arrow table of requests.

    Parameters
    ----------
    frame : pandas.DataFrame, polars.DataFrame or pyarrow.Table
        One row a request, with the columns listed in this module's docstring.
    name : str
        What error messages call the frame.
    skip_bad_rows : bool
        Skip and count bad rows (metadata ``bad_rows``) instead of raising.

    Returns
    -------
    pyarrow.Table
        The trace table in arrival order; metadata ``clock`` (``time`` or
        ``step``), ``format=frame`` and ``bad_rows``.

    Raises
    ------
    TraceError
        A missing, unknown or mistyped column (naming it), or a bad row
        (``{name}: row {i}: field ...``, ``i`` counting from 0), unless skipped.

    Examples
    --------
    >>> import pandas as pd
    >>> df = pd.DataFrame({"prompt_len": [900, 1200], "max_tokens": [128, 64],
    ...                    "arrival_time": [0.0, 0.25]})
    >>> aisim.replay(df, engine)            # doctest: +SKIP
    """
    table = _as_arrow(frame)
    cols = table.column_names
    for c in cols:
        if c not in REQUIRED + ARRIVALS + OPTIONAL:
            raise TraceError(f"{name}: unknown column '{c}'; known columns: "
                             f"{', '.join(REQUIRED + ARRIVALS + OPTIONAL)}")
    for c in REQUIRED:
        if c not in cols:
            raise TraceError(f"{name}: missing column '{c}'")
    given = [c for c in ARRIVALS if c in cols]
    if len(given) != 1:
        raise TraceError(f"{name}: exactly one of the columns 'arrival_time' and 'arrival_step' is required")
    if ("prefix_len" in cols) != ("prefix_group" in cols):
        raise TraceError(f"{name}: columns 'prefix_len' and 'prefix_group' go together")
    if "turn" in cols and "session_id" not in cols:
        raise TraceError(f"{name}: column 'turn' needs column 'session_id'")
    clock = "time" if given[0] == "arrival_time" else "step"
    n = table.num_rows
    bad = BadRows(skip_bad_rows)
    problem = [None] * n  # the first fault of each row

    def fault(mask, column, text):
        for i in np.flatnonzero(mask):
            if problem[i] is None:
                problem[i] = f"{name}: row {i}: field '{column}' {text}"

    def integers(column, low, default):
        if column not in cols:
            return np.full(n, default, dtype=np.int64)
        col = table.column(column)
        if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_null(col.type)):
            raise TraceError(f"{name}: column '{column}' must hold integers, got {col.type}")
        v = col.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
        whole = np.isfinite(v) & (np.floor(v) == v)
        fault(~whole, column, "must be an integer")
        fault(whole & (v < low), column, f"must be at least {low}")
        fault(whole & (v >= _INT32_LIMIT), column, f"must be below {_INT32_LIMIT}")
        return np.where(whole & (v >= low) & (v < _INT32_LIMIT), v, low).astype(np.int64)

    def labels(column):
        if column not in cols:
            return [None] * n
        col = table.column(column)
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
                or pa.types.is_integer(col.type) or pa.types.is_null(col.type)):
            raise TraceError(f"{name}: column '{column}' must hold strings or integers, got {col.type}")
        out = col.cast(pa.string()).to_pylist()
        fault(np.array([v == "" for v in out], dtype=bool), column, "must not be empty")
        return out

    prompt = integers("prompt_len", 1, 1)
    output = integers("max_tokens", 1, 1)
    if clock == "time":
        col = table.column("arrival_time")
        if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
            raise TraceError(f"{name}: column 'arrival_time' must hold numbers of seconds, got {col.type}")
        t = col.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
        fault(~(np.isfinite(t) & (t >= 0)), "arrival_time", "must be a finite non-negative number of seconds")
        arrival = [float(x) for x in t]
    else:
        arrival = [int(x) for x in integers("arrival_step", 0, 0)]
    prefix_len = integers("prefix_len", 0, 0)
    group = integers("prefix_group", 0, 0)
    fault(prefix_len > prompt, "prefix_len", "exceeds 'prompt_len'")
    priority = integers("priority", -_INT32_LIMIT, 0)
    turn = integers("turn", 0, 0)
    ids = labels("request_id")
    if "request_id" not in cols:
        ids = [f"row{i}" for i in range(n)]
    sessions = labels("session_id")
    models = labels("model")
    accept = [None] * n
    if "accept" in cols:
        col = table.column("accept")
        if not ((pa.types.is_list(col.type) or pa.types.is_large_list(col.type))
                and (pa.types.is_integer(col.type.value_type) or pa.types.is_null(col.type.value_type))) \
                and not pa.types.is_null(col.type):
            raise TraceError(f"{name}: column 'accept' must hold lists of integers, got {col.type}")
        accept = col.to_pylist()
        fault(np.array([a is not None and (not a or any(x is None or x < 0 or x >= _INT32_LIMIT for x in a))
                        for a in accept], dtype=bool),
              "accept", "must be null or a non-empty list of non-negative integers")
    seen = {}
    for i, rid in enumerate(ids):
        if rid is None:
            problem[i] = problem[i] or f"{name}: row {i}: field 'request_id' must not be null"
        elif rid in seen:
            problem[i] = problem[i] or f"{name}: row {i}: field 'request_id': '{rid}' already used on row {seen[rid]}"
        else:
            seen[rid] = i
    rows = {k: [] for k in ("model", "request_id", "session_id", "turn", "arrival_step", "arrival_s",
                            "prompt_tokens", "output_tokens", "priority", "segments", "accept")}
    for i in range(n):
        if problem[i] is not None:
            bad.record(TraceError(problem[i]))
            continue
        rid, p, pre = ids[i], int(prompt[i]), int(prefix_len[i])
        segs = [(stream_id("prefix-group", str(int(group[i]))), 0, pre)] if pre else []
        segs.append((stream_id("prompt", rid), pre, p - pre))
        rows["model"].append(models[i])
        rows["request_id"].append(rid)
        rows["session_id"].append(sessions[i])
        rows["turn"].append(int(turn[i]))
        rows["arrival_step"].append(arrival[i] if clock == "step" else None)
        rows["arrival_s"].append(arrival[i] if clock == "time" else None)
        rows["prompt_tokens"].append(p)
        rows["output_tokens"].append(int(output[i]))
        rows["priority"].append(int(priority[i]))
        rows["segments"].append(canonical_segments(segs))
        rows["accept"].append(accept[i])
    if not rows["request_id"]:
        raise TraceError(f"{name}: the trace has no requests" + (f" ({bad.count} bad rows skipped)"
                                                                  if bad.count else ""))
    out = trace_table(rows, clock)
    if "session_id" in cols and "turn" not in cols:
        out = _number_turns(out)
    return finish(out, "frame", bad)


def _number_turns(table: pa.Table) -> pa.Table:
    """Turns 0, 1, ... of each session in arrival order (the table is sorted by arrival)."""
    counts = {}
    turns = []
    for sid in table.column("session_id").to_pylist():
        if sid is None:
            turns.append(0)
            continue
        turns.append(counts.get(sid, 0))
        counts[sid] = turns[-1] + 1
    i = table.schema.get_field_index("turn")
    return table.set_column(i, table.schema.field(i), pa.array(turns, pa.int32()))
