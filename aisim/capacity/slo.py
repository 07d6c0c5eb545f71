"""A capacity search's SLO: per-request thresholds, the share that must meet them, percentile limits.

The ``[slo]`` table of a capacity spec (or :func:`slo_from_dict`'s mapping)::

    ttft_s = 2.0          # per-request thresholds, seconds (aisim sweep's keys)
    tpot_s = 0.05
    e2e_s = 30.0
    attainment = 0.95     # required: the share of requests that must meet every threshold
    ttft_p99_s = 1.0      # optional percentile limits: {ttft,tpot,e2e}_{p50,p90,p99}_s

A request meets the thresholds as ``sql/views/slo_attainment.sql`` defines it, the one definition
``aisim query slo`` and ``aisim sweep`` use too: it finished and every given threshold holds (a
one-token output has no TPOT and passes that half); a rejected or unfinished request fails.  The
judge runs that macro itself, on an in-memory DuckDB over the replay's request rows.  A percentile
limit holds when the replay summary's percentile (:mod:`aisim.summary`: over the requests that have
the latency) is at most the limit; a latency no request has fails it.  A point meets the SLO when
its attainment is at least ``attainment`` and every percentile limit holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from aisim.columns import LATENCIES
from aisim.errors import ConfigError
from aisim.sweep.runner import SLO_KEYS

# Percentile limits: the summary's percentiles, named as the summaries table names them.
PERCENTILES = ("p50", "p90", "p99")
LIMITS = {f"{lat[:-2]}_{p}_s": (lat, p) for lat in LATENCIES for p in PERCENTILES}
LIMIT_KEYS = tuple(LIMITS)
KEYS = SLO_KEYS + ("attainment",) + LIMIT_KEYS


@dataclass(frozen=True)
class Slo:
    """A validated SLO (see the module docstring).

    Attributes
    ----------
    attainment : float
        The share of requests, in (0, 1], that must meet every threshold.
    thresholds : dict
        Per-request thresholds in seconds, keys of ``aisim.sweep.runner.SLO_KEYS``.
    limits : dict
        Percentile limits in seconds, keys of :data:`LIMIT_KEYS`.
    """

    attainment: float
    thresholds: dict = field(default_factory=dict)
    limits: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The SLO as its ``[slo]`` table gives it."""
        return {**self.thresholds, "attainment": self.attainment, **self.limits}

    def describe(self) -> str:
        """``attainment >= 95% of ttft_s <= 2, tpot_s <= 0.05; ttft_p99_s <= 1``."""
        parts = ", ".join(f"{k} <= {v:g}" for k, v in self.thresholds.items()) or "finished"
        text = f"{self.attainment:.4g} of requests within {parts}"
        if self.limits:
            text += "; " + ", ".join(f"{k} <= {v:g}" for k, v in self.limits.items())
        return text


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
        An unknown key, a value out of range, no ``attainment``, or neither a threshold nor a limit;
        the message names the key.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"'{prefix.rstrip('.')}'{where} must be a table of {', '.join(KEYS)}")
    for k in raw:
        if k not in KEYS:
            raise ConfigError(f"unknown key '{prefix}{k}'{where}; known keys: {', '.join(KEYS)}")
    if "attainment" not in raw:
        raise ConfigError(f"missing key '{prefix}attainment'{where}: the share of requests that must meet the "
                          "thresholds (0 < share <= 1)")
    share = raw["attainment"]
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise ConfigError(f"'{prefix}attainment'{where} must be a share in (0, 1], got {share!r}")
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
    return Slo(attainment=float(share), thresholds={k: out[k] for k in SLO_KEYS if k in out},
               limits={k: out[k] for k in LIMIT_KEYS if k in out})


class Judge:
    """Judges replays against one SLO with ``slo_attainment``, on an in-memory DuckDB.

    Parameters
    ----------
    slo : Slo
    """

    def __init__(self, slo: Slo):
        import duckdb

        from aisim import sql

        self.slo = slo
        self.con = duckdb.connect()
        # What the macro reads, over the rows of the replay being judged (registered as _judged).
        self._register(_empty_requests())
        self.con.execute("CREATE VIEW requests AS SELECT 'point' AS run_id, 0 AS shard_id, "
                         "CAST(status AS VARCHAR) AS status, output_tokens, ttft_s, tpot_s, e2e_s FROM _judged")
        self.con.execute("CREATE VIEW summaries AS SELECT 'point' AS run_id, 0 AS shard_id, "
                         "CAST(NULL AS DOUBLE) AS duration_s, CAST(NULL AS DOUBLE) AS throughput_req_s, "
                         "CAST(NULL AS DOUBLE) AS throughput_tok_s")
        self.con.execute("CREATE VIEW run_shards AS SELECT 'point' AS run_id, 1 AS run_seq, 'capacity' AS run_name, "
                         "0 AS shard_id, '' AS model, '' AS engine")
        self.con.execute(next(v for v in sql.views() if v.name == "slo_attainment").sql)

    def _register(self, requests) -> None:
        self.con.register("_judged", requests.select(["status", "output_tokens", "ttft_s", "tpot_s", "e2e_s"]))

    def __call__(self, requests, summary: dict) -> dict:
        """Judge one replay.

        Parameters
        ----------
        requests : pyarrow.Table
            The replay's (or deployment's) request rows.
        summary : dict
            Its summary (the percentiles).

        Returns
        -------
        dict
            ``requests``, ``finished``, ``slo_met``, ``attainment``, ``meets`` (bool) and ``reason``
            (what failed; None when it meets the SLO).
        """
        self._register(requests)
        t = self.slo.thresholds
        rows = self.con.execute("SELECT requests, finished, slo_met FROM slo_attainment(?, ?, e2e_slo_s := ?)",
                                [t.get("ttft_s"), t.get("tpot_s"), t.get("e2e_s")]).fetchall()
        self._register(_empty_requests())  # the replay's rows are not kept alive by the judge
        n, finished, met = rows[0] if rows else (0, 0, 0)
        attainment = met / n if n else 0.0
        faults = []
        if attainment < self.slo.attainment:
            faults.append(f"attainment {attainment:.4g} < {self.slo.attainment:.4g}")
        for key, limit in self.slo.limits.items():
            lat, p = LIMITS[key]
            value = summary[lat][p]
            if value is None or not value <= limit:
                faults.append(f"{key} {'none' if value is None else f'{value:.6g}'} > {limit:g}")
        return {"requests": n, "finished": finished, "slo_met": met, "attainment": attainment,
                "meets": not faults, "reason": "; ".join(faults) or None}

    def close(self) -> None:
        """Close the in-memory database."""
        self.con.close()


def _empty_requests():

    from aisim.columns import REQUESTS

    return REQUESTS.replay_schema().empty_table()
