"""The ``calibration`` record of a time model, and the step-time band it gives.

A time model fitted to measurements says which fit produced it and how far that fit's
predictions fell from measurements it never saw: the quantiles :data:`QUANTILES` of the
held-out relative errors (``predicted / measured - 1``) of each metric.  ``aisim calibrate``
writes one into the time model it fits (``[time_model.calibration]``); the defaults carry
:data:`DEFAULT_CALIBRATION`, the held-out errors of the fit that set them.

The band: a TPOT or ITL of a replay is a sum of step times, so a held-out relative error ``e``
of TPOT says the real steps took ``1 / (1 + e)`` of the predicted ones.  The step-time scale
factors :func:`scale_band` returns are those of the extreme quantiles, the wider of TPOT's and
ITL's: a capacity search replayed with every step time multiplied by the low factor
(``time_model.time_scale``) gives the optimistic end of its answer, with the high factor the
pessimistic end.
"""

from __future__ import annotations

import math

from aisim.errors import ConfigError

# Quantiles of the held-out relative errors a record keeps: the band is the outer two (80 %).
QUANTILES = (0.1, 0.5, 0.9)
# The metrics a record may hold errors of, in the order ``aisim calibrate`` prints them
# (vllm bench serve's mean TTFT, TPOT, ITL, E2E latency and its output throughput).
# Each with the unit of its measured and predicted values.
METRIC_UNITS = {"ttft": "ms", "tpot": "ms", "itl": "ms", "e2el": "ms", "throughput": "tok/s"}
METRICS = tuple(METRIC_UNITS)
# The metrics whose errors are step-time errors (a sum of step times each): the band's.
STEP_METRICS = ("tpot", "itl")
_KEYS = ("name", "method", "sources", "points", "fitted", "quantiles", "held_out")

# The defaults' calibration (aisim/config/keys.py's fitted values): fitted on the sources
# cssnoeasy, kvcached, vllm-pr and inferencex, held out dennislee22, gpustack, michaelvll,
# michaelvll-sgl, nerdalert and simon-mo (benchmarks/data/README.md: 94 rows; their median absolute
# errors there, TTFT 14.6 %, TPOT 9.1 %, throughput 7.8 %); the signed quantiles are what `python
# benchmarks/default_calibration.py` prints for those defaults (rerun it after a refit or a change
# of the step-time model or of the published rows).
DEFAULT_CALIBRATION = {
    "name": "aisim defaults",
    "method": "held-out sources of benchmarks/data/published_vllm.csv",
    "sources": ["cssnoeasy", "kvcached", "vllm-pr", "inferencex"],
    "points": 94,
    "fitted": [],
    "quantiles": list(QUANTILES),
    "held_out": {"ttft": [-0.523, -0.018, 0.274], "tpot": [-0.239, 0.033, 0.299],
                 "throughput": [-0.127, 0.004, 0.528]},
}


def parse_calibration(raw, at: str = "") -> dict:
    """Validate a ``time_model.calibration`` mapping; return it with lists as lists.

    Parameters
    ----------
    raw : dict
        ``name`` (str), ``method`` (str), ``sources`` (list of str), ``points`` (int >= 0),
        ``fitted`` (list of str), ``quantiles`` (increasing, in (0, 1)), ``held_out``
        (metric of :data:`METRICS` -> one relative error per quantile, each above -1).
    at : str
        `` in FILE`` for messages.

    Raises
    ------
    ConfigError
        Naming the key at fault.
    """
    p = "time_model.calibration"
    if not isinstance(raw, dict):
        raise ConfigError(f"'{p}'{at} must be a mapping")
    for k in raw:
        if k not in _KEYS:
            raise ConfigError(f"unknown key '{p}.{k}'{at}; known keys: {', '.join(_KEYS)}")
    for k in ("name", "method"):
        if not isinstance(raw.get(k), str):
            raise ConfigError(f"'{p}.{k}'{at} must be a string")
    for k in ("sources", "fitted"):
        v = raw.get(k, [])
        if not isinstance(v, (list, tuple)) or not all(isinstance(s, str) for s in v):
            raise ConfigError(f"'{p}.{k}'{at} must be a list of strings")
    n = raw.get("points", 0)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"'{p}.points'{at} must be a non-negative integer, got {n!r}")
    qs = raw.get("quantiles", list(QUANTILES))
    if (not isinstance(qs, (list, tuple)) or len(qs) < 2 or not all(_num(q) and 0 < q < 1 for q in qs)
            or list(qs) != sorted(set(qs))):
        raise ConfigError(f"'{p}.quantiles'{at} must be two or more increasing numbers in (0, 1), got {qs!r}")
    held = raw.get("held_out", {})
    if not isinstance(held, dict):
        raise ConfigError(f"'{p}.held_out'{at} must be a mapping of metric to errors")
    for m, v in held.items():
        if m not in METRICS:
            raise ConfigError(f"unknown metric '{p}.held_out.{m}'{at}; known: {', '.join(METRICS)}")
        if (not isinstance(v, (list, tuple)) or len(v) != len(qs) or not all(_num(e) and e > -1 for e in v)
                or list(v) != sorted(v)):
            raise ConfigError(f"'{p}.held_out.{m}'{at} must be {len(qs)} non-decreasing relative errors "
                              f"above -1 (one per quantile), got {v!r}")
    return {"name": raw["name"], "method": raw["method"], "sources": list(raw.get("sources", [])),
            "points": n, "fitted": list(raw.get("fitted", [])), "quantiles": [float(q) for q in qs],
            "held_out": {m: [float(e) for e in held[m]] for m in METRICS if m in held}}


def _num(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def scale_band(calibration: dict | None) -> tuple[float, float] | None:
    """The step-time scale factors ``(low, high)`` of a calibration's held-out step-time errors.

    ``low = 1 / (1 + e_hi)`` and ``high = 1 / (1 + e_lo)`` for the outer quantiles ``e_lo``,
    ``e_hi`` of each of :data:`STEP_METRICS` the record holds, the smallest low and the largest
    high of them.  None when the record holds neither.

    Examples
    --------
    Held-out TPOT errors from -10 % to +25 %: the real steps took 0.8 to 1.11 of the predicted.

    >>> scale_band({"quantiles": [0.1, 0.5, 0.9], "held_out": {"tpot": [-0.1, 0.0, 0.25]}})
    (0.8, 1.1111111111111112)
    """
    if not calibration:
        return None
    errs = [calibration["held_out"][m] for m in STEP_METRICS if m in calibration.get("held_out", {})]
    if not errs:
        return None
    return min(1.0 / (1.0 + e[-1]) for e in errs), max(1.0 / (1.0 + e[0]) for e in errs)


def calibration_of(time_model) -> dict:
    """The calibration a time model's constants come from: its own record, else the defaults'."""
    return time_model.calibration if time_model.calibration is not None else DEFAULT_CALIBRATION


def band_label(calibration: dict) -> str:
    """How an answer names its calibration: ``calibration NAME (held out: METHOD)``."""
    q = calibration["quantiles"]
    return (f"band: {round(100 * (q[-1] - q[0]))} % of held-out step-time errors, calibration "
            f"'{calibration['name']}' ({calibration['method']}, {calibration['points']} points)")
