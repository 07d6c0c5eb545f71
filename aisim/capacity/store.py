"""Landing a capacity search's points in DuckDB: the ``capacity_points`` table, in one transaction."""

from __future__ import annotations

from aisim.columns import CAPACITY_POINTS, render_table


def land_points(database: str, result) -> int:
    """Write every point of ``result`` to ``capacity_points`` in ``database``, replacing the search's rows.

    The table is created from its declaration (:data:`aisim.columns.CAPACITY_POINTS`) when missing
    (a table an earlier aisim made gains the nullable columns it lacks);
    the rows of an earlier search with the same ``search_id`` (the same inputs) are replaced.  All
    in one transaction: on failure nothing is written.

    Parameters
    ----------
    database : str
        The DuckDB file (created when missing), or ``":memory:"``.
    result : aisim.capacity.search.CapacityResult

    Returns
    -------
    int
        Rows written.

    Raises
    ------
    aisim.errors.PipelineError
        The database cannot be opened, or is held by another process.
    """
    import duckdb

    from aisim.columns import RUN_EXTRA_TABLES
    from aisim.errors import PipelineError
    from aisim.files import step
    from aisim.pipeline.landing import add_new_columns, connect

    names = CAPACITY_POINTS.names
    insert = f"INSERT INTO capacity_points ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"
    rows = result.rows()
    con = connect(database)
    try:
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(render_table(CAPACITY_POINTS))
            add_new_columns(con, ["capacity_points"], RUN_EXTRA_TABLES)  # a table of an earlier aisim
            con.execute("DELETE FROM capacity_points WHERE search_id = ?", [result.search_id])
            if rows:
                con.executemany(insert, rows)
            step("commit")
            con.execute("COMMIT")
        except BaseException as exc:
            con.execute("ROLLBACK")
            if isinstance(exc, duckdb.Error):  # a table of another shape, a full disk: nothing written
                raise PipelineError(f"cannot land capacity points in {database}: {exc}") from None
            raise
    finally:
        con.close()
    return len(rows)
