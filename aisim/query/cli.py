"""``aisim query``: the SQL library's named queries, or any SQL, on a run database."""

from __future__ import annotations

import click

from aisim.cli_util import CONTEXT_SETTINGS, console, fail, fmt_num, format_option, guess_value, new_table, parse_pairs


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("name", required=False)
@click.option("--db", "database", envvar="AISIM_DB", type=click.Path(dir_okay=False),
              help="The run database (default: $AISIM_DB).")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A query parameter (repeatable); bound by DuckDB, never pasted into the SQL.")
@click.option("--sql", "sql_text", metavar="SQL", help="Run this SQL instead of a named query.")
@format_option()
@click.option("--list", "list_", is_flag=True, help="List the named queries and their parameters.")
def query(name, database, params, sql_text, fmt, list_):
    """Run the named query NAME (aisim query --list) or --sql on a pipeline database.

    \b
    Examples:
      aisim query shards --db pipelines/demo.duckdb
      aisim query slo --db pipelines/demo.duckdb --param ttft_s=2 --param tpot_s=0.02
      aisim query --db pipelines/demo.duckdb --sql "SELECT * FROM latency_percentiles"
    """
    from aisim.errors import AisimError, QueryError
    from aisim.query import format_csv, format_json, run_query, table

    if list_:
        _list_queries()
        return
    raw = parse_pairs(params, "--param")
    try:
        if not database:
            raise QueryError("give the database with --db FILE (or set AISIM_DB)")
        if name and sql_text:
            raise QueryError("give a query NAME or --sql, not both")
        if not name and not sql_text:
            raise QueryError("give a query NAME (aisim query --list) or --sql")
        # A named query converts its parameters to the types it declares; ad hoc
        # SQL binds them as what they look like.
        values = raw if name else {k: guess_value(v) for k, v in raw.items()}
        columns, rows = run_query(database, name=name, sql_text=sql_text, params=values)
    except AisimError as exc:
        fail(exc)
    if fmt == "csv":
        click.echo(format_csv(columns, rows), nl=False)
    elif fmt == "json":
        click.echo(format_json(columns, rows), nl=False)
    else:
        out = console()
        out.print(table(columns, rows, title=name))
        out.print(f"{fmt_num(len(rows))} row{'s' if len(rows) != 1 else ''}")


def _list_queries():
    from aisim import sql

    t = new_table(("name", {"style": "bold"}), "purpose", "parameters",
                  title="named queries (aisim query NAME --db FILE [--param key=value ...])", title_justify="left",
                  show_lines=True)
    for name, qf in sorted(sql.queries().items()):
        params = "\n".join(f"{p.name} ({p.type}{'' if p.required else ', default ' + repr(p.default)})"
                           for p in qf.params)
        t.add_row(name, qf.purpose, params or "-")
    console(prose=True).print(t)
