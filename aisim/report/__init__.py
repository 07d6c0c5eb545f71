"""``aisim report``: one self-contained HTML page with the plots of a pipeline run.

==================  =====================================================================
module              what it does
==================  =====================================================================
``data``            pick a run in a DuckDB run database and read its shards (bound SQL)
``downsample``      reduce long series for display (M4 min/max buckets, bands, CDFs)
``svg``             dependency-free inline SVG charts (lines, steps, areas, bands, bars)
``html``            the document: run summary, shard comparison, one section per shard
``cli``             the ``aisim report`` command
==================  =====================================================================
"""

from __future__ import annotations

from aisim.errors import ReportError


def build_report(database: str, run: str | None = None, max_points: int | None = None):
    """The HTML report of ``run`` (id, name or id prefix; default the latest) in ``database``.

    Returns
    -------
    (str, RunData)
        The document and the data it was made from.
    """
    from aisim.report.data import load_run
    from aisim.report.downsample import MAX_POINTS
    from aisim.report.html import render

    rd = load_run(database, run)
    return render(rd, max_points or MAX_POINTS), rd


def write_report(database: str, out: str, run: str | None = None, max_points: int | None = None):
    """Write the report to ``out`` atomically (a temporary file renamed into place); returns the RunData."""
    from aisim.files import write_atomic_text

    html, rd = build_report(database, run, max_points)
    write_atomic_text(out, [html])
    return rd


__all__ = ["ReportError", "build_report", "write_report"]
