"""Landing a run's results in DuckDB: one transaction per run.

A run lands whole or not at all.  :func:`land` opens the database, and in one
transaction creates the tables and views (the SQL library ``sql/``, :mod:`aisim.sql`), removes the run's
earlier rows when forced, and inserts ``runs``, ``shards``, ``summaries``,
``requests`` and ``steps`` from Arrow through DuckDB's Arrow scan (the tables
are registered, then ``INSERT ... SELECT``: no row-by-row Python).  Any
failure, ``KeyboardInterrupt`` included, rolls the transaction back; a
database file the landing created is removed again, so the file system is as
before too.

DuckDB lets one process write a database file at a time.  When another
process holds it, :class:`DatabaseLocked` says so, naming the process.
:func:`connect` is the one way aisim opens a run database (landing, queries,
the sweep and the report).
"""

from __future__ import annotations

import os
import re
import time

from aisim.errors import DatabaseLocked, PipelineError
from aisim import columns

# Landing order (the column catalogue's); deletion runs in reverse.
TABLES = tuple(columns.TABLES)


def _locked_message(path: str, exc: Exception, read_only: bool) -> str:
    msg = str(exc)
    m = re.search(r"held in (.*?) \(PID (\d+)\)", msg)
    who = f"process {m.group(2)} ({m.group(1)})" if m else "another process"
    if read_only:
        return (f"database {path} is in use by {who}; DuckDB lets no other process read a database "
                "while one writes to it. Try again when it has finished")
    return (f"database {path} is in use by {who}; DuckDB allows one writer at a time. "
            "Wait for it to finish, or use another --db")


def connect(path: str, read_only: bool = False, wait_s: float = 0.0):
    """Open ``path``; a held lock is retried for ``wait_s`` seconds, then :class:`DatabaseLocked`.

    Parameters
    ----------
    path : str
        The DuckDB file, or ``":memory:"``.
    read_only : bool
        Open read-only (the file must exist).
    wait_s : float
        How long to keep trying while another process holds the file.
    """
    import duckdb

    if read_only and path != ":memory:" and not os.path.exists(path):
        raise PipelineError(f"no database at {path}; run a pipeline first (aisim pipeline run SPEC)")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return duckdb.connect(path, read_only=read_only)
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                raise PipelineError(f"cannot open database {path}: {exc}") from None
            if time.monotonic() >= deadline:
                raise DatabaseLocked(_locked_message(path, exc, read_only)) from None
            time.sleep(0.2)
        except duckdb.ConnectionException as exc:  # this process has it open with other settings
            raise DatabaseLocked(f"database {path} is already open in this process: {exc}") from None
        except duckdb.Error as exc:
            raise PipelineError(f"cannot open database {path}: {exc}") from None


# Bytes 8-11 of every DuckDB database file (its main header).
_DUCKDB_MAGIC = b"DUCK"


