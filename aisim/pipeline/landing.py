"""Landing a run's results in DuckDB: one transaction per run, from the staged Parquet files.

A run lands whole or not at all.  The shard tasks write their rows as Parquet
in the run's staging directory (:mod:`aisim.pipeline.staging`) and the driver
writes the manifest; :func:`land_staged` opens the database and, in one
transaction, creates the tables and views (the SQL library ``sql/``,
:mod:`aisim.sql`), removes the run's earlier rows when forced, inserts the
``runs`` row and then ``shards``, ``summaries``, ``replicas``, ``requests`` and ``steps``
with ``INSERT ... SELECT ... FROM read_parquet([...])`` over the staged files
in shard order (DuckDB streams them: the driver never holds the rows).  Any
failure, ``KeyboardInterrupt`` included, rolls the transaction back; a
database file the landing created is removed again, so the file system is as
before too.

DuckDB keeps the space a rolled-back transaction wrote at the end of the file
(it only forgets it); :func:`reclaim` gives it back with a checkpoint, after a
failed landing and before the next one (for a landing killed outright).

With ``keep_parquet`` (:func:`land_staged`), ``requests`` and ``steps`` are not
copied into the database: the files move to the Parquet store and the two
tables become views over every landed run's files (``_aisim_parquet_files``
lists them); the other tables, and every view, are as usual.

DuckDB lets one process write a database file at a time.  When another
process holds it, :class:`DatabaseLocked` says so, naming the process.
:func:`connect` is the one way aisim opens a run database (landing, queries,
the sweep and the report).
"""

from __future__ import annotations

import os
import posixpath
import re
import time

from aisim.errors import DatabaseLocked, PipelineError
from aisim import columns

# Landing order (the column catalogue's); deletion runs in reverse.
TABLES = tuple(columns.TABLES)
# Kept as Parquet files with keep_parquet; the rest always live in the database.
LARGE = columns.LARGE_TABLES
SMALL = tuple(t for t in TABLES if t not in LARGE)
# Tables only some runs fill (a spec's [capacity]): created when a run first lands rows in them.
EXTRA = tuple(columns.RUN_EXTRA_TABLES)


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


def check_database_file(path: str) -> bool:
    """Refuse, before any work, a database path nothing could be landed in; True when the file exists.

    The path must be absent in a writable directory (landing creates it), or a
    readable and writable DuckDB database file.

    Raises
    ------
    PipelineError
        Naming the path and what is wrong with it.
    """
    if path == ":memory:":
        return False
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
        return False
    if not os.path.isfile(path):  # a FIFO or a device: reading its header would block or consume it
        raise PipelineError(f"database {path} is not a regular file")
    if not os.access(path, os.R_OK | os.W_OK):
        raise PipelineError(f"database {path} is not writable")
    with open(path, "rb") as fh:
        head = fh.read(12)
    if head[8:12] != _DUCKDB_MAGIC:
        raise PipelineError(f"{path} is not a DuckDB database")
    return True


def check_database(path: str, keep_parquet: bool = False) -> None:
    """Refuse, before anything is replayed, a database path a run could not land in.

    The file must be absent in a writable directory, or a writable DuckDB
    database that is empty or holds aisim's tables with the columns of
    :mod:`aisim.columns`, keeping ``requests`` and ``steps`` as tables or, with
    ``keep_parquet``, as views over Parquet files.

    Raises
    ------
    PipelineError
        Naming the path and what is wrong with it.
    """
    if not check_database_file(path):
        return
    try:
        con = connect(path, read_only=True)
    except DatabaseLocked:
        return  # landing waits for the lock and says so
    try:
        kinds = _table_kinds(con)
        tables = {t for t, kind in kinds.items() if kind == "BASE TABLE"}
        if tables and "runs" not in tables:
            raise PipelineError(f"database {path} is not an aisim run database: it has tables "
                                f"({', '.join(sorted(tables)[:5])}) but no 'runs' table")
        for name in TABLES:
            if name in kinds and _columns(con, name) != columns.TABLES[name].names:
                raise PipelineError(f"database {path} is not an aisim run database of this version: its '{name}' "
                                    "table has other columns than aisim's")
        kept = kinds.get("requests")
        if kept == "VIEW" and not keep_parquet:
            raise PipelineError(f"database {path} keeps requests and steps as Parquet files; set "
                                "'landing.keep_parquet = true' to land in it")
        if kept == "BASE TABLE" and keep_parquet:
            raise PipelineError(f"database {path} keeps requests and steps in tables; 'landing.keep_parquet' "
                                "needs a database of its own")
    finally:
        con.close()


