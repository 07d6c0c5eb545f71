"""Profile tables of measured forward passes (CSV or Parquet).

Columns: ``latency_s`` and one or two of ``batch_size`` (scheduled requests),
``prefill_tokens`` (scheduled tokens that are not single-token decodes) and
``kv_tokens`` (KV tokens read: the scheduled requests' contexts).  The rows
form a full grid over the columns that vary (one: linear interpolation; two:
bilinear).  A column with one value throughout is not an axis.  Steps outside
the measured range stop the replay with an error; nothing is extrapolated.
"""

from __future__ import annotations

import csv
import io
import math
import os

import numpy as np

from aisim._core.constants import TABLE_AXES, TIME_MODEL_KINDS
from aisim.config.keys import MAX_STEP_S
from aisim.errors import ConfigError

# Profile column name -> axis code of the core (ext/steptime.pxd TableAxis).
AXES = TABLE_AXES


def _read_rows(path: str) -> dict:
    if path.lower().endswith(".parquet"):
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        return {c: table.column(c).to_pylist() for c in table.column_names}
    from aisim.textin import decode_utf8

    with open(path, "rb") as fh:
        text = decode_utf8(fh.read(), path, ConfigError)
    reader = csv.DictReader(io.StringIO(text, newline=""))
    cols = {c: [] for c in reader.fieldnames or []}
    for lineno, row in enumerate(reader, 2):
        for c in cols:
            try:
                v = float(row[c])
            except (TypeError, ValueError):
                v = math.nan
            if not math.isfinite(v):
                raise ConfigError(f"{path}:{lineno}: field '{c}' must be a finite number, got {row[c]!r}")
            cols[c].append(v)
    return cols


def table_args(path: str) -> dict:
    """Core arguments of the profile table at ``path``."""
    if not os.path.exists(path):
        raise ConfigError(f"cannot read step-time profile {path}: no such file")
    cols = _read_rows(path)
    if "latency_s" not in cols:
        raise ConfigError(f"step-time profile {path} has no 'latency_s' column")
    unknown = [c for c in cols if c not in AXES and c != "latency_s"]
    if unknown:
        raise ConfigError(f"step-time profile {path}: unknown column(s) {', '.join(unknown)}; "
                          f"known: latency_s, {', '.join(AXES)}")
    lat = np.asarray(cols["latency_s"], dtype=np.float64)
    if lat.size == 0 or np.any(lat < 0) or not np.all(np.isfinite(lat)):
        raise ConfigError(f"step-time profile {path}: 'latency_s' must hold non-negative numbers")
    if np.any(lat > MAX_STEP_S):  # a step time the replay's clock can add up (aisim.config.keys.MAX_STEP_S)
        raise ConfigError(f"step-time profile {path}: 'latency_s' must be from 0 to {MAX_STEP_S:g}, "
                          f"got {float(lat.max())!r}")
    axes = [c for c in AXES if c in cols and len(set(cols[c])) > 1]
    if not axes:
        raise ConfigError(f"step-time profile {path}: no column among {', '.join(AXES)} varies")
    if len(axes) > 2:
        raise ConfigError(f"step-time profile {path}: {', '.join(axes)} all vary; a profile interpolates "
                          "over at most two of them")
    grids = [np.unique(np.asarray(cols[a], dtype=np.float64)) for a in axes]
    shape = tuple(len(g) for g in grids)
    grid = np.full(shape, np.nan)
    for k in range(lat.size):
        idx = tuple(int(np.searchsorted(g, cols[a][k])) for g, a in zip(grids, axes))
        if not np.isnan(grid[idx]):
            raise ConfigError(f"step-time profile {path}: row {k + 2} repeats a measured point")
        grid[idx] = lat[k]
    if np.isnan(grid).any():
        raise ConfigError(f"step-time profile {path}: the rows do not form a full grid over {', '.join(axes)}")
    return {
        "kind": TIME_MODEL_KINDS["table"],
        "axes": [AXES[a] for a in axes],
        "xs": grids[0],
        "ys": grids[1] if len(axes) == 2 else np.zeros(1),
        "latency": grid.reshape(-1),
    }
