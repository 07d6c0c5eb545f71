"""aisim's SQL library, shipped as package data and read with :mod:`importlib.resources`.

The files live in the repository's top-level ``sql/`` directory, which
installs as the package ``aisim.sql`` (this loader is its ``__init__.py``).

``schema.sql``
    The tables a pipeline run lands in (``runs``, ``shards``, ``summaries``,
    ``replicas``, ``requests``, ``steps``); the ``CREATE TABLE`` statements are generated
    from the column catalogue, :mod:`aisim.columns`.
``views/*.sql``
    One view or macro per file, created in every database a run lands in.
    Files are applied in name order; helpers other views build on start with
    ``_`` so that they come first.
``queries/*.sql``
    Named queries for ``aisim query NAME``: one ``SELECT`` per file.
``tables/*.sql``
    Tables filled outside a pipeline run, created with the schema: ``measured_runs``
    (``aisim calibrate --db``).
``sweep/*.sql``
    What ``aisim sweep`` adds: the ``sweep_candidates`` table, the ``goodput``
    query it ranks candidates by and, with a ``[capacity]`` section, the
    ``capacity_rate`` query (each candidate's highest rate within the SLO).

Every file opens with a comment header: what it is (``-- table: NAME``,
``-- view: NAME``, ``-- query: NAME``), ``purpose``, ``grain`` and ``sources``.  A named query
declares its parameters in the header, one line each::

    -- param run VARCHAR = NULL: run name, run id or id prefix (default: the latest run)
    -- param ttft_s DOUBLE = 1.0: TTFT threshold in seconds

and refers to them as ``$run``, ``$ttft_s``; values are bound by DuckDB,
never pasted into the SQL text.  A parameter without ``= DEFAULT`` is
required.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

_PARAM_RE = re.compile(r"^--\s*param\s+([A-Za-z_]\w*)\s+([A-Za-z]+)\s*(?:=\s*(\S+))?\s*:\s*(.*)$")
_FIELD_RE = re.compile(r"^--\s*(table|query|view|macro|purpose|grain|sources|schema):\s*(.*)$")

PARAM_TYPES = ("VARCHAR", "DOUBLE", "INTEGER", "BIGINT", "BOOLEAN")


@dataclass(frozen=True)
class Param:
    """A named query's parameter, from its ``-- param`` header line."""

    name: str
    type: str  # one of PARAM_TYPES
    default: object  # Python value; None for SQL NULL
    required: bool
    description: str

    def convert(self, text: str):
        """The command-line value ``text`` as this parameter's Python type."""
        if text.upper() == "NULL":
            return None
        if self.type in ("INTEGER", "BIGINT"):
            return int(text)
        if self.type == "DOUBLE":
            return float(text)
        if self.type == "BOOLEAN":
            low = text.lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"not a boolean: {text!r}")
            return low in ("true", "1", "yes")
        return text


@dataclass(frozen=True)
class SqlFile:
    """One SQL file of the library with its parsed header."""

    name: str  # file stem
    kind: str  # "schema", "table", "view" or "query"
    sql: str
    purpose: str
    grain: str
    sources: str
    params: tuple = ()


def _root():
    return resources.files(__name__)


def _parse(name: str, kind: str, text: str) -> SqlFile:
    fields, params, last = {}, [], None
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("--"):
            if line:
                break  # the header ends at the first SQL line
            continue
        m = _PARAM_RE.match(line)
        if m:
            pname, ptype, default, desc = m.groups()
            ptype = ptype.upper()
            if ptype not in PARAM_TYPES:
                raise ValueError(f"{kind} {name}: parameter {pname} has unknown type {ptype}")
            p = Param(pname, ptype, None, default is None, desc.strip())
            if default is not None:
                p = Param(pname, ptype, p.convert(default), False, desc.strip())
            params.append(p)
            last = None
            continue
        m = _FIELD_RE.match(line)
        if m:
            last = m.group(1)
            fields[last] = m.group(2).strip()
        elif last in ("purpose", "grain", "sources") and line.startswith("--   "):
            fields[last] += " " + line[2:].strip()  # continuation line
        else:
            last = None
    return SqlFile(name=name, kind=kind, sql=text, purpose=fields.get("purpose", ""),
                   grain=fields.get("grain", ""), sources=fields.get("sources", ""), params=tuple(params))


def schema() -> SqlFile:
    """``schema.sql``: ``CREATE TABLE IF NOT EXISTS`` for the tables of :data:`aisim.columns.TABLES`."""
    return _parse("schema", "schema", (_root() / "schema.sql").read_text(encoding="utf-8"))


def _dir(sub: str, kind: str) -> list:
    folder = _root() / sub
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    return [_parse(f.name[:-4], kind, f.read_text(encoding="utf-8")) for f in files]


def views() -> list:
    """The view and macro files, in the order they must be created."""
    return _dir("views", "view")


def queries() -> dict:
    """Named queries: name -> :class:`SqlFile`."""
    return {q.name: q for q in _dir("queries", "query")}


def tables() -> list:
    """The tables filled outside a pipeline run (``tables/*.sql``), created with the schema."""
    return _dir("tables", "table")


def sweep() -> dict:
    """The sweep's SQL: name -> :class:`SqlFile` (``sweep_candidates``, a table; ``goodput``, a query)."""
    out = {}
    for f in _dir("sweep", "query"):
        kind = "table" if f.sql.startswith("-- table:") else "query"
        out[f.name] = SqlFile(f.name, kind, f.sql, f.purpose, f.grain, f.sources, f.params)
    return out


def apply_schema(con) -> None:
    """Create the tables (if missing) and (re)create every view and macro on ``con``."""
    con.execute(schema().sql)
    apply_tables(con)
    for v in views():
        con.execute(v.sql)


def apply_tables(con) -> None:
    """Create the tables of ``tables/*.sql`` on ``con`` when missing."""
    for t in tables():
        con.execute(t.sql)


__all__ = ["PARAM_TYPES", "Param", "SqlFile", "apply_schema", "apply_tables", "queries", "schema", "sweep",
           "tables", "views"]