def check_database(path: str) -> None:
    """Refuse, before anything is replayed, a database path a run could not land in.

    The file must be absent in a writable directory, or a writable DuckDB
    database that is empty or holds aisim's tables with the columns of
    :mod:`aisim.columns`.

    Raises
    ------
    PipelineError
        Naming the path and what is wrong with it.
    """
    if path == ":memory:":
        return
    if os.path.isdir(path):
        raise PipelineError(f"database {path} is a directory")
    if not os.path.exists(path):
        # landing creates missing directories: the nearest existing one must be writable
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise PipelineError(f"cannot create database {path}: {parent} is not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise PipelineError(f"cannot create database {path}: the directory {parent} is not writable")
        return
    if not os.access(path, os.R_OK | os.W_OK):
        raise PipelineError(f"database {path} is not writable")
    with open(path, "rb") as fh:
        head = fh.read(12)
    if head[8:12] != _DUCKDB_MAGIC:
        raise PipelineError(f"{path} is not a DuckDB database")
    try:
        con = connect(path, read_only=True)
    except DatabaseLocked:
        return  # landing waits for the lock and says so
    try:
        tables = {r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()").fetchall()}
        if tables and "runs" not in tables:
            raise PipelineError(f"database {path} is not an aisim run database: it has tables "
                                f"({', '.join(sorted(tables)[:5])}) but no 'runs' table")
        for name in TABLES:
            if name in tables and _columns(con, name) != columns.TABLES[name].names:
                raise PipelineError(f"database {path} is not an aisim run database of this version: its '{name}' "
                                    "table has other columns than aisim's")
    finally:
        con.close()


def run_landed(path: str, run_id: str) -> bool:
    """Whether ``run_id`` is already in the database at ``path`` (False when there is none)."""
    if not os.path.exists(path):
        return False
    con = connect(path, read_only=True)
    try:
        has = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'runs'").fetchone()[0]
        if not has:
            return False
        return con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchone()[0] > 0
    finally:
        con.close()


def _columns(con, table: str) -> list:
    rows = con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                       "AND table_schema = current_schema() ORDER BY ordinal_position", [table]).fetchall()
    return [r[0] for r in rows]


# DuckDB's row group size: handing it whole row groups lets it write them without re-splitting.
ROW_GROUP = 122_880


def _row_groups(table):
    """The table's rows as record batches of ``ROW_GROUP`` rows (the last one shorter), in order.

    Shard results arrive as one chunk per shard, of any size; regrouping them
    into row-group-sized batches lands 20-40% faster.  It is done lazily,
    one group at a time, so landing holds at most one extra group in memory.
    """
    pending, rows = [], 0
    for batch in table.to_batches():
        pending.append(batch)
        rows += batch.num_rows
        if rows >= ROW_GROUP:
            import pyarrow as pa

            merged = pa.Table.from_batches(pending, schema=table.schema).combine_chunks()
            full = rows // ROW_GROUP * ROW_GROUP
            yield from merged.slice(0, full).to_batches(max_chunksize=ROW_GROUP)
            rest = merged.slice(full)
            pending, rows = rest.to_batches(), rest.num_rows
    if rows:
        import pyarrow as pa

        yield from pa.Table.from_batches(pending, schema=table.schema).combine_chunks().to_batches()


def insert_arrow(con, table: str, data) -> int:
    """Insert an Arrow table into ``table`` by column name; returns the rows inserted.

    The Arrow table must have every column of the database table (extra
    columns are ignored); types are cast by DuckDB.  Rows keep their order
    (DuckDB's ``preserve_insertion_order``, on by default, and a sequential
    stream of batches).
    """
    import pyarrow as pa

    cols = _columns(con, table)
    missing = [c for c in cols if c not in data.column_names]
    if missing:
        raise PipelineError(f"cannot land {table}: the results lack column(s) {', '.join(missing)}")
    names = ", ".join(f'"{c}"' for c in cols)
    view = f"_aisim_land_{table}"
    con.register(view, pa.RecordBatchReader.from_batches(data.schema, _row_groups(data)))
    try:
        con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {view}")
    finally:
        con.unregister(view)
    return data.num_rows


def insert_run(con, row: dict) -> None:
    """Insert the one ``runs`` row (``landed_at`` is the transaction's time)."""
    cols = [c for c in _columns(con, "runs") if c != "landed_at"]
    names = ", ".join(cols)
    marks = ", ".join("?" for _ in cols)
    con.execute(f"INSERT INTO runs ({names}, landed_at) VALUES ({marks}, current_timestamp)",
                [row.get(c) for c in cols])


def land_into(con, run: dict, tables: dict, force: bool = False) -> dict:
    """Land one run on an open connection, in one transaction.

    Parameters
    ----------
    con : duckdb.DuckDBPyConnection
    run : dict
        The ``runs`` row without ``run_seq`` and ``landed_at``.
    tables : dict of pyarrow.Table
        ``shards``, ``summaries``, ``requests``, ``steps``; rows already sorted
        by their key (shard, then request index or step).
    force : bool
        Replace the run's rows when it is already there.

    Returns
    -------
    dict
        ``landed`` (bool), ``replaced`` (bool), ``run_seq``, ``rows`` (per table).
    """
    from aisim import sql

    con.execute("BEGIN TRANSACTION")
    try:
        sql.apply_schema(con)
        found = con.execute("SELECT run_seq FROM runs WHERE run_id = ?", [run["run_id"]]).fetchone()
        if found and not force:
            con.execute("ROLLBACK")
            return {"landed": False, "replaced": False, "run_seq": found[0], "rows": {}}
        if found:
            for t in reversed(TABLES):
                con.execute(f"DELETE FROM {t} WHERE run_id = ?", [run["run_id"]])
        seq = con.execute("SELECT coalesce(max(run_seq), 0) + 1 FROM runs").fetchone()[0]
        insert_run(con, dict(run, run_seq=seq))
        rows = {"runs": 1}
        for t in TABLES[1:]:
            rows[t] = insert_arrow(con, t, tables[t])
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except Exception:
            pass
        raise
    return {"landed": True, "replaced": bool(found), "run_seq": seq, "rows": rows}


def land(path: str, run: dict, tables: dict, force: bool = False, wait_s: float = 10.0) -> dict:
    """Land one run in the database file at ``path`` (see :func:`land_into`).

    Waits up to ``wait_s`` seconds for another process's lock.  On any
    failure the transaction is rolled back and, if this call created the
    file, the file is removed.
    """
    import duckdb

    path = os.path.abspath(path)
    existed = os.path.exists(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    con = connect(path, wait_s=wait_s)
    try:
        return land_into(con, run, tables, force)
    except BaseException as exc:
        con.close()
        con = None
        if not existed:
            for p in (path, path + ".wal"):
                if os.path.exists(p):
                    os.remove(p)
        if isinstance(exc, duckdb.Error):
            raise PipelineError(f"landing run {run['run_id']} in {path} failed; nothing landed: {exc}") from exc
        raise
    finally:
        if con is not None:
            con.close()
