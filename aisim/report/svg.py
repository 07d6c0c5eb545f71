"""Dependency-free inline SVG charts: lines, steps, areas, min-max bands, CDFs and bars.

Charts are plain SVG strings meant to be inlined in an HTML5 document (no
``xmlns`` needed, nothing fetched).  They scale with their container (a
``viewBox`` and ``width: 100%``).  Series are drawn as given: reduce long
series first (:mod:`aisim.report.downsample`).

Each chart carries its axis mapping in ``data-*`` attributes and each hoverable
line its name, so the report's small inline script can show values under the
pointer and toggle series from the legend; without the script the charts are
complete (bars carry native ``<title>`` tooltips).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

import numpy as np

# Colours, chosen to stay apart for common colour-vision deficiencies (Okabe-Ito based).
COLORS = {
    "blue": "#0072b2",
    "orange": "#e69f00",
    "green": "#009e73",
    "red": "#d55e00",
    "purple": "#8e5ea2",
    "sky": "#56b4e9",
    "yellow": "#c9b400",
    "pink": "#cc79a7",
    "grey": "#6b7280",
    "lightgrey": "#a8afba",
    "darkgrey": "#3f4754",
    "black": "#1f2937",
}
# Red is the SLO's (limits and thresholds drawn on a chart, points that fail it) and the greys are the
# guides' (percentile lines, capacities): the lines of a chart's series take the other colours, in order.
SLO_COLOR = "red"
SERIES_CYCLE = ("blue", "orange", "green", "purple", "sky", "pink", "yellow", "black")

WIDTH, HEIGHT = 640, 280
FONT = 11
CHAR_W = 6.3  # mean advance of an 11 px sans-serif character, for layout


@dataclass
class Series:
    """One series of a line chart.

    ``kind``: ``"line"`` (points joined), ``"step"`` (each value held until the
    next x), ``"area"`` (a line filled down to zero), ``"band"`` (``lo``..``hi``
    shaded with ``y`` as a line over it) or ``"points"`` (a marker per point, each
    with ``labels[i]`` as its tooltip when given).
    """

    name: str
    x: np.ndarray
    y: np.ndarray
    color: str = "blue"
    kind: str = "line"
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None
    dash: bool = False
    width: float = 1.6
    fill_opacity: float = 0.28
    hover: bool = True
    labels: list | None = None


@dataclass
class Ref:
    """A horizontal reference line (a capacity, a budget) with a label."""

    y: float
    label: str
    color: str = "grey"


@dataclass
class XRef:
    """A vertical reference line (a latency threshold) with a label."""

    x: float
    label: str
    color: str = "red"


def _c(name: str) -> str:
    return COLORS.get(name, name)


# ---------------------------------------------------------------------------- number formats


def _g(v: float, digits: int = 3) -> str:
    """``v`` with up to ``digits`` significant digits, no exponent for everyday magnitudes."""
    if v == 0:
        return "0"
    s = f"{v:.{digits}g}"
    if "e" in s:
        mant, exp = s.split("e")
        e = int(exp)
        if -5 < e < 15:
            s = f"{v:.{max(0, digits - 1 - e)}f}"
        else:
            return f"{mant}e{e}"
    return s


def fmt_count(v) -> str:
    """1234 -> '1,234'; 25000 -> '25k'; 3.2e6 -> '3.2M'."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    a = abs(v)
    for div, suf in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e4, "k")):
        if a >= div:
            d = 1e3 if suf == "k" else div
            return f"{_g(v / d)}{suf}"
    if a >= 100 or float(v).is_integer():
        return f"{round(v):,}"
    return _g(v)


