"""Landing measured runs in DuckDB: the ``measured_runs`` table (``sql/tables/measured_runs.sql``), one transaction."""

from __future__ import annotations

import hashlib
import math
import os

# measured_runs column -> the run's metric (ms, converted to seconds) or extra statistic.
_LATENCY = {"ttft_mean_s": ("metrics", "ttft"), "ttft_p50_s": ("extra", "median_ttft_ms"),
            "ttft_p99_s": ("extra", "p99_ttft_ms"), "tpot_mean_s": ("metrics", "tpot"),
            "tpot_p50_s": ("extra", "median_tpot_ms"), "tpot_p99_s": ("extra", "p99_tpot_ms"),
            "itl_mean_s": ("metrics", "itl"), "itl_p50_s": ("extra", "median_itl_ms"),
            "itl_p99_s": ("extra", "p99_itl_ms"), "e2e_mean_s": ("metrics", "e2el"),
            "e2e_p50_s": ("extra", "median_e2el_ms"), "e2e_p99_s": ("extra", "p99_e2el_ms")}


def measured_rows(runs, engine, calibration: str | None = None) -> list:
    """One ``measured_runs`` row (a dict) per run, in the table's column order.

    Parameters
    ----------
    runs : list of MeasuredRun
    engine : EngineConfig
        The engine the runs ran: its model (``model``, else ``time_model.model``), GPU and tensor
        parallelism.
    calibration : str, optional
        The name of the calibration they fed.
    """
    tm = engine.time_model
    model = engine.model or tm.model   # as sql/queries/sim_vs_real.sql takes a simulated shard's
    digests = {}
    rows = []
    for r in runs:
        if r.source not in digests:
            with open(r.source, "rb") as fh:
                digests[r.source] = hashlib.sha256(fh.read()).hexdigest()
        row = {"source": os.path.abspath(r.source), "run_index": r.index, "file_sha256": digests[r.source],
               "model": model, "model_id": r.model_id, "gpu": tm.gpu if tm.kind == "roofline" else None,
               "tp": tm.tp if tm.kind == "roofline" else None, "num_prompts": r.num_prompts,
               "request_rate": None if math.isinf(r.request_rate) else r.request_rate, "burstiness": r.burstiness,
               "max_concurrency": r.max_concurrency, "total_input_tokens": r.total_input_tokens,
               "total_output_tokens": r.total_output_tokens, "duration_s": r.duration_s,
               "throughput_req_s": r.extra.get("request_throughput", r.num_prompts / r.duration_s),
               "throughput_tok_s": r.metrics.get("throughput")}
        for col, (where, key) in _LATENCY.items():
            v = getattr(r, where).get(key)
            row[col] = None if v is None else v / 1e3
        row["calibration"] = calibration
        rows.append(row)
    return rows


def land_measured(database: str, runs, engine, calibration: str | None = None) -> int:
    """Write ``runs`` to ``measured_runs`` in ``database``, replacing earlier rows of the same files.

    A database without aisim's tables gets them all (a pipeline run can land in it later); one
    with them gains ``measured_runs`` when it lacks it.  All in one transaction: on failure
    nothing is written.

    Parameters
    ----------
    database : str
        The DuckDB file (created when missing), or ``":memory:"``.
    runs : list of MeasuredRun
    engine : EngineConfig
    calibration : str, optional
        As :func:`measured_rows`.

    Returns
    -------
    int
        Rows written.

    Raises
    ------
    aisim.errors.PipelineError
        The database cannot be opened, is held by another process, or refuses the rows.
    """
    import duckdb

    from aisim import sql
    from aisim.errors import PipelineError
    from aisim.pipeline.landing import connect

    rows = measured_rows(runs, engine, calibration)
    con = connect(database)
    try:
        con.execute("BEGIN TRANSACTION")
        try:
            has_runs = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'runs' "
                                   "AND table_schema = current_schema()").fetchone()[0]
            if has_runs:
                sql.apply_tables(con)
            else:
                sql.apply_schema(con)
            if rows:
                names = list(rows[0])
                con.executemany("DELETE FROM measured_runs WHERE source = ?",
                                [[s] for s in dict.fromkeys(r["source"] for r in rows)])
                con.executemany(f"INSERT INTO measured_runs ({', '.join(names)}) VALUES "
                                f"({', '.join('?' * len(names))})", [[r[n] for n in names] for r in rows])
            con.execute("COMMIT")
        except BaseException as exc:
            con.execute("ROLLBACK")
            if isinstance(exc, duckdb.Error):
                raise PipelineError(f"cannot land measured runs in {database}: {exc}") from None
            raise
    finally:
        con.close()
    return len(rows)
