"""Fitting the time model's fitted constants to measured runs, and cross-validating the fit.

The constants are the :data:`aisim.config.keys.TIME_MODEL_KEYS` entries flagged ``fitted``
(:func:`fitted_keys`), read from there.  The fit minimises the mean squared log error
``log(predicted / measured)`` over every run and metric (:data:`aisim.config.calibration.METRICS`
the run measured), each run replayed as :mod:`aisim.calibrate.workload` rebuilds it and its
statistics taken as :mod:`aisim.calibrate.predict` does.  The search is Levenberg-Marquardt
(:mod:`aisim.calibrate.optimize`) over the constants' logarithms (each stays positive; a value the
engine refuses, an efficiency above 1, is an infinite residual), from the engine's own values.

:func:`calibrate` fits on every run, then once per file on every other file's runs
(leave-one-file-out): each run's held-out error comes from a fit that never saw its file.  The
held-out errors' quantiles go into the ``calibration`` record (:mod:`aisim.config.calibration`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from aisim.config.calibration import METRICS, QUANTILES
from aisim.errors import ConfigError, MeasurementError



def fitted_keys() -> tuple:
    """The names of the time-model constants a fit sets, in catalogue order."""
    from aisim.config.keys import TIME_MODEL_KEYS

    return tuple(k.name for k in TIME_MODEL_KEYS if k.fitted)


def default_keys(engine) -> tuple:
    """The constants a calibration of ``engine`` fits unless told which: every fitted constant its time
    model holds above zero (one held at zero, a term the defaults leave off such as ``layer_overhead_s``,
    stays off unless named with a positive start) and acts on (the executor's cost only with ``tp`` above 1,
    where vLLM runs a worker process a GPU)."""
    tm = engine.time_model
    return tuple(k for k in fitted_keys() if getattr(tm, k) > 0 and (k != "executor_per_req_s" or tm.tp > 1))


@dataclass
class Prepared:
    """A measured run and its rebuilt trace (:func:`aisim.calibrate.workload.run_trace`)."""

    run: object
    trace: object
    kw: dict
    sends: np.ndarray


@dataclass
class FitResult:
    """The constants a fit found, its loss (mean squared log error) and the iterations it took."""

    values: dict
    loss: float
    iterations: int


@dataclass
class Calibration:
    """What :func:`calibrate` found.

    Attributes
    ----------
    engine : EngineConfig
        The engine with the fitted constants and the ``calibration`` record.
    fit : FitResult
        The fit on every run.
    rows : list of dict
        One per run and metric it measured: ``run`` (its label), ``file``, ``metric``,
        ``measured``, ``fitted`` (predicted by the fit on every run), ``held_out`` (predicted by
        the fit that left the run's file out), and their relative errors ``fitted_error`` and
        ``held_out_error`` (``predicted / measured - 1``).
    folds : dict
        File -> :class:`FitResult` of the fit without it.
    record : dict
        The ``calibration`` record.
    """

    engine: object
    fit: FitResult
    rows: list
    folds: dict
    record: dict


def prepare(runs, seed: int = 0, engine=None) -> list:
    """Each run with its trace rebuilt once (a fit replays it many times).

    With ``engine``, each trace is checked against it as a replay checks it: a request the engine
    cannot hold (a prompt longer than ``max_model_len``) is a :class:`MeasurementError` naming the run.
    """
    from aisim.calibrate.workload import run_trace

    out = [Prepared(r, *run_trace(r, seed)) for r in runs]
    if engine is not None:
        from aisim.replay import check_trace

        for p in out:
            fault = check_trace(p.trace, engine)
            if fault is not None:
                raise MeasurementError(f"{p.run.source}: the run cannot be replayed on this engine: "
                                       f"{fault}")
    return out


def with_constants(engine, values: dict):
    """``engine`` with the time model's constants ``values`` (validated by the engine's own rules)."""
    tm = dict(engine.raw.get("time_model", {}))
    tm.update(values)
    return engine.replace(time_model=tm)


def predict_runs(prepared: list, engine) -> list:
    """The metrics of every prepared run replayed on ``engine``."""
    from aisim.calibrate.predict import replay_metrics

    return [replay_metrics(p.trace, p.kw, p.sends, engine) for p in prepared]


def residuals(prepared: list, preds: list, metrics=METRICS) -> np.ndarray:
    """``log(predicted / measured)`` of every run's measured ``metrics``, over the square root of their count.

    Their sum of squares is the fit's loss: the mean squared log error.  A prediction of 0 or
    less (a replay that produced no such statistic) is an infinite residual.
    """
    out = []
    for p, q in zip(prepared, preds):
        for m in metrics:
            meas = p.run.metrics.get(m)
            if meas:
                out.append(math.log(q[m] / meas) if q[m] > 0 else math.inf)
    return np.array(out) / math.sqrt(max(len(out), 1))


def fit(prepared: list, engine, keys: tuple, *, metrics=METRICS, max_iter: int = 60, label: str = "fit",
        progress=None) -> FitResult:
    """Fit ``keys`` of ``engine``'s time model to the prepared runs.

    Parameters
    ----------
    prepared : list of Prepared
    engine : EngineConfig
        The engine the runs ran; its values of ``keys`` are the start.
    keys : tuple of str
        Time-model constants to fit (a subset of :func:`fitted_keys`).
    metrics : tuple of str
        Metrics the loss follows.
    max_iter : int
        Levenberg-Marquardt iterations (Jacobians) at most.
    label : str
        Names the fit in progress lines.
    progress : callable, optional
        ``progress(text)`` after each iteration.

    Returns
    -------
    FitResult
    """
    from aisim.calibrate.optimize import least_squares

    start = [getattr(engine.time_model, k) for k in keys]
    for k, v in zip(keys, start):
        if not v > 0:
            raise ConfigError(f"'time_model.{k}' starts at {v}; a fit searches positive values: start it above 0, "
                              "or leave it out of the fit (--fit with the other constants)")

    def values(x) -> dict:
        return {k: float(math.exp(v)) for k, v in zip(keys, x)}

    def f(x) -> np.ndarray:
        try:
            eng = with_constants(engine, values(x))
        except (ConfigError, OverflowError):
            # Out of the constant's range (an efficiency above 1, a cost past its bound or past a float).
            return np.full(len(pairs), math.inf)
        return residuals(prepared, predict_runs(prepared, eng), metrics)

    def report(it, x, cost):
        if progress is not None:
            progress(f"{label}: iteration {it}, loss {cost:.6g}; "
                     + ", ".join(f"{k} {v:.4g}" for k, v in values(x).items()))

    pairs = [(i, m) for i, p in enumerate(prepared) for m in metrics if p.run.metrics.get(m)]
    x, cost, it = least_squares(f, np.log(start), max_iter=max_iter, progress=report)
    return FitResult({k: float(f"{v:.4g}") for k, v in values(x).items()}, cost, it)


def calibrate(runs, engine, *, name: str, keys: tuple | None = None, metrics=METRICS, max_iter: int = 60,
              seed: int = 0, progress=None) -> Calibration:
    """Fit the time model to ``runs`` and cross-validate leaving one file out.

    Parameters
    ----------
    runs : list of MeasuredRun
        From two files or more (:func:`aisim.calibrate.benchserve.read_bench_serve`).
    engine : EngineConfig
        The engine the runs ran.
    name : str
        The calibration's name in its record.
    keys : tuple of str, optional
        Constants to fit; default :func:`default_keys`.
    metrics, max_iter, progress
        As :func:`fit`.
    seed : int
        Seed of the rebuilt send times.

    Returns
    -------
    Calibration

    Raises
    ------
    MeasurementError
        Fewer than two files, or no run measured any of ``metrics``.
    ConfigError
        A linear or table time model, a key that is not a fitted constant, or a start the fit
        cannot search from.
    """
    if engine.time_model.kind in ("linear", "table"):
        raise ConfigError(f"the engine's time model is '{engine.time_model.kind}', which has no fitted constants; "
                          "name the GPU it ran on (time_model.gpu, or --model and --gpu)")
    every = fitted_keys()
    keys = default_keys(engine) if keys is None else tuple(keys)
    for k in keys:
        if k not in every:
            raise ConfigError(f"'{k}' is not a fitted time-model constant; those are: {', '.join(every)}")
    files = list(dict.fromkeys(r.source for r in runs))
    if len(files) < 2:
        raise MeasurementError(f"calibrating needs result files of two runs or more, to hold each file out in turn "
                               f"(got {', '.join(files) or 'none'})")
    if not any(r.metrics.get(m) for r in runs for m in metrics):
        raise MeasurementError(f"no run measured any of {', '.join(metrics)}")
    prepared = prepare(runs, seed, engine)
    whole = fit(prepared, engine, keys, metrics=metrics, max_iter=max_iter, progress=progress)
    fitted = with_constants(engine, whole.values)
    fitted_preds = predict_runs(prepared, fitted)
    folds, held_preds = {}, [None] * len(prepared)
    for f in files:
        inside = [p for p in prepared if p.run.source != f]
        folds[f] = fit(inside, engine, keys, metrics=metrics, max_iter=max_iter,
                       label=f"without {os.path.basename(f)}", progress=progress)
        eng = with_constants(engine, folds[f].values)
        for i, p in enumerate(prepared):
            if p.run.source == f:
                held_preds[i] = predict_runs([p], eng)[0]
    rows = []
    for p, q, h in zip(prepared, fitted_preds, held_preds):
        for m in METRICS:
            meas = p.run.metrics.get(m)
            if meas:
                rows.append({"run": p.run.label, "file": p.run.source, "metric": m, "measured": meas,
                             "fitted": q[m], "held_out": h[m], "fitted_error": q[m] / meas - 1.0,
                             "held_out_error": h[m] / meas - 1.0})
    record = {"name": name, "method": "leave-one-file-out", "sources": [os.path.basename(f) for f in files],
              "points": len(prepared), "fitted": list(keys), "quantiles": list(QUANTILES),
              "held_out": held_out_quantiles(rows)}
    tm = dict(engine.raw.get("time_model", {}), **whole.values, calibration=record)
    return Calibration(engine.replace(time_model=tm), whole, rows, folds, record)


def held_out_quantiles(rows: list) -> dict:
    """Metric -> the :data:`QUANTILES` of its rows' held-out relative errors, rounded to 4 decimals."""
    out = {}
    for m in METRICS:
        e = [r["held_out_error"] for r in rows if r["metric"] == m]
        if e:
            out[m] = [round(float(v), 4) for v in np.percentile(np.array(e), [100 * q for q in QUANTILES])]
    return out