def run_landed(path: str, run_id: str, locked_ok: bool = False) -> bool:
    """Whether ``run_id`` is already in the database at ``path`` (False when there is none).

    With ``locked_ok``, a database another process holds counts as not
    having the run (landing, which waits for the lock, finds out).
    """
    if not os.path.exists(path):
        return False
    try:
        con = connect(path, read_only=True)
    except DatabaseLocked:
        if locked_ok:
            return False
        raise
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


def _table_kinds(con) -> dict:
    """name -> ``"BASE TABLE"`` or ``"VIEW"`` of the database's main schema."""
    return dict(con.execute("SELECT table_name, table_type FROM information_schema.tables "
                            "WHERE table_schema = current_schema()").fetchall())


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _file_list(paths) -> str:
    return "[" + ", ".join(_quote(p) for p in paths) + "]"


# ---------------------------------------------------------------------------- reclaiming space

# DuckDB's memory while landing.
LANDING_MEMORY = "512MB"

# A DuckDB file is a 12 KiB header, then its blocks.
_HEADER_BYTES = 3 * 4096


def _unused_bytes(con, path: str) -> int:
    """Bytes at the end of ``path`` that DuckDB's blocks no longer cover (a rolled-back or killed landing)."""
    if path == ":memory:" or not os.path.exists(path):
        return 0
    row = con.execute("SELECT block_size, total_blocks, free_blocks FROM pragma_database_size() "
                      "WHERE database_name = current_database()").fetchone()
    if row is None:
        return 0
    block, total, free = row
    return max(0, os.path.getsize(path) - (_HEADER_BYTES + total * block)) + free * block


def reclaim(con, path: str) -> int:
    """Give back the space a rolled-back or killed landing left in ``path``; returns the bytes reclaimed.

    DuckDB writes a large insert's blocks straight into the file; a rollback
    marks them free but leaves the file as long, and a checkpoint that has
    nothing to write does not shorten it.  A table created and dropped gives
    the checkpoint something to write, and it truncates the file to the blocks
    in use.  Runs outside any transaction.
    """
    if path == ":memory:" or not os.path.exists(path):
        return 0
    before = os.path.getsize(path)
    if _unused_bytes(con, path) == 0:
        return 0
    con.execute("CREATE TABLE _aisim_reclaim (x INTEGER)")
    con.execute("DROP TABLE _aisim_reclaim")
    con.execute("CHECKPOINT")
    return max(0, before - os.path.getsize(path))


# ---------------------------------------------------------------------------- landing


def insert_run(con, row: dict) -> None:
    """Insert the one ``runs`` row (``landed_at`` is the transaction's time)."""
    cols = [c for c in _columns(con, "runs") if c != "landed_at"]
    names = ", ".join(cols)
    marks = ", ".join("?" for _ in cols)
    con.execute(f"INSERT INTO runs ({names}, landed_at) VALUES ({marks}, current_timestamp)",
                [row.get(c) for c in cols])


def insert_parquet(con, table: str, paths: list) -> int:
    """Insert the rows of the Parquet files ``paths`` (in that order) into ``table`` by column name.

    The files must have every column of the database table (extra columns are
    ignored); types are cast by DuckDB.  Rows keep their order (DuckDB's
    ``preserve_insertion_order``, on by default, keeps the files' order and
    each file's).  Returns the rows inserted.
    """
    cols = _columns(con, table)
    if not paths:
        return 0
    have = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet({_quote(paths[0])})").fetchall()}
    missing = [c for c in cols if c not in have]
    if missing:
        raise PipelineError(f"cannot land {table}: the results lack column(s) {', '.join(missing)}")
    names = ", ".join(f'"{c}"' for c in cols)
    return con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM read_parquet({_file_list(paths)})"
                       ).fetchone()[0]


