"""``aisim pipeline`` (run and check batch specs) and ``aisim query`` (SQL over the results).

Heavy modules (Dask, DuckDB, Arrow, the replay core) are imported inside the
commands so that ``aisim --help`` stays fast.  Errors go to stderr with exit
status 2; an interrupted run exits with 130 and lands nothing.
"""

from __future__ import annotations

import sys

import click

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _fail(exc: Exception, code: int = 2) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(code)


def _console(stderr: bool = False, width: int = 120):
    from rich.console import Console

    con = Console(stderr=stderr, highlight=False)
    if not con.is_terminal:  # logs and pipes: wide enough for a table, no colour codes
        con = Console(stderr=stderr, highlight=False, width=max(con.width, width), no_color=True)
    return con


@click.group(context_settings=CONTEXT_SETTINGS)
def pipeline():
    """Batch replays: read traces of many models, replay each model's share on each of its
    engine configurations in parallel (Dask), and land the results in DuckDB.

    The spec format is documented in pipelines/README.md; pipelines/demo.toml runs the bundled
    samples.
    """


@pipeline.command("run")
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--scheduler", default="local", show_default=True, metavar="local|sync|ADDRESS",
              help="'local': a LocalCluster sized to this machine; 'sync': one task at a time in this "
                   "process (debugging); or the address of a running Dask scheduler (tcp://host:8786).")
@click.option("--workers", type=click.IntRange(min=1), metavar="N",
              help="Worker processes of the local cluster (default: one per CPU).")
@click.option("--force", is_flag=True, help="Replace the run's rows if the database already has this run.")
@click.option("--db", "database", type=click.Path(dir_okay=False),
              help="Land in this DuckDB file instead of the spec's 'database'.")
@click.option("--progress", type=click.Choice(["auto", "bars", "lines", "none"]), default="auto",
              show_default=True, help="Progress on stderr: bars on a terminal, lines otherwise.")
def run_cmd(spec, scheduler, workers, force, database, progress):
    """Run the pipeline SPEC (TOML) and land its results in one transaction.

    The run key hashes the spec and every input and engine file: running the same spec over the
    same files again lands nothing (use --force to replace the run).
    """
    from aisim.errors import AisimError
    from aisim.pipeline.run import LineProgress, Quiet, RichProgress, print_summary, run_pipeline

    err = _console(stderr=True)
    mode = progress if progress != "auto" else ("bars" if err.is_terminal else "lines")
    reporter = {"bars": RichProgress, "lines": LineProgress}.get(mode, lambda c: Quiet())(err)
    try:
        report = run_pipeline(spec, scheduler=scheduler, workers=workers, force=force, database=database,
                              progress=reporter)
    except AisimError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        _fail("interrupted; nothing was landed", 130)
    print_summary(report, _console())


@pipeline.command("check")
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--db", "database", type=click.Path(dir_okay=False), help="Look for the run in this database.")
def check_cmd(spec, database):
    """Validate SPEC and show its shards, input files and run key, without replaying anything."""
    from aisim.errors import AisimError
    from aisim.pipeline.landing import run_landed
    from aisim.pipeline.run import build_plan
    from aisim.pipeline.spec import load_spec, resolve_inputs, run_key

    out = _console()
    try:
        s = load_spec(spec)
        inputs = resolve_inputs(s)
        key = run_key(s, inputs)
        plan = build_plan(s, inputs, key)
        db = database or s.database
        landed = run_landed(db, key)
    except AisimError as exc:
        _fail(exc)
    out.print(f"spec {s.path}: run '{s.name}', key {key}")
    out.print(f"database {db}: {'already has this run' if landed else 'does not have this run yet'}")
    for f in inputs:
        out.print(f"  input  {f.display} ({f.format}, {f.size:,} bytes, source '{s.sources[f.source].name}')")
    for sh in plan["shards"]:
        out.print(f"  shard {sh['shard_id']}: {sh['model']} on {sh['engine']} "
                  f"({sh['engine_path'] or 'inline'}; {len(sh['reads'])} input file(s))")


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("name", required=False)
@click.option("--db", "database", envvar="AISIM_DB", type=click.Path(dir_okay=False),
              help="The run database (default: $AISIM_DB).")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A query parameter (repeatable); bound by DuckDB, never pasted into the SQL.")
@click.option("--sql", "sql_text", metavar="SQL", help="Run this SQL instead of a named query.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
              show_default=True, help="Output format.")
@click.option("--list", "list_", is_flag=True, help="List the named queries and their parameters.")
def query(name, database, params, sql_text, fmt, list_):
    """Run the named query NAME (aisim query --list) or --sql on a pipeline database.

    \b
    Examples:
      aisim query shards --db pipelines/demo.duckdb
      aisim query slo --db pipelines/demo.duckdb --param ttft_s=2 --param tpot_s=0.02
      aisim query --db pipelines/demo.duckdb --sql "SELECT * FROM latency_percentiles"
    """
    from aisim.errors import AisimError
    from aisim.pipeline import query as q

    if list_:
        _list_queries()
        return
    try:
        if not database:
            raise q.QueryError("give the database with --db FILE (or set AISIM_DB)")
        if name and sql_text:
            raise q.QueryError("give a query NAME or --sql, not both")
        if not name and not sql_text:
            raise q.QueryError("give a query NAME (aisim query --list) or --sql")
        columns, rows = q.run_query(database, name=name, sql_text=sql_text, params=q.parse_params(params))
    except AisimError as exc:
        _fail(exc)
    if fmt == "csv":
        click.echo(q.format_csv(columns, rows), nl=False)
    elif fmt == "json":
        click.echo(q.format_json(columns, rows), nl=False)
    else:
        out = _console(width=200)
        out.print(q.table(columns, rows, title=name))
        out.print(f"{len(rows):,} row{'s' if len(rows) != 1 else ''}")


def _list_queries():
    from rich.table import Table

    from aisim import sql

    t = Table(title="named queries (aisim query NAME --db FILE [--param key=value ...])", title_justify="left",
              show_lines=True)
    t.add_column("name", style="bold")
    t.add_column("purpose")
    t.add_column("parameters")
    for name, qf in sorted(sql.queries().items()):
        params = "\n".join(f"{p.name} ({p.type}{'' if p.required else ', default ' + repr(p.default)})"
                           for p in qf.params)
        t.add_row(name, qf.purpose, params or "-")
    _console().print(t)
