"""``aisim report``: one self-contained HTML page with the plots of a pipeline run (or a capacity search).

==================  =====================================================================
module              what it does
==================  =====================================================================
``data``            pick a run in a DuckDB run database and read its shards (bound SQL)
``downsample``      reduce long series for display (M4 min/max buckets, bands, CDFs)
``svg``             dependency-free inline SVG charts (lines, steps, areas, bands, points, bars)
``html``            the document: run summary, shard comparison, one section per shard
``offload``         the KV offload panel: hit rate per tier, the CPU tier's occupancy and traffic
``sweep``           a sweep's candidates: sortable table, goodput per GPU against p99 TTFT, load curves
``capacity``        a capacity search's page: the answer, latency against rate, Pareto, every point
``cli``             the ``aisim report`` command
==================  =====================================================================
"""

from __future__ import annotations

from aisim.errors import ReportError


def build_report(database: str, run: str | None = None, max_points: int | None = None, slo: dict | None = None):
    """The HTML report of ``run`` (id, name or id prefix; default the latest) in ``database``.

    ``slo``: latency thresholds to draw (``ttft_s``, ``tpot_s``, ``e2e_s``; default: the sweep's).

    Returns
    -------
    (str, RunData)
        The document and the data it was made from.
    """
    from aisim.report.data import load_run
    from aisim.report.downsample import MAX_POINTS
    from aisim.report.html import render

    rd = load_run(database, run, slo)
    return render(rd, max_points or MAX_POINTS), rd


def write_report(database: str, out: str, run: str | None = None, max_points: int | None = None,
                 slo: dict | None = None):
    """Write the report to ``out`` through :mod:`aisim.files` (a file atomically, a stream as it goes; never
    over the database); returns the RunData."""
    from aisim.files import check_outputs, write_text

    check_outputs({"--out": out}, {"--db": database})
    html, rd = build_report(database, run, max_points, slo)
    write_text(out, html, "--out", inputs={"--db": database})
    return rd


__all__ = ["ReportError", "build_report", "write_report"]