def _schema(con, keep_parquet: bool) -> None:
    from aisim import sql
    from aisim.columns import render_table

    if not keep_parquet:
        sql.apply_schema(con)
        add_new_columns(con, columns.TABLES)
        return
    for name in SMALL:
        con.execute(render_table(columns.TABLES[name]))
    add_new_columns(con, SMALL)
    con.execute("CREATE TABLE IF NOT EXISTS _aisim_parquet_files (run_id VARCHAR NOT NULL, "
                "table_name VARCHAR NOT NULL, seq INTEGER NOT NULL, path VARCHAR NOT NULL)")


def add_new_columns(con, names, catalogue=None) -> None:
    """A table made by an earlier aisim gains the catalogue's nullable columns it lacks (NULL in its rows).

    ``catalogue``: name -> :class:`aisim.columns.Table` (default :data:`aisim.columns.TABLES`).
    """
    catalogue = columns.TABLES if catalogue is None else catalogue
    kinds = _table_kinds(con)
    for name in names:
        if kinds.get(name) != "BASE TABLE":
            continue
        have = set(_columns(con, name))
        for c in catalogue[name].columns:
            if c.name not in have and not c.not_null:
                con.execute(f'ALTER TABLE {name} ADD COLUMN "{c.name}" {c.sql}')


def _parquet_views(con) -> None:
    """(Re)create ``requests`` and ``steps`` as views over the landed runs' files, then the SQL library's views."""
    from aisim import sql

    for name in LARGE:
        files = [r[0] for r in con.execute(
            "SELECT f.path FROM _aisim_parquet_files f JOIN runs r USING (run_id) WHERE f.table_name = ? "
            "ORDER BY r.run_seq, f.seq", [name]).fetchall()]
        cols = ", ".join(f'CAST("{c.name}" AS {c.sql}) AS "{c.name}"' for c in columns.TABLES[name].columns)
        if files:
            con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT {cols} FROM read_parquet({_file_list(files)})")
        else:
            nulls = ", ".join(f'CAST(NULL AS {c.sql}) AS "{c.name}"' for c in columns.TABLES[name].columns)
            con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT {nulls} WHERE false")
    sql.apply_tables(con)
    for v in sql.views():
        con.execute(v.sql)


def land_into(con, manifest: dict, staging, force: bool = False, store=None) -> dict:
    """Land one staged run on an open connection, in one transaction.

    Parameters
    ----------
    con : duckdb.DuckDBPyConnection
    manifest : dict
        The run's ``run.json`` (:func:`aisim.pipeline.staging.Staging.read_json`):
        ``run`` (the ``runs`` row without ``run_seq`` and ``landed_at``) and
        ``files`` (per table, the staged files relative to the run's directory,
        in landing order).
    staging : aisim.pipeline.staging.Staging
    force : bool
        Replace the run's rows when it is already there.
    store : aisim.pipeline.staging.Staging, optional
        The Parquet store (``keep_parquet``): ``requests`` and ``steps`` are
        views over the files there, which the caller has already put in place
        (their paths relative to the store's root are ``manifest["stored"]``).

    Returns
    -------
    dict
        ``landed`` (bool), ``replaced`` (bool), ``run_seq``, ``rows`` (per table).
    """
    run = dict(manifest["run"])
    run_id = run["run_id"]
    if run.get("started_at"):
        from datetime import datetime

        run["started_at"] = datetime.fromisoformat(run["started_at"])
    con.execute("BEGIN TRANSACTION")
    try:
        _schema(con, store is not None)
        found = con.execute("SELECT run_seq FROM runs WHERE run_id = ?", [run_id]).fetchone()
        if found and not force:
            con.execute("ROLLBACK")
            return {"landed": False, "replaced": False, "run_seq": found[0], "rows": {}}
        extra = [t for t in EXTRA if t in manifest["files"]]  # what the run's plugged-in sections staged
        for t in extra:
            con.execute(columns.render_table(columns.RUN_EXTRA_TABLES[t]))
        add_new_columns(con, EXTRA, columns.RUN_EXTRA_TABLES)
        if found:
            kinds = _table_kinds(con)
            for t in [t for t in EXTRA if kinds.get(t) == "BASE TABLE"]:
                con.execute(f"DELETE FROM {t} WHERE run_id = ?", [run_id])
            for t in reversed(SMALL if store is not None else TABLES):
                con.execute(f"DELETE FROM {t} WHERE run_id = ?", [run_id])
            if store is not None:
                con.execute("DELETE FROM _aisim_parquet_files WHERE run_id = ?", [run_id])
        seq = con.execute("SELECT coalesce(max(run_seq), 0) + 1 FROM runs").fetchone()[0]
        insert_run(con, dict(run, run_seq=seq))
        rows = {"runs": 1}
        for t in TABLES[1:]:
            if store is not None and t in LARGE:
                paths = manifest["stored"][t]
                for i, p in enumerate(paths):
                    con.execute("INSERT INTO _aisim_parquet_files VALUES (?, ?, ?, ?)", [run_id, t, i, store.path(p)])
                rows[t] = manifest["rows"][t]
            else:
                rows[t] = insert_parquet(con, t, [staging.run_path(run_id, p) for p in manifest["files"].get(t, [])])
        for t in extra:
            rows[t] = insert_parquet(con, t, [staging.run_path(run_id, p) for p in manifest["files"][t]])
        if store is not None:
            _parquet_views(con)
        from aisim.files import step

        step("commit")
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except Exception:
            pass
        raise
    return {"landed": True, "replaced": bool(found), "run_seq": seq, "rows": rows}


