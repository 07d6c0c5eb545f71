"""A sweep's candidates in the report (:mod:`aisim.sweep`; ``sweep_candidates``).

Shown when the reported run is one of a sweep's (every load level's candidates, read through
``sweep_run_id``):

- a sortable table of every candidate, ranked or refused: rank, knobs whole, the highest rate within
  the ``[capacity]`` SLO (a sweep with that section, which ranks by it), goodput, SLO
  attainment, GPUs, goodput per GPU, p99 TTFT and TPOT, rejected requests, the reason of a refusal;
- goodput per GPU against p99 TTFT, one point per ranked candidate, the Pareto front (no other
  candidate has both more goodput per GPU and a lower p99 TTFT) joined, the TTFT threshold drawn;
- with several load levels, latency and goodput against load: one line per grid point (its knobs
  but the load level), p99 TTFT and goodput at each level.
"""

from __future__ import annotations

import json
from html import escape

import numpy as np

from aisim.report.svg import SERIES_CYCLE, Ref, Series, XRef, fmt_count, fmt_duration, fmt_pct, line_chart
from aisim.traces.load import LOAD_KEYS


def per_gpu(c: dict) -> float | None:
    """Goodput per GPU of a ranked candidate (None when unknown)."""
    g, n = c.get("goodput_req_s"), c.get("gpus")
    return g / n if g is not None and n else None


def pareto_front(cands: list) -> list:
    """The candidates no other beats on both goodput per GPU (higher) and p99 TTFT (lower), by p99 TTFT.

    A candidate without a p99 TTFT or a goodput per GPU is left out; of equal points the first stays.
    """
    pts = [(c["ttft_p99_s"], -per_gpu(c), i) for i, c in enumerate(cands)
           if c.get("ttft_p99_s") is not None and per_gpu(c) is not None]
    front, best = [], None
    for ttft, neg_good, i in sorted(pts):
        if best is None or -neg_good > best:
            front.append(cands[i])
            best = -neg_good
    return front


def _load_key(cands: list) -> str | None:
    """The load knob the sweep varies (one per sweep), or None."""
    keys = {k for c in cands for k in (c.get("knobs") or {}) if k in LOAD_KEYS and k != "seed"}
    return sorted(keys)[0] if keys else None


def load_curves(cands: list) -> tuple:
    """``(load key, {grid point: [(level, candidate), ...]})`` of the ranked candidates, levels ascending.

    A grid point is a candidate's knobs but the load ones (as sorted JSON).  Empty when the sweep has
    fewer than two load levels.
    """
    key = _load_key(cands)
    if key is None:
        return None, {}
    lines = {}
    for c in cands:
        if c["status"] != "ranked":
            continue
        point = json.dumps({k: v for k, v in c["knobs"].items() if k not in LOAD_KEYS}, sort_keys=True)
        lines.setdefault(point, []).append((c["knobs"][key], c))
    levels = {lv for pts in lines.values() for lv, _ in pts}
    if len(levels) < 2:
        return key, {}
    return key, {p: sorted(pts, key=lambda t: t[0]) for p, pts in lines.items()}


def _knobs(c: dict) -> str:
    return json.dumps(c.get("knobs") or {}, sort_keys=True, separators=(", ", ": "))


def _td(value, text: str, cls: str = "num") -> str:
    data = "" if value is None else f' data-value="{float(value)!r}"'
    return f'<td class="{cls}"{data}>{escape(text)}</td>'


COLUMNS = ("rank", "candidate", "knobs", "goodput", "SLO met", "GPUs", "goodput / GPU", "p99 TTFT", "p99 TPOT",
           "rejected", "refused because")


def ranks_by_capacity(cands: list) -> bool:
    """Whether the sweep had a ``[capacity]`` section (a ranked candidate has its highest rate)."""
    return any(c.get("capacity_rate_req_s") is not None for c in cands)


def _band(c: dict) -> str:
    """`` (12.8-15.1)``: the capacity rate's band (empty without one)."""
    low, high = c.get("capacity_band_low_req_s"), c.get("capacity_band_high_req_s")
    if low is None and high is None:
        return ""
    return f" ({'-'.join(fmt_count(v) if v is not None else 'none' for v in (low, high))})"


