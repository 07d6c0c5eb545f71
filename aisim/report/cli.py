"""``aisim report``: the HTML report of a pipeline run."""

from __future__ import annotations

import os
import time

import click

from aisim.cli_util import CONTEXT_SETTINGS, fail, fmt_num, fmt_seconds, out_option


def parse_slo(items) -> dict:
    """``("ttft_s=0.5", ...)`` as ``{"ttft_s": 0.5}``; a ReportError naming the bad item."""
    import math

    from aisim.columns import LATENCIES
    from aisim.errors import ReportError

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if key not in LATENCIES or not sep:
            raise ReportError(f"--slo {item!r}: give KEY=SECONDS with KEY one of {', '.join(LATENCIES)}")
        try:
            v = float(value)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and v > 0):
            raise ReportError(f"--slo {item!r}: the threshold must be a positive number of seconds")
        out[key] = v
    return out


@click.command(context_settings=CONTEXT_SETTINGS)
@click.option("--db", "database", envvar="AISIM_DB", type=click.Path(dir_okay=False),
              help="The run database (default: $AISIM_DB).")
@click.option("--run", "run", metavar="RUN",
              help="Run id, run name (its latest run) or id prefix (default: the latest run).")
@out_option("--out", "out", required=True, help="Write the HTML report here (replaced atomically).")
@click.option("--max-points", type=click.IntRange(min=100), default=1500, show_default=True,
              help="Points per drawn series at most (display only; numbers use every step).")
@click.option("--slo", "slo", multiple=True, metavar="KEY=SECONDS",
              help="A latency threshold drawn on the latency charts: ttft_s, tpot_s or e2e_s (repeatable; "
                   "default: the sweep's SLO when the run is a sweep's).")
@click.option("--capacity", "search", metavar="SEARCH",
              help="Report a capacity search instead of a run: its search id, name or id prefix (aisim capacity).")
@click.option("--replay", "folders", multiple=True, metavar="DIR", type=click.Path(file_okay=False),
              help="Report the replay aisim replay --out DIR wrote instead of a run (repeatable: one section each, "
                   "their CDFs overlaid).")
def report(database, run, out, max_points, slo, search, folders):
    """Write one self-contained HTML report of a pipeline run.

    Per model and engine configuration: KV-cache occupancy over time (active, cached, physical;
    bytes for grouped caches), running and waiting requests, scheduled prefill and decode tokens,
    throughput, TTFT / TPOT / E2E CDFs, prefix reuse and preemptions, with a run summary table and
    every shard's CDFs overlaid (the SLO drawn); for a sweep's run, its candidates (sortable), goodput
    per GPU against p99 TTFT and latency against load.  The page needs no network access to view.

    With --capacity SEARCH, the report of a capacity search instead: its answer, latency against the
    request rate (a rate search) or goodput per GPU against p99 TTFT (a deployment search), and every
    evaluated point.

    With --replay DIR, the report of a replay's output folder (aisim replay --out DIR) instead.

    \b
    Examples:
      aisim report --db pipelines/demo.duckdb --out demo.html
      aisim report --replay out/ --out replay.html
    """
    from aisim.errors import AisimError, ReportError
    from aisim.report import write_report

    t0 = time.perf_counter()
    try:
        if folders:
            source = click.get_current_context().get_parameter_source("database")
            if source is not None and source.name == "ENVIRONMENT":
                database = None  # $AISIM_DB names the run database; --replay reads folders instead
            if database or run or search:
                raise ReportError("--replay reports replay output folders: --db, --run and --capacity are a "
                                  "database's options")
            from aisim.files import write_text
            from aisim.report.folder import folder_files, folders_run
            from aisim.report.html import render

            rd = folders_run(folders, slo=parse_slo(slo))
            write_text(out, [render(rd, max_points)], "--out", inputs={"--replay": [f for d in folders for f in folder_files(d)]})
            click.echo(f"report of {len(rd.shards)} replay{'s' if len(rd.shards) != 1 else ''} written to {out} "
                       f"({fmt_num(os.path.getsize(out) / 1024, 0)} KiB) in {fmt_seconds(time.perf_counter() - t0)}")
            return
        if not database:
            raise ReportError("give the run database with --db FILE (or set AISIM_DB)")
        if search is not None:
            if run is not None or slo:
                raise ReportError("--capacity reports a capacity search: --run and --slo are a run's options")
            from aisim.files import check_outputs, write_text
            from aisim.report.capacity import load_search, render_capacity

            check_outputs({"--out": out}, {"--db": database})
            data = load_search(database, search)
            html = render_capacity(data)
            write_text(out, html, "--out", inputs={"--db": database})
            click.echo(f"report of capacity search {data['search']} ({data['search_id'][:12]}): "
                       f"{len(data['points'])} points written to {out} "
                       f"({fmt_num(len(html.encode()) / 1024, 0)} KiB) in {fmt_seconds(time.perf_counter() - t0)}",
                       err=_on_stdout(out))
            return
        rd = write_report(database, out, run=run, max_points=max_points, slo=parse_slo(slo))
    except AisimError as exc:
        fail(exc)
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
    from aisim.files import is_stream

    size = None if is_stream(out) else os.path.getsize(out)
    r = rd.run
    click.echo(f"report of run {r['name']} ({r['run_id']}, #{r['run_seq']}): {len(rd.shards)} shard"
               f"{'s' if len(rd.shards) != 1 else ''} written to {out}"
               f"{f' ({fmt_num(size / 1024, 0)} KiB)' if size is not None else ''} in "
               f"{fmt_seconds(time.perf_counter() - t0)}", err=_on_stdout(out))


def _on_stdout(out) -> bool:
    # The report itself on standard output: the message goes to stderr.
    return out in ("-", "/dev/stdout")