def remove_runs(path: str, run_ids, tables=()) -> None:
    """Delete the rows of ``run_ids`` from every run table, ``tables`` first, in one transaction.

    Undoes the landing of a command whose later steps failed (a sweep lands its runs, then its
    ranking): the database is left as it was before.
    """
    run_ids = list(run_ids)
    if not run_ids:
        return
    con = connect(path)
    try:
        kinds = _table_kinds(con)
        con.execute("BEGIN TRANSACTION")
        try:
            for t in (*tables, *EXTRA, "_aisim_parquet_files", *reversed(TABLES)):
                if kinds.get(t) == "BASE TABLE":
                    con.executemany(f"DELETE FROM {t} WHERE run_id = ?", [[r] for r in run_ids])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    finally:
        con.close()


def read_manifest(staging, run_id: str) -> dict:
    """The manifest of a staged run.

    Raises
    ------
    PipelineError
        No finished run ``run_id`` in ``staging`` (naming the runs there).
    """
    from aisim.pipeline.staging import MANIFEST

    target = staging.run_path(run_id, MANIFEST)
    try:
        exists = staging.exists(target)
    except OSError as exc:
        raise PipelineError(f"cannot read the staging location {staging.location}: {exc}") from None
    if not exists:
        there = staging.runs()
        listing = f"staged runs there: {', '.join(there)}" if there else "nothing is staged there"
        raise PipelineError(f"no staged run {run_id} in {staging.location}; {listing}")
    return staging.read_json(target)


