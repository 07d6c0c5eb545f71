"""Load as a knob: a trace's arrivals scaled, or re-timed as a Poisson process, before the core sees them.

Two transforms, one at a time (``load`` is a dict of :data:`LOAD_KEYS`):

``rate_scale = f``
    The arrival rate times ``f``: every arrival divided by ``f``.  On a trace
    clocked in seconds ``arrival_s / f``; on one clocked in engine steps
    ``floor(arrival_step / f)`` (arrivals stay whole steps, in order).
``poisson_rate = r`` (with ``seed``, default 0)
    The requests keep their trace order and are sent as a Poisson process of
    ``r`` requests per second: the first at 0 s, each next one an exponential
    gap (mean ``1/r``, :func:`aisim.traces.synth.interarrivals`) later.  The
    result is clocked in seconds whatever the trace's clock was.  The gaps
    come from ``numpy.random.default_rng(seed)``, one per request in trace
    order: the same seed gives the same arrivals, and a trace re-timed in
    pieces (:class:`Retimer`, as the pipeline's shards stream it) gets the
    same arrivals, bit for bit, as the whole trace (:func:`retime`).

``max_concurrency = n``
    Not a transform of the trace but of the client that sends it: at most
    ``n`` requests in flight, as ``vllm bench serve --max-concurrency``; a
    request due while ``n`` are in flight is sent when one finishes (in
    trace order), and its latencies count from then.  The core enforces it
    (``aisim._core.engine.Engine(max_concurrency=n)``); it combines with
    either transform.

Sessions keep their turns; a closed-loop replay paces turns by their
previous turn, so load applies to open-loop replays only.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from aisim.errors import ConfigError

LOAD_KEYS = ("rate_scale", "poisson_rate", "seed", "max_concurrency")
# The keys that re-time the trace (the rest shape the client).
TRANSFORM_KEYS = ("rate_scale", "poisson_rate", "seed")
# The range of each transform: arrivals stay finite (a rate scale of 1e-300 overflows a step clock's
# int64 arrivals, a Poisson rate of 1e-300 gives gaps of 1e300 s) and the replay meaningful.
RANGES = {"rate_scale": (1e-6, 1e6), "poisson_rate": (1e-6, 1e9)}
# Requests in flight: the core counts them in int32.
MAX_CONCURRENCY = 2**31 - 1


def check_load(raw: dict, where: str = "", prefix: str = "") -> dict:
    """Validate a load transform; return it with only the keys given (an empty dict: no transform).

    Parameters
    ----------
    raw : dict
        Keys of :data:`LOAD_KEYS`; ``None`` values count as absent.
    where : str
        Appended to messages (e.g. `` in spec.toml``).
    prefix : str
        Prepended to key names in messages (e.g. ``replay.``).

    Raises
    ------
    ConfigError
        An unknown key, a value out of range, or both transforms at once.
    """
    raw = {k: v for k, v in raw.items() if v is not None}
    for k in raw:
        if k not in LOAD_KEYS:
            raise ConfigError(f"unknown key '{prefix}{k}'{where}; known keys: {', '.join(LOAD_KEYS)}")
    out = {}
    for k in ("rate_scale", "poisson_rate"):
        if k in raw:
            v = raw[k]
            # not (v > 0) refuses NaN too
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not v > 0:
                raise ConfigError(f"'{prefix}{k}'{where} must be a finite positive number, got {v!r}")
            lo, hi = RANGES[k]
            if not lo <= v <= hi:
                raise ConfigError(f"'{prefix}{k}'{where} must be from {lo:g} to {hi:g}, got {v!r}")
            out[k] = float(v)
    if len(out) == 2:
        raise ConfigError(f"'{prefix}rate_scale' and '{prefix}poisson_rate'{where} are alternatives; give one")
    if "seed" in raw:
        v = raw["seed"]
        if "poisson_rate" not in out:
            raise ConfigError(f"'{prefix}seed'{where} seeds a Poisson re-timing; set '{prefix}poisson_rate'")
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"'{prefix}seed'{where} must be a non-negative integer, got {v!r}")
        out["seed"] = v
    if "max_concurrency" in raw:
        v = raw["max_concurrency"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"'{prefix}max_concurrency'{where} must be a positive integer, got {v!r}")
        if v > MAX_CONCURRENCY:
            raise ConfigError(f"'{prefix}max_concurrency'{where} must be from 1 to {MAX_CONCURRENCY}, got {v!r}")
        out["max_concurrency"] = v
    return out


def describe_load(load: dict) -> str:
    """``rate x2``, ``Poisson 5 req/s (seed 0)`` or ``as traced``, then ``, at most 16 in flight``."""
    if "rate_scale" in load:
        text = f"rate x{load['rate_scale']:g}"
    elif "poisson_rate" in load:
        text = f"Poisson {load['poisson_rate']:g} req/s (seed {load.get('seed', 0)})"
    else:
        text = "as traced"
    if "max_concurrency" in load:
        text += f", at most {load['max_concurrency']} in flight"
    return text


class Retimer:
    """Re-time a trace given in pieces, in trace order (see the module docstring).

    Parameters
    ----------
    load : dict
        Load as :func:`check_load` returns it (no transform: pieces pass unchanged).
    timed : bool
        The trace is clocked in seconds (``arrival_s``), else in engine steps.

    Attributes
    ----------
    timed : bool
        Whether the re-timed pieces are clocked in seconds.
    """

    def __init__(self, load: dict, timed: bool):
        self.load = {k: v for k, v in load.items() if k in TRANSFORM_KEYS}  # max_concurrency is the core's
        self.timed = timed or "poisson_rate" in load
        self._was_timed = timed
        self._rng = np.random.default_rng(load.get("seed", 0)) if "poisson_rate" in load else None
        self._clock = None  # the last arrival handed out (Poisson)

    def __call__(self, piece: pa.Table) -> pa.Table:
        """The next piece, re-timed."""
        n = piece.num_rows
        if not self.load or n == 0:
            return piece
        if "rate_scale" in self.load:
            f = self.load["rate_scale"]
            if self._was_timed:
                return _set(piece, "arrival_s", pa.array(_numbers(piece, "arrival_s") / f, pa.float64()))
            steps = np.floor(_numbers(piece, "arrival_step") / f).astype(np.int64)
            return _set(piece, "arrival_step", pa.array(steps, pa.int64()))
        from aisim.traces.synth import interarrivals

        gaps = interarrivals(self._rng, n, self.load["poisson_rate"])
        if self._clock is None:  # the first request is sent at 0 s
            gaps[0] = 0.0
            self._clock = 0.0
        # Sequential sums from the last arrival: the same floats however the trace is cut.
        arrival = np.cumsum(np.concatenate([[self._clock], gaps]))[1:]
        self._clock = float(arrival[-1])
        piece = _set(piece, "arrival_s", pa.array(arrival, pa.float64()))
        return _set(piece, "arrival_step", pa.nulls(n, piece.schema.field("arrival_step").type))


def retime(trace: pa.Table, **load) -> pa.Table:
    """``trace`` with its arrivals transformed by ``load`` (:data:`LOAD_KEYS`, ``max_concurrency`` aside).

    Returns
    -------
    pyarrow.Table
        The trace table, metadata ``clock`` ``time`` after a Poisson re-timing.

    Raises
    ------
    ConfigError
        A transform out of range (:func:`check_load`).
    """
    load = check_load(load)
    meta = dict(trace.schema.metadata or {})
    r = Retimer(load, meta.get(b"clock") == b"time")
    out = r(trace)
    meta[b"clock"] = b"time" if r.timed else b"step"
    return out.replace_schema_metadata(meta)


def _numbers(piece: pa.Table, name: str) -> np.ndarray:
    return piece.column(name).to_numpy(zero_copy_only=False).astype(np.float64)


def _set(piece: pa.Table, name: str, values) -> pa.Table:
    i = piece.schema.get_field_index(name)
    return piece.set_column(i, piece.schema.field(i), values)
