"""The report of a capacity search (:mod:`aisim.capacity`; ``capacity_points``).

``aisim report --capacity SEARCH`` reads one search's points (its ``search_id``, its name, or a
unique prefix of its id) and draws them:

- the answer and every evaluated point in a sortable table (verdict, reason, attainment, p99
  latencies, throughput, GPUs, GPU-hours, cost);
- the highest rate within an SLO (``question = 'rate'``): latency against load — p50 and p99 TTFT,
  TPOT and E2E against the request rate, the SLO's thresholds drawn — and the SLO attainment against
  the rate with the share the SLO asks for; a point per evaluated rate, meeting or failing;
- the smallest deployment (``question = 'fleet'``): goodput per GPU (requests meeting the SLO per
  second, per GPU) against p99 TTFT, one point per evaluated deployment, the Pareto front joined,
  and the attainment against the replicas, one line per grid point and layout.
"""

from __future__ import annotations

import json
import os
from html import escape

import numpy as np

from aisim.errors import ReportError
from aisim.report.data import _rows, connect
from aisim.report.svg import (SERIES_CYCLE, SLO_COLOR, Ref, Series, XRef, fmt_count, fmt_duration, fmt_pct,
                              line_chart)


def load_search(path: str, selector: str) -> dict:
    """The points of capacity search ``selector`` in the database at ``path``, in point order.

    ``selector``: a ``search_id``, a search name (its one search), or a unique prefix of a ``search_id``.

    Returns
    -------
    dict
        ``search_id``, ``search`` (name), ``question``, ``slo`` (dict), ``points`` (dicts of the
        ``capacity_points`` columns, ``knobs``/``load``/``deployment`` parsed), ``database``.

    Raises
    ------
    ReportError
        No capacity search in the database, none matches, or a name or prefix matches several.
    """
    con = connect(path)
    try:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        if "capacity_points" not in tables:
            raise ReportError(f"{path} holds no capacity search (no capacity_points table); run aisim capacity")
        found = con.execute("SELECT DISTINCT search_id, search FROM capacity_points ORDER BY search, search_id"
                            ).fetchall()
        ids = [i for i, name in found if i == selector] or [i for i, name in found if name == selector] or \
            [i for i, _ in found if i.startswith(selector)]
        if not ids:
            listed = ", ".join(f"{name} ({i[:12]})" for i, name in found)
            raise ReportError(f"no capacity search {selector!r} in {path}; it holds: {listed}")
        if len(ids) > 1:
            raise ReportError(f"{selector!r} names {len(ids)} capacity searches in {path}: "
                              f"{', '.join(i[:12] for i in ids)}; give more of the search id")
        points = _rows(con, "SELECT * FROM capacity_points WHERE search_id = ? ORDER BY point", [ids[0]])
    finally:
        con.close()
    for p in points:
        for k in ("knobs", "load", "deployment", "slo"):
            if isinstance(p.get(k), str):
                p[k] = json.loads(p[k])
    return {"search_id": ids[0], "search": points[0]["search"], "question": points[0]["question"],
            "slo": points[0]["slo"] or {}, "points": points, "database": os.path.abspath(path)}


def goodput_per_gpu(p: dict) -> float | None:
    """Requests meeting the SLO per second, per GPU, of an evaluated point (None when not replayed)."""
    if p.get("slo_met") is None or not p.get("duration_s") or not p.get("gpus"):
        return None
    return p["slo_met"] / p["duration_s"] / p["gpus"]


def _slo_lines(slo: dict, lat: str) -> list:
    """The SLO's lines on a chart of latency ``lat`` (``ttft``, ``tpot``, ``e2e``): its per-request threshold
    (``SLO 500 ms``) and each percentile limit (``SLO p99 500 ms``), in the SLO's colour."""
    out = []
    v = _thresholds(slo).get(f"{lat}_s")
    if v:
        out.append(Ref(v, f"SLO {fmt_duration(v)}", SLO_COLOR))
    for p in ("p50", "p90", "p99"):
        v = slo.get(f"{lat}_{p}_s")
        if isinstance(v, (int, float)) and v > 0:
            out.append(Ref(v, f"SLO {p} {fmt_duration(v)}", SLO_COLOR))
    return out


def _thresholds(slo: dict) -> dict:
    """The per-request thresholds of ``slo`` by latency (``ttft_s`` ...)."""
    return {k: v for k, v in slo.items() if k in ("ttft_s", "tpot_s", "e2e_s") and v is not None}