def fmt_pct(v, digits: int = 3) -> str:
    """A fraction as a percentage: 0.4567 -> '45.7%'."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{_g(v * 100, digits)}%"


_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def byte_unit(v: float) -> tuple:
    """(divisor, unit) for showing byte counts around ``v``."""
    k = 0
    while k < len(_BYTE_UNITS) - 1 and abs(v) >= 1024 ** (k + 1):
        k += 1
    return 1024 ** k, _BYTE_UNITS[k]


def fmt_bytes(v, unit: tuple | None = None) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    div, name = unit or byte_unit(v)
    return f"{_g(v / div)} {name}"


def fmt_duration(v) -> str:
    """Seconds as a readable duration: 0.0123 -> '12.3 ms', 95 -> '1.58 min'."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    a = abs(v)
    if a == 0:
        return "0 s"
    if a < 1e-3:
        return f"{_g(v * 1e6)} µs"
    if a < 1:
        return f"{_g(v * 1e3)} ms"
    if a < 120:
        return f"{_g(v)} s"
    if a < 7200:
        return f"{_g(v / 60)} min"
    return f"{_g(v / 3600)} h"


def fmt_value(v, fmt: str) -> str:
    """Format ``v`` by kind: 'count', 'pct', 'bytes', 'duration' / 'time', 'rate'."""
    if fmt == "pct":
        return fmt_pct(v)
    if fmt == "bytes":
        return fmt_bytes(v)
    if fmt in ("duration", "time"):
        return fmt_duration(v)
    if fmt == "rate":
        return f"{fmt_count(v)}/s"
    return fmt_count(v)


# ---------------------------------------------------------------------------- ticks


def _nice_step(span: float, n: int) -> float:
    raw = span / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw * (1 - 1e-9):
            return m * mag
    return 10 * mag


_TIME_STEPS = (60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 10800, 14400, 21600, 43200, 86400, 172800,
               432000, 864000)


def linear_ticks(lo: float, hi: float, n: int = 5, fmt: str = "count") -> tuple:
    """Tick values and a formatter for the axis [lo, hi] (``fmt`` picks units and round steps)."""
    if not hi > lo:
        hi = lo + (abs(lo) or 1.0)
    if fmt == "bytes":
        div, unit = byte_unit(max(abs(lo), abs(hi)))
        step = _nice_step((hi - lo) / div, n) * div

        def label(v):
            return f"{_g(v / div)} {unit}" if v else "0"
    elif fmt == "time" and hi - lo > 300:
        raw = (hi - lo) / n
        step = next((s for s in _TIME_STEPS if s >= raw), _nice_step(hi - lo, n))

        def label(v):
            if step >= 3600:
                return f"{_g(v / 3600)} h"
            return f"{_g(v / 60)} min"
    else:
        step = _nice_step(hi - lo, n)
        if fmt == "pct":
            def label(v):
                return f"{_g(v * 100)}%"
        elif fmt in ("time", "duration"):
            def label(v):
                return fmt_duration(v)
        elif fmt == "rate":
            def label(v):
                return fmt_count(v)
        else:
            label = fmt_count
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9 and len(ticks) < 50:
        ticks.append(0.0 if abs(t) < step * 1e-9 else t)
        t = first + len(ticks) * step
    return ticks, label, step