def land_staged(path: str, staging, run_id: str, *, force: bool = False, wait_s: float = 60.0,
                store=None) -> dict:
    """Land the staged run ``run_id`` in the database file at ``path`` (see :func:`land_into`).

    Waits up to ``wait_s`` seconds for another process's lock.  Space left in
    the file by an earlier failed landing is reclaimed first.  On any failure
    the transaction is rolled back, the space it took reclaimed and, if this
    call created the file, the file removed; the staged files stay.

    Parameters
    ----------
    path : str
        The DuckDB file.
    staging : aisim.pipeline.staging.Staging
    run_id : str
    force : bool
        Replace the run when the database has it.
    wait_s : float
        How long to wait for the database lock.
    store : aisim.pipeline.staging.Staging, optional
        Keep ``requests`` and ``steps`` as Parquet files here (views in the database).
    """
    import duckdb

    manifest = read_manifest(staging, run_id)
    path = os.path.abspath(path)
    existed = os.path.exists(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    con = connect(path, wait_s=wait_s)
    moved = []
    try:
        # The rows stream from the staged files; past this DuckDB writes out or spills, so the
        # driver's memory does not grow with the run.
        con.execute(f"SET memory_limit = '{LANDING_MEMORY}'")
    except BaseException:
        con.close()
        raise

    def work():
        try:
            if store is None and _table_kinds(con).get("requests") == "VIEW":
                raise PipelineError(f"database {path} keeps requests and steps as Parquet files; land with "
                                    "keep_parquet = true")
            if store is not None and _table_kinds(con).get("requests") == "BASE TABLE":
                raise PipelineError(f"database {path} keeps requests and steps in tables; it cannot keep a run's "
                                    "as Parquet files (keep_parquet)")
            reclaim(con, path)
            for fs in {id(s.fs): s.fs for s in (staging, store) if s is not None and not s.local}.values():
                con.register_filesystem(fs)
            m = manifest
            if store is not None:
                m, had = _store_files(manifest, staging, store)
                moved.append(had)
            return land_into(con, m, staging, force, store)
        except BaseException:
            if existed:
                try:
                    reclaim(con, path)
                except Exception:  # the landing's own error is the one to report
                    pass
            raise

    try:
        return _interruptible(con, work)
    except BaseException as exc:
        con.close()
        con = None
        if moved and not moved[0]:
            store.remove_run(run_id)
        if not existed:
            for p in (path, path + ".wal"):
                if os.path.exists(p):
                    os.remove(p)
        if _interrupted(exc):
            raise KeyboardInterrupt() from None
        if isinstance(exc, duckdb.Error):
            raise PipelineError(f"landing run {run_id} in {path} failed; nothing landed: {exc}") from exc
        raise
    finally:
        if con is not None:
            con.close()


def _interrupted(exc) -> bool:
    """A Ctrl-C, or DuckDB's report of the query it stopped."""
    import duckdb

    if isinstance(exc, (KeyboardInterrupt, duckdb.InterruptException)):
        return True
    return isinstance(exc, RuntimeError) and "interrupted" in str(exc).lower()


def _interruptible(con, work):
    """Run ``work()`` (which uses ``con``) so that Ctrl-C stops it at once, and return its result.

    DuckDB's Python client takes the Ctrl-C of a running statement but lets
    the statement run to its end.  Here ``work`` runs in a thread while this
    (the main) thread waits; a ``KeyboardInterrupt`` here calls
    ``con.interrupt()``, which stops the statement where it is, and the
    thread's rollback runs before the interrupt is raised.  A second Ctrl-C
    only waits for that rollback.
    """
    import threading

    done = {}
    finished = threading.Event()  # not Thread.join: an interrupted join can leave is_alive() wrong

    def target():
        try:
            done["value"] = work()
        except BaseException as exc:
            done["error"] = exc
        finally:
            finished.set()

    thread = threading.Thread(target=target, name="aisim-landing", daemon=True)
    thread.start()
    while not finished.is_set():
        try:
            finished.wait(0.2)
        except KeyboardInterrupt:
            con.interrupt()
    thread.join()
    if "error" in done:
        raise done["error"]
    return done["value"]  # a Ctrl-C after the commit: the run is in


def _store_files(manifest: dict, staging, store):
    """Copy the run's ``requests`` and ``steps`` files into the Parquet store; returns the manifest with
    ``stored`` (their paths relative to the store) and whether the run's store directory was there before."""
    run_id = manifest["run"]["run_id"]
    had = store.exists(store.run_path(run_id))
    stored = {}
    for t in LARGE:
        stored[t] = []
        for rel in manifest["files"][t]:
            dest = posixpath.join(run_id, rel)
            data_src = staging.run_path(run_id, rel)
            with staging.fs.open(data_src, "rb") as src, store.open_atomic(store.path(dest)) as out:
                while True:
                    chunk = src.read(1 << 22)
                    if not chunk:
                        break
                    out.write(chunk)
            stored[t].append(dest)
    return dict(manifest, stored=stored), (run_id, had)