COLUMNS = (("point", "point", "count"), ("phase", "phase", None), ("candidate", "candidate", None),
           ("knobs", "knobs", None), ("replicas", "replicas", "count"), ("rate_req_s", "rate", "rate"),
           ("verdict", "verdict", None), ("attainment", "SLO met", "pct"), ("ttft_p99_s", "p99 TTFT", "duration"),
           ("tpot_p99_s", "p99 TPOT", "duration"), ("e2e_p99_s", "p99 E2E", "duration"),
           ("throughput_req_s", "throughput", "rate"), ("gpus", "GPUs", "count"), ("gpu_hours", "GPU-hours", "num"),
           ("cost_per_mtok", "per M tokens", "num"), ("reason", "reason", None))


def _text(v, fmt) -> str:
    if v is None:
        return "-"
    if fmt == "pct":
        return fmt_pct(v)
    if fmt == "duration":
        return fmt_duration(v)
    if fmt == "rate":
        return f"{fmt_count(v)}/s"
    if fmt in ("count", "num"):
        return fmt_count(v)
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, separators=(", ", ": "))
    return str(v)


def _table(points: list) -> str:
    head = "".join(f'<th scope="col">{escape(h)}</th>' for _, h, _ in COLUMNS)
    rows = []
    for p in points:
        cells = []
        for key, _, fmt in COLUMNS:
            v = p.get(key)
            data = f' data-value="{float(v)!r}"' if fmt and v is not None else ""
            cls = "num" if fmt else "txt knobs" if key == "knobs" else "txt"
            cells.append(f'<td class="{cls}" data-key="{key}"{data}>{escape(_text(v, fmt))}</td>')
        rows.append(f'<tr{" class=answer" if p.get("answer") else ""}>{"".join(cells)}</tr>')
    return (f'<div class="scroll"><table class="summary sortable" id="capacity-points"><thead><tr>{head}</tr>'
            f'</thead><tbody>{"".join(rows)}</tbody></table></div>')


def _verdict_points(x: list, y: list, pts: list, name: str) -> list:
    """Two point series: the evaluated points that meet the SLO and those that fail it."""
    out = []
    for verdict, color in (("meets", "green"), ("fails", SLO_COLOR)):
        keep = [i for i, p in enumerate(pts) if p["verdict"] == verdict and x[i] is not None and y[i] is not None]
        out.append(Series(f"{name}: {verdict} the SLO", np.array([x[i] for i in keep], dtype=float),
                          np.array([y[i] for i in keep], dtype=float), color, "points", hover=False,
                          labels=[f"point {pts[i]['point']}: {verdict}" for i in keep]))
    return out


def rate_charts(points: list, slo: dict) -> list:
    """``(title, svg)`` of a rate search: latency against load and attainment against the rate."""
    pts = sorted((p for p in points if p.get("rate_req_s") is not None and p["verdict"] != "refused"),
                 key=lambda p: (p["rate_req_s"], p["point"]))
    x = np.array([p["rate_req_s"] for p in pts], dtype=float)
    charts = []
    for lat, lab in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E")):
        series = []
        for stat, color in (("p50", "sky"), ("p99", "blue")):
            y = np.array([np.nan if p.get(f"{lat}_{stat}_s") is None else p[f"{lat}_{stat}_s"] for p in pts])
            series.append(Series(f"{stat} {lab}", x, y, color))
        refs = _slo_lines(slo, lat)
        charts.append((f"{lab} against the request rate", line_chart(
            series, title=f"{lab} against the request rate", chart_id=f"capacity-{lat}", xfmt="rate",
            yfmt="duration", xlabel="requests per second", ylabel=lab, refs=refs,
            note="" if len(pts) else "no replayed point")))
    att = [p.get("attainment") for p in pts]
    series = [Series("SLO attainment", x, np.array([np.nan if a is None else a for a in att]), "blue")]
    series += _verdict_points(list(x), att, pts, "rate")
    refs = [Ref(slo["attainment"], f"required {fmt_pct(slo['attainment'])}", SLO_COLOR)] if slo.get("attainment") \
        else []
    charts.append(("SLO attainment against the request rate", line_chart(
        series, title="SLO attainment against the request rate", chart_id="capacity-attainment", xfmt="rate",
        yfmt="pct", ylim=(0.0, 1.0), xlabel="requests per second", ylabel="requests meeting the SLO", refs=refs)))
    return charts