def log_ticks(lo: float, hi: float, max_labels: int = 7) -> list:
    """Ticks of a log axis over [lo, hi]: 1x, 2x and 5x powers of ten, or only the powers when too many."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))

    def within(mults):
        return [m * 10.0 ** e for e in range(a, b + 1) for m in mults
                if lo * (1 - 1e-9) <= m * 10.0 ** e <= hi * (1 + 1e-9)]

    ticks = within((1, 2, 5))
    if len(ticks) > max_labels:
        ticks = within((1,))
    return ticks


def nice_max(hi: float, fmt: str = "count") -> float:
    """The axis top for data reaching ``hi``: the next tick at or above it."""
    if not hi > 0:
        return 1.0
    _, _, step = linear_ticks(0.0, hi, 5, fmt)
    return math.ceil(hi / step - 1e-9) * step


# ---------------------------------------------------------------------------- paths


def _simplify(px: np.ndarray, py: np.ndarray):
    """Drop repeated pixels and the middle of straight horizontal or vertical runs."""
    if len(px) < 3:
        return px, py
    keep = np.ones(len(px), dtype=bool)
    same = (px[1:] == px[:-1]) & (py[1:] == py[:-1])
    keep[1:][same] = False
    px, py = px[keep], py[keep]
    if len(px) < 3:
        return px, py
    mid = ((py[:-2] == py[1:-1]) & (py[1:-1] == py[2:])) | ((px[:-2] == px[1:-1]) & (px[1:-1] == px[2:]))
    keep = np.ones(len(px), dtype=bool)
    keep[1:-1] = ~mid
    return px[keep], py[keep]


def _points(px: np.ndarray, py: np.ndarray) -> str:
    return "L".join(f"{a:.1f},{b:.1f}" for a, b in zip(px.tolist(), py.tolist()))


def path_d(px: np.ndarray, py: np.ndarray) -> str:
    """An SVG path through pixel points (rounded to 0.1 px, simplified)."""
    if len(px) == 0:
        return ""
    px, py = _simplify(np.round(px, 1), np.round(py, 1))
    return "M" + _points(px, py)


def step_xy(px: np.ndarray, py: np.ndarray):
    """Points of a step line holding each value until the next x."""
    if len(px) < 2:
        return px, py
    return np.repeat(px, 2)[1:], np.repeat(py, 2)[:-1]


class _Scale:
    def __init__(self, d0, d1, p0, p1, log=False):
        self.log = log
        if log:
            d0, d1 = math.log10(d0), math.log10(d1)
        if not d1 > d0:
            d1 = d0 + 1.0
        self.d0, self.d1, self.p0, self.p1 = d0, d1, p0, p1

    def __call__(self, v):
        v = np.asarray(v, dtype=np.float64)
        if self.log:
            v = np.log10(np.maximum(v, 1e-300))
        return self.p0 + (v - self.d0) / (self.d1 - self.d0) * (self.p1 - self.p0)


# ---------------------------------------------------------------------------- charts


def _legend(items: list, x0: float, y: float, right: float) -> str:
    """One row (wrapping) of legend entries; ``items`` are (series index or None, name, color, style)."""
    out, x, row = [], x0, 0
    for idx, name, color, style in items:
        w = 18 + len(name) * CHAR_W + 14
        if x + w > right and x > x0:
            x, row = x0, row + 1
        yy = y + row * 15
        attrs = f' class="lg" data-series="{idx}" tabindex="0" role="button"' if idx is not None else ' class="lg-ref"'
        if style == "band":
            sw = f'<rect x="{x:.1f}" y="{yy - 8:.1f}" width="12" height="10" fill="{color}" fill-opacity="0.3"/>' \
                 f'<line x1="{x:.1f}" y1="{yy - 3:.1f}" x2="{x + 12:.1f}" y2="{yy - 3:.1f}" stroke="{color}" ' \
                 f'stroke-width="2"/>'
        elif style == "area":
            sw = f'<rect x="{x:.1f}" y="{yy - 8:.1f}" width="12" height="10" fill="{color}" fill-opacity="0.55"/>'
        elif style == "points":
            sw = f'<circle cx="{x + 6:.1f}" cy="{yy - 3:.1f}" r="3.6" fill="{color}"/>'
        else:
            dash = ' stroke-dasharray="4 3"' if style == "dash" else ""
            sw = f'<line x1="{x:.1f}" y1="{yy - 3:.1f}" x2="{x + 12:.1f}" y2="{yy - 3:.1f}" stroke="{color}" ' \
                 f'stroke-width="2.2"{dash}/>'
        out.append(f'<g{attrs}>{sw}<text x="{x + 17:.1f}" y="{yy:.1f}">{escape(name)}</text></g>')
        x += w
    return "".join(out), row + 1


def line_chart(series: list, *, title: str, chart_id: str, xfmt: str = "time", yfmt: str = "count",
               xlabel: str = "", ylabel: str = "", xlim=None, ylim=None, xlog: bool = False,
               refs: list = (), xrefs: list = (), note: str = "", width: int = WIDTH, height: int = HEIGHT) -> str:
    """A chart of one or more series sharing an x and a y axis.

    Parameters
    ----------
    series : list of Series
    title : str
        Accessible name of the chart.
    chart_id : str
        Unique within the document (clip path ids).
    xfmt, yfmt : str
        Axis formats: 'time' (simulated seconds), 'duration', 'count', 'pct', 'bytes', 'rate'.
    xlim, ylim : (lo, hi), optional
        Axis ranges (default: the data's, y from zero, rounded up to a tick).
    xlog : bool
        Logarithmic x axis (positive x only).
    refs : list of Ref
        Horizontal reference lines.
    xrefs : list of XRef
        Vertical reference lines (inside the x range: the range grows to hold them).
    note : str
        Text drawn in the plot when there is nothing to draw.
    """
    items = []
    for i, s in enumerate(series):
        style = s.kind if s.kind in ("band", "area", "points") else "dash" if s.dash else "line"
        items.append((i, s.name, _c(s.color), style))
    for r in list(refs) + list(xrefs):
        items.append((None, r.label, _c(r.color), "dash"))
    ml, mr, mb = 64, 18, 40
    legend_svg, rows = _legend(items, ml, 16, width - mr)
    mt = 14 + rows * 15 + 8
    px0, px1, py0, py1 = ml, width - mr, height - mb, mt

    xs = [s.x for s in series if len(s.x)]
    ys = [v for s in series for v in (s.y, s.hi) if v is not None and len(v)]
    if xlim is None:
        if xs:
            lo = min(float(np.min(x)) for x in xs)
            hi = max(float(np.max(x)) for x in xs)
        else:
            lo, hi = (1.0, 10.0) if xlog else (0.0, 1.0)
        for r in xrefs:
            lo, hi = min(lo, r.x), max(hi, r.x)
        xlim = (lo, hi)
    x0, x1 = xlim
    if xlog:
        x0 = max(x0, 1e-12)
        x1 = max(x1, x0 * 10)
        x0, x1 = x0 / 1.15, x1 * 1.15
    elif not x1 > x0:
        x1 = x0 + 1.0
    if ylim is None:
        top = max([float(np.nanmax(y)) for y in ys if np.isfinite(y).any()] + [r.y for r in refs] + [0.0])
        ylim = (0.0, nice_max(top * 1.02 if top > 0 else 0, yfmt))
    y0, y1 = ylim
    sx = _Scale(x0, x1, px0, px1, xlog)
    sy = _Scale(y0, y1, py0, py1)

    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" '
             f'id="{escape(chart_id)}" data-xfmt="{xfmt}" data-yfmt="{yfmt}" data-xlog="{int(xlog)}" '
             f'data-x0="{sx.d0!r}" data-x1="{sx.d1!r}" data-y0="{y0!r}" data-y1="{y1!r}" '
             f'data-px0="{px0}" data-px1="{px1}" data-py0="{py0}" data-py1="{py1}">',
             f"<title>{escape(title)}</title>",
             f'<defs><clipPath id="clip-{escape(chart_id)}"><rect x="{px0}" y="{py1 - 2}" width="{px1 - px0}" '
             f'height="{py0 - py1 + 4}"/></clipPath></defs>']
    # grid and axes
    grid, labels = [], []
    yt, ylab, _ = linear_ticks(y0, y1, 5, yfmt)
    for t in yt:
        y = float(sy(t))
        grid.append(f'<line x1="{px0}" y1="{y:.1f}" x2="{px1}" y2="{y:.1f}"/>')
        labels.append(f'<text x="{px0 - 6}" y="{y + 3.5:.1f}" text-anchor="end">{escape(ylab(t))}</text>')
    if xlog:
        xt = log_ticks(10 ** sx.d0, 10 ** sx.d1, max(3, int((px1 - px0) / 55)))
        xlab = fmt_duration if xfmt in ("duration", "time") else (lambda v: fmt_value(v, xfmt))
    else:
        xt, xlab, _ = linear_ticks(x0, x1, max(3, int((px1 - px0) / 90)), xfmt)
    for t in xt:
        x = float(sx(t))
        if x < px0 - 0.5 or x > px1 + 0.5:
            continue
        grid.append(f'<line x1="{x:.1f}" y1="{py1}" x2="{x:.1f}" y2="{py0}"/>')
        labels.append(f'<text x="{x:.1f}" y="{py0 + 15}" text-anchor="middle">{escape(xlab(t))}</text>')
    parts.append(f'<g class="grid">{"".join(grid)}</g>')
    parts.append(f'<g class="axis"><line x1="{px0}" y1="{py0}" x2="{px1}" y2="{py0}"/>'
                 f'<line x1="{px0}" y1="{py1}" x2="{px0}" y2="{py0}"/>{"".join(labels)}')
    if xlabel:
        parts.append(f'<text class="axis-label" x="{px1}" y="{height - 6}" text-anchor="end">{escape(xlabel)}</text>')
    if ylabel:
        parts.append(f'<text class="axis-label" x="{6}" y="{height - 6}" text-anchor="start">'
                     f'{escape(ylabel)}</text>')
    parts.append("</g>")
    # series
    body = []
    for i, s in enumerate(series):
        color = _c(s.color)
        x = sx(s.x)
        y = sy(s.y)
        g = [f'<g class="series" data-series="{i}" clip-path="url(#clip-{escape(chart_id)})">']
        if s.kind == "band" and s.lo is not None and s.hi is not None and len(x):
            lo, hi = np.round(sy(s.lo), 1), np.round(sy(s.hi), 1)
            xr = np.round(x, 1)
            d = "M" + _points(xr, hi) + "L" + _points(xr[::-1], lo[::-1]) + "Z"
            g.append(f'<path class="band" d="{d}" fill="{color}" fill-opacity="{s.fill_opacity}" stroke="none"/>')
        if s.kind == "points":
            for k in range(len(x)):
                if not (np.isfinite(x[k]) and np.isfinite(y[k])):
                    continue
                tip = f"<title>{escape(s.labels[k])}</title>" if s.labels is not None else ""
                g.append(f'<circle class="pt" cx="{x[k]:.1f}" cy="{y[k]:.1f}" r="3.6" fill="{color}">{tip}</circle>')
            g.append("</g>")
            body.append("".join(g))
            continue
        if s.kind == "step":
            x, y = step_xy(x, y)
        if s.kind == "area" and len(x):
            base = float(sy(max(y0, 0.0)))
            px, py = _simplify(np.round(x, 1), np.round(y, 1))
            d = f"M{px[0]:.1f},{base:.1f}L" + _points(px, py) + f"L{px[-1]:.1f},{base:.1f}Z"
            g.append(f'<path class="area" d="{d}" fill="{color}" fill-opacity="{s.fill_opacity}" stroke="none"/>')
        d = path_d(x, y) if s.width > 0 else ""
        if d:
            dash = ' stroke-dasharray="5 3"' if s.dash else ""
            hover = f' data-name="{escape(s.name)}"' if s.hover else ""
            g.append(f'<path class="ln{" hv" if s.hover else ""}" d="{d}" fill="none" stroke="{color}" '
                     f'stroke-width="{s.width}"{dash}{hover}/>')
        g.append("</g>")
        body.append("".join(g))
    for r in refs:
        if y0 <= r.y <= y1:
            y = float(sy(r.y))
            body.append(f'<g class="ref"><line x1="{px0}" y1="{y:.1f}" x2="{px1}" y2="{y:.1f}" stroke="{_c(r.color)}" '
                        f'stroke-dasharray="5 4" stroke-width="1.2"/></g>')
    for r in xrefs:
        x = float(sx(r.x))
        if px0 - 0.5 <= x <= px1 + 0.5:
            body.append(f'<g class="ref"><line x1="{x:.1f}" y1="{py1}" x2="{x:.1f}" y2="{py0}" stroke="{_c(r.color)}" '
                        f'stroke-dasharray="5 4" stroke-width="1.2"/></g>')
    parts.append("".join(body))
    if note:
        parts.append(f'<text class="note" x="{(px0 + px1) / 2:.1f}" y="{(py0 + py1) / 2:.1f}" '
                     f'text-anchor="middle">{escape(note)}</text>')
    parts.append(f'<g class="legend">{legend_svg}</g>')
    parts.append(f'<line class="xh" x1="{px0}" y1="{py1}" x2="{px0}" y2="{py0}" visibility="hidden"/>')
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(categories: list, groups: list, *, title: str, chart_id: str, fmt: str = "count",
              width: int = WIDTH, max_label: int = 30) -> str:
    """Horizontal grouped bars: one row per category, one bar per group.

    Parameters
    ----------
    categories : list of str
        Row labels (long ones are shortened; the full text is in the tooltip).
    groups : list of (name, values, color)
        ``values`` has one number (or None) per category.
    fmt : str
        Value format ('count', 'pct', 'bytes', 'duration', 'rate').
    """
    bar_h, gap = 13, 9
    ng = max(len(groups), 1)
    row_h = ng * bar_h + gap
    labels = [c if len(c) <= max_label else c[: max_label - 1] + "…" for c in categories]
    ml = int(min(max((len(t) for t in labels), default=4) * CHAR_W + 16, width * 0.42))
    mr = 70
    items = [(i, name, _c(color), "area") for i, (name, _, color) in enumerate(groups)]
    legend_svg, rows = _legend(items, ml, 16, width - mr) if len(groups) > 1 else ("", 0)
    mt = 14 + rows * 15 + 6 if rows else 12
    mb = 30
    height = int(mt + len(categories) * row_h + mb)
    px0, px1 = ml, width - mr
    vals = [v for _, values, _ in groups for v in values if v is not None and math.isfinite(v)]
    top = nice_max(max(vals + [0.0]) * 1.02, fmt) if vals else 1.0
    if fmt == "pct" and vals and max(vals) <= 1.0:
        top = min(top, 1.0)
    sx = _Scale(0.0, top, px0, px1)
    parts = [f'<svg class="chart bars" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" '
             f'id="{escape(chart_id)}">', f"<title>{escape(title)}</title>"]
    grid, ticklabels = [], []
    ticks, lab, _ = linear_ticks(0.0, top, 5, fmt)
    for t in ticks:
        x = float(sx(t))
        grid.append(f'<line x1="{x:.1f}" y1="{mt - 4}" x2="{x:.1f}" y2="{height - mb}"/>')
        ticklabels.append(f'<text x="{x:.1f}" y="{height - mb + 15}" text-anchor="middle">{escape(lab(t))}</text>')
    parts.append(f'<g class="grid">{"".join(grid)}</g>')
    parts.append(f'<g class="axis"><line x1="{px0}" y1="{mt - 4}" x2="{px0}" y2="{height - mb}"/>'
                 f'{"".join(ticklabels)}')
    for k, (full, text) in enumerate(zip(categories, labels)):
        yc = mt + k * row_h + (ng * bar_h) / 2
        parts.append(f'<text x="{px0 - 8}" y="{yc + 4:.1f}" text-anchor="end"><title>{escape(full)}</title>'
                     f'{escape(text)}</text>')
    parts.append("</g>")
    for gi, (name, values, color) in enumerate(groups):
        g = [f'<g class="series" data-series="{gi}">']
        for k, v in enumerate(values):
            y = mt + k * row_h + gi * bar_h
            shown = fmt_value(v, fmt) if v is not None else "-"
            w = float(sx(v)) - px0 if v is not None and math.isfinite(v) else 0.0
            g.append(f'<rect class="bar" x="{px0}" y="{y + 1}" width="{max(w, 0.0):.1f}" height="{bar_h - 2}" '
                     f'fill="{_c(color)}"><title>{escape(categories[k])}: {escape(name)} {escape(shown)}</title>'
                     f'</rect><text class="val" x="{px0 + max(w, 0.0) + 4:.1f}" y="{y + bar_h - 3}">'
                     f'{escape(shown)}</text>')
        g.append("</g>")
        parts.append("".join(g))
    if legend_svg:
        parts.append(f'<g class="legend">{legend_svg}</g>')
    parts.append("</svg>")
    return "".join(parts)


__all__ = ["COLORS", "Ref", "SERIES_CYCLE", "SLO_COLOR", "Series", "bar_chart", "fmt_bytes", "fmt_count", "fmt_duration",
           "fmt_pct", "fmt_value", "line_chart", "linear_ticks", "log_ticks", "nice_max", "path_d", "step_xy"]
