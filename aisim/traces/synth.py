"""Synthetic workloads, deterministic from a seed.

:func:`synth_trace` draws arrivals (Poisson, or gamma with a coefficient of
variation), prompt and output lengths (fixed, uniform or lognormal), optional
shared-prefix groups and multi-turn sessions, and returns the trace table
(clock ``time``).  All randomness comes from one ``numpy.random.Generator``
made from ``seed`` inside the call; the same arguments give the same table.

Lengths are given as :class:`Lengths` or as a spec string:
``"fixed:N"``, ``"uniform:LOW:HIGH"`` (inclusive) or ``"lognormal:MEAN:SIGMA"``
(``SIGMA`` the standard deviation of the log; rounded, at least 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from aisim.errors import ConfigError
from aisim.traces.common import BadRows, finish, new_rows
from aisim.traces.schema import canonical_segments, output_streams, stream_id, trace_table


@dataclass(frozen=True)
class Lengths:
    """A token-length distribution.

    Attributes
    ----------
    kind : str
        ``fixed`` (``a``), ``uniform`` (integers ``a`` to ``b`` inclusive) or
        ``lognormal`` (mean ``a``, log standard deviation ``b``).
    a, b : float
    """

    kind: str
    a: float
    b: float = 0.0

    def __post_init__(self):
        if self.kind not in ("fixed", "uniform", "lognormal"):
            raise ConfigError(f"length distribution must be fixed, uniform or lognormal, got '{self.kind}'")
        if not (math.isfinite(self.a) and math.isfinite(self.b)):
            raise ConfigError(f"length distribution {self.kind} needs finite parameters")
        if self.kind == "fixed" and (self.a < 1 or self.a != int(self.a)):
            raise ConfigError(f"fixed length must be an integer of at least 1, got {self.a}")
        if self.kind == "uniform" and not 1 <= self.a <= self.b:
            raise ConfigError(f"uniform lengths need 1 <= low <= high, got {self.a:g}..{self.b:g}")
        if self.kind == "lognormal" and (self.a < 1 or self.b < 0):
            raise ConfigError(f"lognormal lengths need mean >= 1 and sigma >= 0, got {self.a:g}, {self.b:g}")

    @classmethod
    def parse(cls, spec) -> "Lengths":
        """A :class:`Lengths` from ``"fixed:N"``, ``"uniform:LOW:HIGH"``, ``"lognormal:MEAN:SIGMA"`` or an int."""
        if isinstance(spec, Lengths):
            return spec
        if isinstance(spec, int) and not isinstance(spec, bool):
            return cls("fixed", spec)
        parts = str(spec).split(":")
        want = {"fixed": 2, "uniform": 3, "lognormal": 3}
        if parts[0] not in want or len(parts) != want[parts[0]]:
            raise ConfigError(f"length spec must be fixed:N, uniform:LOW:HIGH or lognormal:MEAN:SIGMA, got '{spec}'")
        try:
            nums = [float(p) for p in parts[1:]]
        except ValueError:
            raise ConfigError(f"length spec '{spec}' has a parameter that is not a number") from None
        return cls(parts[0], *nums)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` lengths (int64, at least 1)."""
        if self.kind == "fixed":
            return np.full(n, int(self.a), dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(int(self.a), int(self.b), endpoint=True, size=n).astype(np.int64)
        mu = math.log(self.a) - self.b ** 2 / 2  # so that the mean is a
        return np.maximum(np.rint(rng.lognormal(mu, self.b, size=n)), 1).astype(np.int64)


def interarrivals(rng: np.random.Generator, n: int, rate: float, arrival: str = "poisson",
                  cv: float = 1.0) -> np.ndarray:
    """``n`` gaps between arrivals with mean ``1/rate`` seconds.

    ``poisson``: exponential gaps; ``gamma``: gamma gaps of shape ``1/cv**2``
    (coefficient of variation ``cv``; ``cv = 1`` is Poisson, larger is burstier).
    """
    if arrival == "poisson":
        return rng.exponential(1.0 / rate, size=n)
    shape = 1.0 / cv ** 2
    return rng.gamma(shape, 1.0 / (rate * shape), size=n)


def synth_trace(requests: int, *, seed: int, rate: float = 1.0, arrival: str = "poisson", cv: float = 1.0,
                prompt="lognormal:1024:0.8", output="lognormal:128:0.8", followup=None,
                prefix_groups: int = 0, prefix_len: int = 0, prefix_fraction: float = 0.0,
                turns: int = 1, think_time_s: float = 0.0, model: str | None = None,
                unit_tokens: int = 16):
    """Generate a synthetic trace table.

    Parameters
    ----------
    requests : int
        Number of requests (turns included); the last session may be cut short.
    seed : int
        Seed of the generator owned by this call.
    rate : float
        Arrivals per second of requests (``turns=1``) or of sessions.
    arrival : {"poisson", "gamma"}
        Inter-arrival distribution.
    cv : float
        Coefficient of variation of gamma gaps (must be 1 with ``poisson``).
    prompt, output : Lengths or str
        New input tokens of a request (a first turn) and output tokens.
    followup : Lengths or str, optional
        New input tokens of a later turn (default: ``prompt``).
    prefix_groups, prefix_len, prefix_fraction : int, int, float
        A fraction ``prefix_fraction`` of sessions starts with one of
        ``prefix_groups`` shared prefixes (chosen uniformly) of ``prefix_len``
        tokens, prepended to the drawn input.
    turns : int
        Requests per session; turn ``k + 1`` arrives an exponential think time
        (mean ``think_time_s``) after turn ``k`` and its prompt is turn ``k``'s
        prompt, then turn ``k``'s output, then new input.
    think_time_s : float
        Mean think time between turns.
    model : str, optional
        Model of every request.
    unit_tokens : int
        Block size recorded in the metadata (the default of ``inspect``).

    Returns
    -------
    pyarrow.Table
        The trace table; ``request_id`` is ``r<i>`` (``s<session>.t<turn>``
        with sessions), metadata ``clock=time``, ``format=synth``, ``seed``.

    Raises
    ------
    ConfigError
        A parameter out of range.
    """
    _check(requests, seed, rate, arrival, cv, prefix_groups, prefix_len, prefix_fraction, turns, think_time_s,
           unit_tokens)
    p_len, o_len = Lengths.parse(prompt), Lengths.parse(output)
    f_len = Lengths.parse(followup) if followup is not None else p_len
    rng = np.random.default_rng(seed)
    n_sessions = -(-requests // turns)
    starts = np.cumsum(interarrivals(rng, n_sessions, rate, arrival, cv))
    starts -= starts[0]
    first_in = p_len.draw(rng, n_sessions)
    grouped = rng.random(n_sessions) < prefix_fraction if prefix_groups and prefix_len else \
        np.zeros(n_sessions, bool)
    group = rng.integers(0, max(prefix_groups, 1), size=n_sessions)
    later_in = f_len.draw(rng, requests)
    outs = o_len.draw(rng, requests)
    think = rng.exponential(think_time_s, size=requests) if think_time_s > 0 else np.zeros(requests)

    rows = new_rows()
    multi = turns > 1
    sess = np.arange(requests) // turns
    turn = np.arange(requests) % turns
    ids = [f"s{s}.t{t}" if multi else f"r{s}" for s, t in zip(sess.tolist(), turn.tolist())]
    out_streams = output_streams(ids)
    prefix_streams = [stream_id("synth-prefix", str(g)) for g in range(max(prefix_groups, 1))]
    prev = None
    t_now = 0.0
    for i, rid in enumerate(ids):
        s, k = int(sess[i]), int(turn[i])
        own = stream_id("synth-input", rid)
        if k == 0:
            segs = [(prefix_streams[group[s]], 0, prefix_len)] if grouped[s] else []
            segs.append((own, 0, int(first_in[s])))
            t_now = float(starts[s])
        else:
            p_segs, p_i = prev
            segs = p_segs + [(int(out_streams[p_i]), 0, int(outs[p_i])), (own, 0, int(later_in[i]))]
            t_now += float(think[i])
        segs = canonical_segments(segs)
        tokens = sum(n for _, _, n in segs)
        if tokens >= 2**31:
            raise ConfigError(f"request {rid} grows to {tokens} prompt tokens; use fewer turns or shorter lengths")
        rows["model"].append(model)
        rows["request_id"].append(rid)
        rows["session_id"].append(f"s{s}" if multi else None)
        rows["turn"].append(k)
        rows["arrival_step"].append(None)
        rows["arrival_s"].append(t_now)
        rows["prompt_tokens"].append(tokens)
        rows["output_tokens"].append(int(outs[i]))
        rows["priority"].append(0)
        rows["segments"].append(segs)
        prev = (segs, i)
    table = finish(trace_table(rows, "time"), "synth", BadRows(False), unit_tokens)
    meta = dict(table.schema.metadata)
    meta[b"seed"] = str(seed).encode()
    return table.replace_schema_metadata(meta)


def _check(requests, seed, rate, arrival, cv, groups, prefix_len, fraction, turns, think, unit_tokens):
    def integer(name, v, low):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
            raise ConfigError(f"synth: '{name}' must be an integer of at least {low}, got {v!r}")

    def number(name, v, low, high=math.inf, open_low=False):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v < low or v > high or (open_low and v == low):
            span = f"above {low}" if open_low else f"from {low}" + ("" if high == math.inf else f" to {high}")
            raise ConfigError(f"synth: '{name}' must be a number {span}, got {v!r}")

    integer("requests", requests, 1)
    integer("seed", seed, 0)
    integer("turns", turns, 1)
    integer("prefix_groups", groups, 0)
    integer("prefix_len", prefix_len, 0)
    integer("unit_tokens", unit_tokens, 1)
    number("rate", rate, 0, open_low=True)
    number("cv", cv, 0, open_low=True)
    number("prefix_fraction", fraction, 0, 1)
    number("think_time_s", think, 0)
    if arrival not in ("poisson", "gamma"):
        raise ConfigError(f"synth: 'arrival' must be poisson or gamma, got {arrival!r}")
    if arrival == "poisson" and cv != 1:
        raise ConfigError("synth: 'cv' applies to gamma arrivals (Poisson has cv 1)")
    if fraction > 0 and (groups == 0 or prefix_len == 0):
        raise ConfigError("synth: 'prefix_fraction' needs 'prefix_groups' and 'prefix_len' of at least 1")