def fleet_charts(points: list, slo: dict) -> list:
    """``(title, svg)`` of a smallest-deployment search: the Pareto chart and attainment against replicas."""
    from aisim.report.sweep import pareto_front

    pts = [p for p in points if p["verdict"] != "refused" and goodput_per_gpu(p) is not None
           and p.get("ttft_p99_s") is not None]
    cands = [{"candidate": f"point {p['point']}", "ttft_p99_s": p["ttft_p99_s"], "goodput_req_s": goodput_per_gpu(p),
              "gpus": 1} for p in pts]
    front = pareto_front(cands)
    series = _verdict_points([p["ttft_p99_s"] for p in pts], [goodput_per_gpu(p) for p in pts], pts, "deployments")
    series.append(Series("Pareto front", np.array([c["ttft_p99_s"] for c in front], dtype=float),
                         np.array([c["goodput_req_s"] for c in front], dtype=float), "orange", width=1.4))
    # The x axis is p99 TTFT: the SLO's p99 limit, and a per-request threshold, are lines across it.
    xrefs = [XRef(r.y, "SLO TTFT " + r.label[len("SLO "):], SLO_COLOR) for r in _slo_lines(slo, "ttft")
             if not r.label.startswith(("SLO p50", "SLO p90"))]
    charts = [("Goodput per GPU against p99 TTFT (Pareto front joined)", line_chart(
        series, title="Goodput per GPU against p99 TTFT", chart_id="capacity-pareto", xfmt="duration", yfmt="rate",
        xlabel="p99 TTFT", ylabel="goodput per GPU", xrefs=xrefs, note="" if pts else "no replayed point"))]
    lines = {}
    for p in points:
        if p["verdict"] == "refused" or p.get("attainment") is None:
            continue
        lines.setdefault((p["candidate"], json.dumps(p["knobs"], sort_keys=True)), []).append(p)
    series = []
    for i, ((cand, knobs), ps) in enumerate(lines.items()):  # knobs name the layout
        ps = sorted(ps, key=lambda p: p["replicas"])
        series.append(Series(f"{cand} {knobs}", np.array([p["replicas"] for p in ps], dtype=float),
                             np.array([p["attainment"] for p in ps], dtype=float), SERIES_CYCLE[i % len(SERIES_CYCLE)]))
    refs = [Ref(slo["attainment"], f"required {fmt_pct(slo['attainment'])}", SLO_COLOR)] if slo.get("attainment") \
        else []
    charts.append(("SLO attainment against the replicas", line_chart(
        series, title="SLO attainment against the replicas", chart_id="capacity-replicas", xfmt="count",
        yfmt="pct", ylim=(0.0, 1.0), xlabel="replicas", ylabel="requests meeting the SLO", refs=refs)))
    return charts


def band_text(answer: dict, unit: str) -> str:
    """``, 12.8-15.1 (...)``: the answer's band and the calibration that gave it (empty without one)."""
    if answer.get("calibration") is None:
        return ""
    ends = [answer.get(f"band_{e}_{unit}") for e in ("low", "high")]
    text = "-".join(fmt_count(v) if v is not None else "none" for v in ends)
    return (f", {text} with every step time at the ends of the held-out errors of calibration "
            f"'{answer['calibration']}'")


def render_capacity(data: dict) -> str:
    """The report page of a capacity search (:func:`load_search`'s ``data``)."""
    from aisim.report.html import document

    points, slo = data["points"], data["slo"]
    answer = next((p for p in points if p.get("answer")), None)
    if answer is None:
        verdict = "No evaluated point meets the SLO."
    elif data["question"] == "rate":
        verdict = (f"Highest rate within the SLO: {fmt_count(answer['rate_req_s'])} requests/s"
                   f"{band_text(answer, 'req_s')} (point {answer['point']}) on {answer['gpus']} "
                   f"GPU{'s' if answer['gpus'] != 1 else ''}.")
    else:
        verdict = (f"Smallest deployment: {answer['candidate']} {_text(answer['knobs'], None)}, "
                   f"{answer['replicas']} replicas, {answer['gpus']} GPUs{band_text(answer, 'gpus')} "
                   f"(point {answer['point']}).")
    limits = ", ".join(f"{k} {v:g}" for k, v in sorted(slo.items()) if v is not None)
    charts = rate_charts(points, slo) if data["question"] == "rate" else fleet_charts(points, slo)
    figs = "".join(f'<figure class="card"><figcaption>{escape(t)}</figcaption>{c}</figure>' for t, c in charts)
    body = (f'<h2 id="answer">Answer</h2><p>{escape(verdict)}</p><p class="sub">SLO: {escape(limits or "none")}</p>'
            f'<h2 id="charts">Charts</h2><div class="grid compare">{figs}</div>'
            f'<h2 id="points">Evaluated points</h2>{_table(points)}')
    nav = ['<a href="#answer">answer</a>', '<a href="#charts">charts</a>', '<a href="#points">points</a>']
    question = "highest rate within an SLO" if data["question"] == "rate" else "smallest deployment"
    return document(f"aisim capacity report: {data['search']} ({data['search_id'][:12]})",
                    f"capacity search {data['search']}",
                    f"{question} · {len(points)} evaluated points · search id {data['search_id'][:12]}",
                    nav, body, data["database"], "Every point is one replay of the whole trace.")


__all__ = ["band_text", "fleet_charts", "goodput_per_gpu", "load_search", "rate_charts", "render_capacity"]
