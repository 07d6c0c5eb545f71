"""An SLO: the one shape every spec writes it in (``aisim sweep``'s ``[slo]``, a capacity spec's ``[slo]``, a
pipeline spec's ``[capacity.slo]``, a sweep's ``[capacity.slo]``).

::

    ttft_s = 2.0          # per-request thresholds, seconds: a request meets the SLO when it finished
    tpot_s = 0.05         #   and every given threshold holds (sql/views/slo_attainment.sql)
    e2e_s = 30.0
    attainment = 0.95     # the share of requests that must meet the thresholds (with thresholds)
    ttft_p99_s = 1.0      # percentile limits: {ttft,tpot,e2e}_{p50,p90,p99}_s

An SLO gives a threshold or a percentile limit.  ``attainment`` goes with thresholds: a capacity search
needs it there (:func:`aisim.capacity.spec.question_from_dict`); a percentile-only SLO has none (its
limits are the whole SLO) and refuses one.  A sweep ranks by goodput within the thresholds, so its
``[slo]`` refuses ``attainment`` and the limits with the reason (``[capacity.slo]`` takes them).
Every error names the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from aisim.errors import ConfigError

# Per-request thresholds, seconds: the latency columns (aisim.columns.LATENCIES, which pulls in Arrow;
# tests/test_slo_shape.py checks the two agree).
SLO_KEYS = ("ttft_s", "tpot_s", "e2e_s")
# Percentile limits: the summary's percentiles, named as the summaries table names them.
PERCENTILES = ("p50", "p90", "p99")
LIMITS = {f"{lat[:-2]}_{p}_s": (lat, p) for lat in SLO_KEYS for p in PERCENTILES}
LIMIT_KEYS = tuple(LIMITS)
KEYS = SLO_KEYS + ("attainment",) + LIMIT_KEYS


@dataclass(frozen=True)
class Slo:
    """A validated SLO (see the module docstring).

    Attributes
    ----------
    attainment : float or None
        The share of requests, in (0, 1], that must meet every threshold; None: no thresholds
        (a percentile-only SLO) or a sweep's goodput SLO.
    thresholds : dict
        Per-request thresholds in seconds, keys of :data:`SLO_KEYS`.
    limits : dict
        Percentile limits in seconds, keys of :data:`LIMIT_KEYS`.
    """

    attainment: float | None = None
    thresholds: dict = field(default_factory=dict)
    limits: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The SLO as its ``[slo]`` table gives it."""
        share = {"attainment": self.attainment} if self.attainment is not None else {}
        return {**self.thresholds, **share, **self.limits}

    def describe(self) -> str:
        """``0.95 of requests within ttft_s <= 2, tpot_s <= 0.05; ttft_p99_s <= 1`` (``ttft_p99_s <= 1``
        for a percentile-only SLO)."""
        parts = []
        if self.thresholds:
            within = ", ".join(f"{k} <= {v:g}" for k, v in self.thresholds.items())
            parts.append(f"{self.attainment:.4g} of requests within {within}" if self.attainment is not None
                         else f"requests within {within}")
        if self.limits:
            parts.append(", ".join(f"{k} <= {v:g}" for k, v in self.limits.items()))
        return "; ".join(parts)


def slo_from_dict(raw, where: str = "", prefix: str = "slo.") -> Slo:
    """Validate an SLO mapping strictly.

    Parameters
    ----------
    raw : dict
        Keys of :data:`KEYS`.
    where : str
        Appended to messages (`` in spec.toml``).
    prefix : str
        Prepended to key names in messages.

    Raises
    ------
    ConfigError
        An unknown key, a value out of range, neither a threshold nor a limit, or an ``attainment``
        without a threshold; the message names the key.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"'{prefix.rstrip('.')}'{where} must be a table of {', '.join(KEYS)}")
    for k in raw:
        if k not in KEYS:
            raise ConfigError(f"unknown key '{prefix}{k}'{where}; known keys: {', '.join(KEYS)}")
    out = {}
    for k, v in raw.items():
        if k == "attainment":
            continue
        # not (v > 0) refuses NaN too; TOML writes nan and inf
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not v > 0:
            raise ConfigError(f"'{prefix}{k}'{where} must be a finite positive number of seconds, got {v!r}")
        out[k] = float(v)
    if not out:
        raise ConfigError(f"'{prefix.rstrip('.')}'{where} must give a threshold ({', '.join(SLO_KEYS)}) or a "
                          f"percentile limit ({', '.join(LIMIT_KEYS)})")
    thresholds = {k: out[k] for k in SLO_KEYS if k in out}
    share = raw.get("attainment")
    if share is not None:
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:  # NaN fails too
            raise ConfigError(f"'{prefix}attainment'{where} must be a share in (0, 1], got {share!r}")
        if not thresholds:
            raise ConfigError(f"'{prefix}attainment'{where} is the share of requests within the thresholds "
                              f"({', '.join(SLO_KEYS)}), and none is given: a percentile-only SLO needs none")
        share = float(share)
    return Slo(attainment=share, thresholds=thresholds, limits={k: out[k] for k in LIMIT_KEYS if k in out})


def goodput_slo(raw, where: str = "", prefix: str = "slo.") -> Slo:
    """A sweep's ``[slo]``: the shape of :func:`slo_from_dict`, thresholds only (goodput counts the
    requests within them); ``attainment`` and percentile limits are refused with the reason."""
    slo = slo_from_dict(raw, where, prefix)
    extra = [k for k in raw if k == "attainment" or k in LIMITS]
    if extra:
        raise ConfigError(f"'{prefix}{extra[0]}'{where}: a sweep ranks its candidates by goodput, the requests "
                          f"within the thresholds ({', '.join(SLO_KEYS)}) per second; an attainment or a percentile "
                          "limit is a capacity question: give it in '[capacity.slo]'")
    return slo