def _table(cands: list) -> str:
    capacity = ranks_by_capacity(cands)
    cols = COLUMNS[:3] + (("capacity",) if capacity else ()) + COLUMNS[3:]
    head = "".join(f'<th scope="col">{escape(h)}</th>' for h in cols)
    rows = []
    for c in cands:
        g = per_gpu(c)
        rate = c.get("capacity_rate_req_s")
        rows.append("<tr>" + "".join([
            _td(c.get("rank"), str(c["rank"]) if c.get("rank") is not None else "-"),
            _td(None, c["candidate"], "txt"),
            _td(None, _knobs(c), "txt knobs"),
            *([_td(rate, f"{fmt_count(rate)}/s{_band(c)}" if rate is not None else "-")] if capacity else []),
            _td(c.get("goodput_req_s"), f"{fmt_count(c['goodput_req_s'])}/s" if c.get("goodput_req_s") is not None
                else "-"),
            _td(c.get("slo_attainment"), fmt_pct(c["slo_attainment"]) if c.get("slo_attainment") is not None
                else "-"),
            _td(c.get("gpus"), str(c["gpus"]) if c.get("gpus") is not None else "-"),
            _td(g, f"{fmt_count(g)}/s" if g is not None else "-"),
            _td(c.get("ttft_p99_s"), fmt_duration(c["ttft_p99_s"]) if c.get("ttft_p99_s") is not None else "-"),
            _td(c.get("tpot_p99_s"), fmt_duration(c["tpot_p99_s"]) if c.get("tpot_p99_s") is not None else "-"),
            _td(c.get("rejected"), fmt_count(c["rejected"]) if c.get("rejected") is not None else "-"),
            _td(None, c.get("reason") or "", "txt"),
        ]) + "</tr>")
    return (f'<div class="scroll"><table class="summary sortable" id="sweep-table"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _pareto_chart(ranked: list, slo: dict) -> str:
    pts = [c for c in ranked if c.get("ttft_p99_s") is not None and per_gpu(c) is not None]
    front = pareto_front(ranked)
    labels = [f"{c['candidate']} {_knobs(c)}: {fmt_count(per_gpu(c))}/s per GPU, p99 TTFT "
              f"{fmt_duration(c['ttft_p99_s'])}" for c in pts]
    series = [Series("candidates", np.array([c["ttft_p99_s"] for c in pts]), np.array([per_gpu(c) for c in pts]),
                     "blue", "points", labels=labels, hover=False),
              Series("Pareto front", np.array([c["ttft_p99_s"] for c in front]),
                     np.array([per_gpu(c) for c in front]), "orange", "line", width=1.4)]
    xrefs = [XRef(slo["ttft_s"], f"SLO TTFT {fmt_duration(slo['ttft_s'])}")] if slo.get("ttft_s") else []
    return line_chart(series, title="Goodput per GPU against p99 TTFT", chart_id="sweep-pareto", xfmt="duration",
                      yfmt="rate", xlabel="p99 TTFT", ylabel="goodput per GPU", xrefs=xrefs,
                      note="" if pts else "no ranked candidate")


def _load_charts(key: str, lines: dict, slo: dict) -> list:
    charts = []
    for metric, title, yfmt, ref in (("ttft_p99_s", "p99 TTFT", "duration", "ttft_s"),
                                     ("tpot_p99_s", "p99 TPOT", "duration", "tpot_s"),
                                     ("goodput_req_s", "goodput", "rate", None)):
        series = []
        for i, (point, pts) in enumerate(lines.items()):
            x = np.array([float(lv) for lv, _ in pts])
            y = np.array([np.nan if c.get(metric) is None else float(c[metric]) for _, c in pts])
            series.append(Series(pts[0][1]["candidate"] + " " + point, x, y, SERIES_CYCLE[i % len(SERIES_CYCLE)]))
        refs = [Ref(slo[ref], f"SLO {fmt_duration(slo[ref])}", "red")] if ref and slo.get(ref) else []
        charts.append((f"{title} against {key}", line_chart(
            series, title=f"{title} against load ({key})", chart_id=f"sweep-load-{metric}", xfmt="count",
            yfmt=yfmt, xlabel=key, ylabel=title, refs=refs)))
    return charts


def sweep_section(cands: list, slo: dict) -> str:
    """The report's sweep section for the candidates ``cands`` (``RunData.sweep``); "" when there are none."""
    if not cands:
        return ""
    ranked = [c for c in cands if c["status"] == "ranked"]
    refused = len(cands) - len(ranked)
    limits = ", ".join(f"{k.removesuffix('_s').upper()} <= {fmt_duration(v)}" for k, v in sorted(slo.items()))
    figs = [("Goodput per GPU against p99 TTFT (Pareto front joined)", _pareto_chart(ranked, slo))]
    key, lines = load_curves(cands)
    if lines:
        figs += _load_charts(key, lines, slo)
    body = "".join(f'<figure class="card"><figcaption>{escape(t)}</figcaption>{c}</figure>' for t, c in figs)
    by = " Ranked by the highest rate within the [capacity] SLO (capacity)." if ranks_by_capacity(cands) else ""
    cals = sorted({c["calibration"] for c in cands if c.get("calibration")})
    if cals and ranks_by_capacity(cands):
        by += (" In brackets its band: every step time at the ends of the held-out errors of calibration "
               f"{', '.join(repr(c) for c in cals)}.")
    return (f'<h2 id="sweep">Sweep</h2><p class="sub">{len(cands)} candidates: {len(ranked)} ranked, {refused} '
            f'refused; SLO {escape(limits or "none")}.{escape(by)} Click a column heading to sort.</p>'
            f'{_table(cands)}<div class="grid compare">{body}</div>')


__all__ = ["load_curves", "pareto_front", "per_gpu", "ranks_by_capacity", "sweep_section"]
