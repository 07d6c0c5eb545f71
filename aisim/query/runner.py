"""Running the SQL library's named queries (and ad hoc SQL) against a run database.

Parameters are always bound by DuckDB (``$name`` placeholders), never
formatted into the SQL text.  A named query declares its parameters in its
header (see :mod:`aisim.sql`); values given on the command line are converted
to the declared type, and defaults fill the rest.
"""

from __future__ import annotations

import csv
import io
import json
import math
from datetime import date, datetime
from decimal import Decimal

from aisim.errors import QueryError


def bind(name: str, raw: dict) -> tuple:
    """The SQL text and bound values of named query ``name`` for string parameters ``raw``."""
    from aisim import sql

    library = sql.queries()
    if name not in library:
        raise QueryError(f"unknown query '{name}'; known: {', '.join(sorted(library))} (aisim query --list)")
    return bind_sql(library[name], raw)


def bind_sql(q, raw: dict) -> tuple:
    """The SQL text of library file ``q`` and its bound values.

    ``raw`` maps parameter names to values: strings (as given on the
    command line) are converted to the declared type, other values are
    bound as they are; declared defaults fill the rest.
    """
    name = q.name
    declared = {p.name: p for p in q.params}
    for key in raw:
        if key not in declared:
            known = ", ".join(declared) or "none"
            raise QueryError(f"query '{name}' has no parameter '{key}'; its parameters: {known}")
    values = {}
    for p in q.params:
        if p.name in raw:
            v = raw[p.name]
            try:
                values[p.name] = p.convert(v) if isinstance(v, str) else v
            except ValueError:
                raise QueryError(f"parameter '{p.name}' of query '{name}' must be {p.type}, "
                                 f"got {v!r}") from None
            # float() reads 'nan' and 'inf': a threshold no comparison can honour (NaN is never less)
            if isinstance(values[p.name], float) and not math.isfinite(values[p.name]):
                raise QueryError(f"parameter '{p.name}' of query '{name}' must be a finite number, got {v!r}")
        elif p.required:
            raise QueryError(f"query '{name}' needs --param {p.name}=... ({p.description})")
        else:
            values[p.name] = p.default
    return q.sql, values


def duckdb_message(exc) -> str:
    """A DuckDB error's message without its class prefix when it is one of aisim's own
    (``error()`` in the SQL library, such as an ambiguous run id prefix)."""
    msg = str(exc)
    prefix = "Invalid Input Error: "
    return msg[len(prefix):] if msg.startswith(prefix) else msg


def pick_run(con, selector):
    """The ``runs`` row (a dict) that ``selector`` means, or None when none matches.

    One rule for every command that picks a run, the SQL library's
    ``resolve_run`` macro: a run id, else the latest run of that name, else
    the one run whose id starts with ``selector``; None picks the latest run.

    Raises
    ------
    QueryError
        ``selector`` is an id prefix of several runs (the message names them).
    """
    import duckdb

    try:
        cur = con.execute("SELECT * FROM runs WHERE run_id = resolve_run(?)", [selector])
    except duckdb.InvalidInputException as exc:
        raise QueryError(duckdb_message(exc)) from None
    row = cur.fetchone()
    return None if row is None else dict(zip([d[0] for d in cur.description], row))


def run_query(db: str, name: str | None = None, sql_text: str | None = None, params: dict | None = None):
    """Run a named query or ad hoc SQL on the database ``db`` (read-only).

    Parameters
    ----------
    db : str
        The DuckDB file.
    name : str, optional
        A named query of the SQL library (``sql/queries``).
    sql_text : str, optional
        Ad hoc SQL instead; ``$name`` placeholders are bound from ``params``.
    params : dict
        A named query's parameters as strings (converted to the types its
        header declares); ad hoc SQL's values as they are to be bound.

    Returns
    -------
    columns : list of str
    rows : list of tuple
    """
    import duckdb

    from aisim.pipeline.landing import connect

    params = params or {}
    if (name is None) == (sql_text is None):
        raise QueryError("give a query NAME or --sql, not both")
    if name is not None:
        text, values = bind(name, params)
        what = f"query '{name}'"
    else:
        text, values = sql_text, dict(params)
        what = "the SQL"
    con = connect(db, read_only=True)
    try:
        cur = con.execute(text, values) if values else con.execute(text)
        if cur is None:  # DuckDB returns no cursor for text without a statement (";", a comment)
            raise QueryError(f"{what} holds no statement: {text!r}")
        if cur.description is None:
            return [], []
        columns = [d[0] for d in cur.description]
        return columns, cur.fetchall()
    except duckdb.Error as exc:
        raise QueryError(f"{what} failed on {db}: {duckdb_message(exc)}") from None
    finally:
        con.close()


def _plain(v):
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    return v


def format_csv(columns, rows) -> str:
    """RFC 4180 CSV with a header line; NULL is an empty field."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow(["" if v is None else _plain(v) for v in r])
    return buf.getvalue()


def format_json(columns, rows) -> str:
    """A JSON array of objects, one per row; NULL and NaN are null."""
    return json.dumps([{c: _plain(v) for c, v in zip(columns, r)} for r in rows], indent=1, default=str) + "\n"


def table(columns, rows, title=None):
    """A rich Table of the result (numbers right-aligned, NULL shown as NULL)."""
    from aisim.cli_util import new_table

    numeric = [all(isinstance(r[i], (int, float, Decimal)) or r[i] is None for r in rows) and
               any(r[i] is not None for r in rows) for i in range(len(columns))]
    t = new_table(*((c, {"justify": "right" if num else "left", "min_width": len(c)})
                    for c, num in zip(columns, numeric)), title=title, title_justify="left")
    for r in rows:
        t.add_row(*("[dim]NULL[/dim]" if v is None else _cell(v) for v in r))
    return t


def _cell(v) -> str:
    v = _plain(v)
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:.6g}" if abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10000 else str(v)
    from rich.markup import escape

    return escape(str(v))
