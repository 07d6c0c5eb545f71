"""``aisim pipeline``: run and check batch specs, land staged runs.

Heavy modules (Dask, DuckDB, Arrow, the replay core) are imported inside the
commands so that ``aisim --help`` stays fast.  Errors go to stderr with exit
status 2; an interrupted run exits with 130 and lands nothing.
"""

from __future__ import annotations

import click

from aisim.cli_util import CONTEXT_SETTINGS, console, echo_csv, echo_json, fail, fmt_num, format_option
from aisim.config.overrides import set_option


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
@click.option("--staging", metavar="PATH|URL",
              help="Stage the results here (a directory or an fsspec URL such as s3://bucket/prefix) instead of "
                   "the spec's landing.staging (default: DATABASE.staging beside the database).")
@click.option("--lock-timeout", "lock_timeout", type=click.FloatRange(min=0), metavar="SECONDS",
              help="How long landing waits for another process's database lock (default: the spec's "
                   "landing.lock_timeout_s, 60 s).")
@click.option("--progress", type=click.Choice(["auto", "bars", "lines", "none"]), default="auto",
              show_default=True, help="Progress on stderr: bars on a terminal, lines otherwise.")
@set_option()
@format_option()
def run_cmd(spec, scheduler, workers, force, database, staging, lock_timeout, progress, sets, fmt):
    """Run the pipeline SPEC (TOML) and land its results in one transaction.

    The run key hashes the spec, every input and engine file and the --set changes (made to every
    engine of the spec): running the same spec over the same files with the same changes again
    lands nothing (use --force to replace the run).  Workers write the results as Parquet to the
    staging location and the run lands from there; if landing fails, they stay staged and
    `aisim pipeline land RUN` lands them later.
    """
    from aisim.pipeline.progress import LineProgress, Quiet, RichProgress
    from aisim.pipeline.run import run_pipeline

    err = console(stderr=True)
    mode = progress if progress != "auto" else ("bars" if err.is_terminal else "lines")
    reporter = {"bars": RichProgress, "lines": LineProgress}.get(mode, lambda c: Quiet())(err)

    def run():
        from aisim.config.overrides import parse_sets
        from aisim.pipeline.spec import load_spec, with_overrides

        s = with_overrides(load_spec(spec), parse_sets(sets)) if sets else spec
        return run_pipeline(s, scheduler=scheduler, workers=workers, force=force, database=database,
                            progress=reporter, staging=staging, wait_s=lock_timeout)

    report = _guarded(run)
    _print_report(report, fmt)


def _guarded(call):
    """Run ``call``; an aisim error is one line (exit 2), Ctrl-C one line (exit 130)."""
    from aisim.errors import AisimError, LandingInterrupted

    try:
        return call()
    except AisimError as exc:
        fail(exc)
    except KeyboardInterrupt as exc:
        from aisim.files import interrupt_status

        code, word = interrupt_status()
        fail(exc if isinstance(exc, LandingInterrupted) else f"{word}; nothing was landed", code)


def _print_report(report, fmt):
    from aisim.pipeline.progress import print_summary, summary_record

    if fmt == "json":
        echo_json(summary_record(report))
    elif fmt == "csv":
        shards = summary_record(report)["shards"]
        columns = list(shards[0]) if shards else ["shard_id"]
        echo_csv(columns, [[s.get(c) for c in columns] for s in shards])
    else:
        print_summary(report, console())


@pipeline.command("land")
@click.argument("run_id", metavar="RUN")
@click.option("--db", "database", type=click.Path(dir_okay=False),
              help="The database to land in (default: the spec's, else the one the run was meant for).")
@click.option("--staging", metavar="PATH|URL",
              help="Where the run is staged (default: the spec's landing.staging, else DATABASE.staging).")
@click.option("--spec", type=click.Path(dir_okay=False), help="The run's spec: its database, staging and landing "
              "options.")
@click.option("--force", is_flag=True, help="Replace the run if the database has it already.")
@click.option("--lock-timeout", "lock_timeout", type=click.FloatRange(min=0), metavar="SECONDS",
              help="How long to wait for another process's database lock (default 60 s).")
@format_option()
def land_cmd(run_id, database, staging, spec, force, lock_timeout, fmt):
    """Land the staged run RUN (a run whose landing failed) without replaying it.

    RUN is the run key a failed `aisim pipeline run` printed; the staged files are removed once
    the database holds the run.
    """
    from aisim.pipeline.run import land_run

    report = _guarded(lambda: land_run(run_id, database=database, staging=staging, spec=spec, force=force,
                                       wait_s=lock_timeout))
    _print_report(report, fmt)


@pipeline.command("check")
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--db", "database", type=click.Path(dir_okay=False), help="Look for the run in this database.")
@set_option()
@format_option()
def check_cmd(spec, database, sets, fmt):
    """Validate SPEC (with --set's changes) and show its shards, input files and run key, without replaying
    anything."""
    from aisim.errors import AisimError
    from aisim.pipeline.landing import run_landed
    from aisim.pipeline.run import build_plan
    from aisim.pipeline.runkey import resolve_inputs, run_key
    from aisim.pipeline.spec import load_spec

    out = console()
    try:
        s = load_spec(spec)
        if sets:
            from aisim.config.overrides import parse_sets
            from aisim.pipeline.spec import with_overrides

            s = with_overrides(s, parse_sets(sets))
        inputs = resolve_inputs(s)
        key = run_key(s, inputs)
        plan = build_plan(s, inputs, key)
        db = database or s.database
        landed = run_landed(db, key)
    except AisimError as exc:
        fail(exc)
    shards = [{"shard_id": sh["shard_id"], "model": sh["model"], "engine": sh["engine"],
               "engine_path": sh["engine_path"], "input_files": len(sh["reads"]),
               "replicas": sh["deployment"].replicas if sh["deployment"] is not None else None,
               "router": sh["deployment"].router if sh["deployment"] is not None else None}
              for sh in plan["shards"]]
    if fmt == "json":
        echo_json({"spec": str(s.path), "name": s.name, "run_key": key, "database": str(db), "landed": bool(landed),
                   "inputs": [{"path": f.display, "format": f.format, "bytes": f.size,
                               "source": s.sources[f.source].name} for f in inputs],
                   "shards": shards})
        return
    if fmt == "csv":
        echo_csv(list(shards[0]) if shards else ["shard_id"], [list(sh.values()) for sh in shards])
        return
    out.print(f"spec {s.path}: run '{s.name}', key {key}")
    out.print(f"database {db}: {'already has this run' if landed else 'does not have this run yet'}")
    for f in inputs:
        out.print(f"  input  {f.display} ({f.format}, {fmt_num(f.size)} bytes, source '{s.sources[f.source].name}')")
    for sh in plan["shards"]:
        fleet = sh["deployment"]
        fleet = f"; {fleet.describe()}" if fleet is not None else ""
        out.print(f"  shard {sh['shard_id']}: {sh['model']} on {sh['engine']} "
                  f"({sh['engine_path'] or 'inline'}{fleet}; {len(sh['reads'])} input file(s))")
