"""A capacity search's SLO judge: a replay against an SLO (:mod:`aisim.sweep.slo`, the one shape every spec
writes an SLO in).

A request meets the thresholds as ``sql/views/slo_attainment.sql`` defines it, the one definition
``aisim query slo`` and ``aisim sweep`` use too: it finished and every given threshold holds (a
one-token output has no TPOT and passes that half); a rejected or unfinished request fails.  The
judge runs that macro itself, on an in-memory DuckDB over the replay's request rows.  A percentile
limit holds when the replay summary's percentile (:mod:`aisim.summary`: over the requests that have
the latency) is at most the limit; a latency no request has fails it.  A point meets the SLO when
its attainment is at least ``attainment`` (an SLO with thresholds) and every percentile limit holds.
"""

from __future__ import annotations

from aisim.sweep.slo import KEYS, LIMIT_KEYS, LIMITS, PERCENTILES, SLO_KEYS, Slo, slo_from_dict

__all__ = ["KEYS", "LIMIT_KEYS", "LIMITS", "PERCENTILES", "SLO_KEYS", "Judge", "Slo", "slo_from_dict"]


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
        # A percentile-only SLO has no share to meet: no attainment to show either.
        attainment = (met / n if n else 0.0) if self.slo.thresholds else None
        faults = []
        if self.slo.attainment is not None and attainment < self.slo.attainment:
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
