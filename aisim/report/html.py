"""The report as one self-contained HTML document.

:func:`render` turns a :class:`~aisim.report.data.RunData` into HTML: the run's
header, a summary table (one row per shard), comparison bars across shards,
and one section per (model, engine) shard with its headline numbers and
charts (with speculative decoding, the panel of :mod:`aisim.report.spec`; with a KV offload tier,
:mod:`aisim.report.offload`'s; for a deployment, the
replicas' balance of :mod:`aisim.report.replicas`).  CSS and the small script (hover values, legend toggles) are inline;
the page loads nothing (its Content-Security-Policy forbids every fetch).

Numbers are computed on the full data: the summary table shows the landed
``summaries`` rows, the CDF percentiles and totals come from every request
and step; only the drawn series are reduced (:mod:`aisim.report.downsample`).
"""

from __future__ import annotations

import json
import math
from html import escape

import numpy as np

from aisim.report import downsample as ds
from aisim.report.data import RunData, ShardData
from aisim.report.replicas import replica_panel
from aisim.report.offload import offload_comparison, offload_panel
from aisim.report.spec import spec_comparison, spec_panel
from aisim.report.svg import (SERIES_CYCLE, Ref, Series, XRef, bar_chart, fmt_bytes, fmt_count, fmt_duration, fmt_pct,
                              line_chart)
from aisim.report.sweep import sweep_section

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"

LATENCY_LABELS = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}
LATENCY_TITLES = {"ttft_s": "time to first token", "tpot_s": "time per output token (after the first)",
                  "e2e_s": "end-to-end latency"}


def _num(v):
    """A JSON/HTML-safe number (None for NULL and non-finite)."""
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _cell(key: str, value, text: str, cls: str = "num") -> str:
    v = _num(value)
    data = "" if v is None else f' data-value="{v!r}"'
    return f'<td class="{cls}" data-key="{escape(key)}"{data}>{escape(text)}</td>'


def _ms(v) -> str:
    return fmt_duration(_num(v)) if _num(v) is not None else "-"


# ---------------------------------------------------------------------------- page parts


def _header(rd: RunData) -> str:
    r = rd.run
    if "folders" in r:  # replays read from their output folders (aisim.report.folder), not a database
        rows = [("replay output", f) for f in r["folders"]] + [("report by", f"aisim {r['aisim_version']}")]
        body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in rows)
        return f'<table class="meta">{body}</table>'
    rows = [("run", f"{r['name']}  ·  id {r['run_id']}  ·  #{r['run_seq']} in the database"),
            ("database", rd.database)]
    if r.get("description"):
        rows.append(("description", r["description"]))
    rows.append(("chosen by", rd.note))
    landed = r.get("landed_at")
    if landed is not None:
        rows.append(("landed", landed.strftime("%Y-%m-%d %H:%M:%S %Z").strip() if hasattr(landed, "strftime")
                     else str(landed)))
    how = []
    if r.get("scheduler"):
        how.append(f"scheduler {r['scheduler']}")
    if r.get("workers"):
        how.append(f"{r['workers']} worker{'s' if r['workers'] != 1 else ''}")
    if _num(r.get("wall_s")) is not None:
        how.append(f"wall {fmt_duration(r['wall_s'])}")
    if r.get("aisim_version"):
        how.append(f"aisim {r['aisim_version']}")
    if how:
        rows.append(("replayed with", ", ".join(how)))
    reads = [f"{fmt_count(r.get('rows_read'))} trace rows read"]
    if r.get("rows_in_window") is not None and r.get("rows_in_window") != r.get("rows_read"):
        reads.append(f"{fmt_count(r['rows_in_window'])} in the time window")
    if r.get("rows_skipped"):
        reads.append(f"{fmt_count(r['rows_skipped'])} skipped (model without a deployment)")
    rows.append(("input", "; ".join(reads)))
    try:
        inputs = json.loads(r.get("inputs") or "[]")
    except ValueError:
        inputs = []
    if inputs:
        rows.append(("input files", ", ".join(f"{i.get('path')} ({i.get('format')}, {fmt_count(i.get('size'))} B)"
                                              for i in inputs)))
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in rows)
    return f'<table class="meta">{body}</table>'


SUMMARY_COLUMNS = [
    # key, header, formatter, tooltip
    ("requests", "requests", fmt_count, "requests in the shard's trace share"),
    ("finished", "finished", fmt_count, "requests that finished"),
    ("steps", "steps", fmt_count, "engine steps"),
    ("duration_s", "duration", _ms, "from the first send to the last response"),
    ("throughput_req_s", "req/s", lambda v: fmt_count(_round(v)), "finished requests per second"),
    ("throughput_tok_s", "out tok/s", lambda v: fmt_count(_round(v)), "output tokens per second"),
    ("ttft_p50_s", "TTFT p50", _ms, "time to first token, median"),
    ("ttft_p99_s", "TTFT p99", _ms, "time to first token, 99th percentile"),
    ("tpot_p50_s", "TPOT p50", _ms, "time per output token, median"),
    ("tpot_p99_s", "TPOT p99", _ms, "time per output token, 99th percentile"),
    ("itl_p99_s", "ITL p99", _ms, "inter-token latency (every gap between two streamed outputs), 99th percentile"),
    ("e2e_p50_s", "E2E p50", _ms, "end-to-end latency, median"),
    ("e2e_p99_s", "E2E p99", _ms, "end-to-end latency, 99th percentile"),
    ("prefix_hit_rate", "prefix hits", fmt_pct, "prefix-cache hit tokens / lookup tokens (vLLM)"),
    ("preemptions", "preempt.", fmt_count, "preemptions, all requests"),
    ("kv_usage_max", "KV active peak", fmt_pct, "peak of active blocks / usable blocks (kv_usage)"),
    ("kv_physical_usage_max", "KV physical peak", fmt_pct, "peak of (active + cached) blocks / usable blocks"),
]


def _round(v):
    v = _num(v)
    if v is None:
        return None
    return round(v, 1) if abs(v) < 100 else round(v)


def _summary_table(rd: RunData) -> str:
    head = "".join(f'<th title="{escape(tip)}">{escape(h)}</th>' for _, h, _, tip in SUMMARY_COLUMNS)
    rows = []
    for sd in rd.shards:
        s = sd.summary
        cells = [f'<td class="num">{sd.shard_id}</td>',
                 f'<td class="txt"><a href="#shard-{sd.shard_id}">{escape(sd.label)}</a></td>']
        for key, _, f, _ in SUMMARY_COLUMNS:
            v = s.get(key)
            cells.append(_cell(key, v, f(v) if v is not None else "-"))
        rows.append(f'<tr data-shard="{sd.shard_id}">{"".join(cells)}</tr>')
    return ('<div class="scroll"><table class="summary sortable" id="summary"><thead><tr><th>#</th>'
            f'<th>model / engine</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>')


def _comparison(rd: RunData) -> str:
    shards = [sd for sd in rd.shards if sd.summary]
    if len(shards) < 2:
        return ""
    cats = [sd.label for sd in shards]
    S = [sd.summary for sd in shards]
    charts = [
        ("Output throughput (tokens/s)", bar_chart(cats, [("output tok/s", [_num(s.get("throughput_tok_s")) for s in S],
                                                          "blue")], title="Output throughput by shard",
                                                   chart_id="cmp-throughput", fmt="count")),
        ("TTFT: median and 99th percentile", bar_chart(cats, [("p50", [_num(s.get("ttft_p50_s")) for s in S], "sky"),
                                                             ("p99", [_num(s.get("ttft_p99_s")) for s in S], "blue")],
                                                       title="TTFT by shard", chart_id="cmp-ttft", fmt="duration")),
        ("Prefix-cache hit rate", bar_chart(cats, [("hit rate", [_num(s.get("prefix_hit_rate")) for s in S], "green")],
                                            title="Prefix-cache hit rate by shard", chart_id="cmp-prefix", fmt="pct")),
        ("KV-cache peak usage", bar_chart(cats, [("active", [_num(s.get("kv_usage_max")) for s in S], "blue"),
                                                 ("physical", [_num(s.get("kv_physical_usage_max")) for s in S],
                                                  "orange")],
                                          title="KV-cache peak usage by shard", chart_id="cmp-kv", fmt="pct")),
    ]
    figs = "".join(f'<figure class="card"><figcaption>{escape(t)}</figcaption>{c}</figure>' for t, c in charts)
    return (f'<h2 id="compare">Shards compared</h2><div class="grid compare">{figs}</div>'
            + spec_comparison(rd) + offload_comparison(rd))


# ---------------------------------------------------------------------------- one shard


def _engine_line(sd: ShardData) -> str:
    c = sd.config
    bits = []
    if sd.shard.get("vllm_version"):
        bits.append(f"vLLM {sd.shard['vllm_version']} rules")
    if sd.usable_blocks is not None:
        blk = f"{sd.usable_blocks:,} usable blocks"
        if c.get("block_size"):
            blk += f" × {c['block_size']} tokens"
        if sd.block_bytes:
            blk += f" ({fmt_bytes(sd.block_bytes)} each, {fmt_bytes(sd.block_bytes * sd.usable_blocks)} in all)"
        bits.append(blk)
    for k in ("max_num_seqs", "max_num_batched_tokens"):
        if c.get(k) is not None:
            bits.append(f"{k} {c[k]:,}" if isinstance(c[k], int) else f"{k} {c[k]}")
    if "enable_prefix_caching" in c:
        bits.append("prefix caching " + ("on" if c["enable_prefix_caching"] else "off"))
    if c.get("enable_chunked_prefill") is not None:
        bits.append("chunked prefill " + ("on" if c["enable_chunked_prefill"] else "off"))
    if c.get("async_scheduling"):
        bits.append("async scheduling")
    groups = c.get("resolved_groups") or c.get("kv_cache_groups") or []
    if groups:
        kinds = [g.get("type", "?") + (f"×{g['count']}" if (g.get("count") or 1) > 1 else "") for g in groups]
        bits.append("KV-cache groups: " + " + ".join(kinds))
    if c.get("time_model"):
        bits.append(_time_model_text(c["time_model"]))
    if sd.shard.get("clock"):
        bits.append("arrivals by " + ("engine step" if sd.shard["clock"] == "step" else "time"))
    if sd.deployment:
        bits.append(f"deployment: {sd.shard['replicas']} replicas of this engine behind the {sd.shard['router']} "
                    "router (the charts below draw every replica's steps by start time)")
    return " · ".join(bits)


def _time_model_text(tm: dict) -> str:
    """The shard's step times and the calibration whose held-out errors say how far to trust them."""
    from aisim.config.calibration import DEFAULT_CALIBRATION, STEP_METRICS

    kind = tm.get("kind")
    if kind != "roofline":
        return f"step times: {kind} model (no calibration)"
    cal = tm.get("calibration") or DEFAULT_CALIBRATION
    text = f"step times: roofline of {tm.get('model') or 'the model'} on {tm.get('tp', 1)} × {tm.get('gpu')}, " \
           f"calibration '{cal['name']}'"
    errs = [(m, cal["held_out"][m]) for m in STEP_METRICS if m in cal.get("held_out", {})]
    if errs:
        m, e = errs[0]
        q = cal["quantiles"]
        text += (f" (held-out {m.upper()} errors {100 * e[0]:+.0f}% to {100 * e[-1]:+.0f}% at quantiles "
                 f"{q[0]:g}-{q[-1]:g})")
    if tm.get("time_scale", 1.0) != 1.0:
        text += f", every step × {tm['time_scale']:g}"
    return text


def _stat(label: str, value: str, sub: str = "", key: str = "", raw=None) -> str:
    v = _num(raw)
    data = (f' data-key="{escape(key)}"' if key else "") + ("" if v is None else f' data-value="{v!r}"')
    sub_html = f'<div class="sub">{escape(sub)}</div>' if sub else ""
    return (f'<div class="stat"{data}><div class="lab">{escape(label)}</div>'
            f'<div class="val">{escape(value)}</div>{sub_html}</div>')


def _stats(sd: ShardData) -> str:
    s = sd.summary
    st = sd.steps
    rq = sd.requests
    n = sd.n_requests
    fin = sd.status.get("finished", 0)
    out = [_stat("requests finished", f"{fin:,} / {n:,}",
                 ", ".join(f"{v:,} {k}" for k, v in sd.status.items() if k != "finished") or "all finished",
                 "finished", fin)]
    empty = s.get("empty_steps")
    n_steps = s.get("steps") if s.get("steps") is not None else sd.n_steps
    out.append(_stat("engine steps", fmt_count(n_steps), f"{fmt_count(empty)} empty" if empty is not None else "",
                     "steps", n_steps))
    out.append(_stat("duration", _ms(s.get("duration_s")), "first send to last response",
                     "duration_s", s.get("duration_s")))
    out.append(_stat("throughput", f"{fmt_count(_round(s.get('throughput_tok_s')))} tok/s",
                     f"{fmt_count(_round(s.get('throughput_req_s')))} req/s; output tokens",
                     "throughput_tok_s", s.get("throughput_tok_s")))
    for name in ("ttft_s", "tpot_s", "e2e_s"):
        v = sd.latencies(name)
        if v.size:
            p50, p90, p99 = np.percentile(v, [50, 90, 99])
            out.append(_stat(f"{LATENCY_LABELS[name]} p50", fmt_duration(p50),
                             f"p90 {fmt_duration(p90)} · p99 {fmt_duration(p99)}", f"{name[:-2]}_p50_s", p50))
        else:
            out.append(_stat(f"{LATENCY_LABELS[name]} p50", "-", "no values", f"{name[:-2]}_p50_s"))
    pq, ph = np.nansum(st["prefix_queries"]), np.nansum(st["prefix_hits"])
    rate = ph / pq if pq else None
    with_hit = int((rq["cached_tokens"] > 0).sum()) if n else 0
    out.append(_stat("prefix-cache hit rate", fmt_pct(rate) if rate is not None else "-",
                     f"{fmt_count(ph)} of {fmt_count(pq)} lookup tokens; {fmt_pct(with_hit / n) if n else '-'} of "
                     f"requests hit", "prefix_hit_rate", rate))
    pre = int(np.nansum(st["num_preempted"]))
    victims = int((rq["preemptions"] > 0).sum()) if n else 0
    out.append(_stat("preemptions", fmt_count(pre), f"{fmt_count(victims)} requests preempted at least once",
                     "preemptions", pre))
    if sd.n_steps:
        amax, pmax = np.nanmax(st["kv_usage"]), np.nanmax(st["physical_usage"])
        amean = np.nanmean(st["kv_usage"])
        sub = f"mean active {fmt_pct(amean)}; physical peak {fmt_pct(pmax)}"
        if sd.has_bytes:
            peak_b = np.nanmax(st["kv_cache_active_bytes"] + st["kv_cache_cached_bytes"])
            sub += f" ({fmt_bytes(peak_b)})"
        out.append(_stat("KV-cache active peak", fmt_pct(amax), sub, "kv_usage_max", amax))
        out.append(_stat("queues, peak", f"{fmt_count(np.nanmax(st['running']))} running",
                         f"{fmt_count(np.nanmax(st['waiting']))} waiting at most", "running_max",
                         np.nanmax(st["running"])))
    return f'<div class="stats">{"".join(out)}</div>'


def _fig(title: str, svg: str, caption: str = "", cls: str = "") -> str:
    cap = f'<p class="cap">{escape(caption)}</p>' if caption else ""
    return f'<figure class="card {cls}"><figcaption>{escape(title)}</figcaption>{svg}{cap}</figure>'


def _drawn(n: int, shown: int, how: str) -> str:
    if n <= shown:
        return f"{n:,} steps, all drawn"
    return f"{n:,} steps drawn as {shown:,} points ({how}); numbers use every step"


def cdf_chart(curves: list, name: str, title: str, chart_id: str, slo: dict, mp: int, **size) -> str:
    """The CDFs of ``curves`` (``(label, values, color)``) of latency ``name`` on one chart, the SLO drawn.

    A log x axis when the values span more than 30x; p50/p90/p99 as horizontal lines, the SLO's
    threshold for ``name`` (if any) as a vertical one.
    """
    drawn = []
    for label, v, color in curves:
        x, p = ds.cdf(v, mp)
        drawn.append((label, x, p, color))
    pos = np.concatenate([x[x > 0] for _, x, _, _ in drawn]) if drawn else np.zeros(0)
    xlog = bool(pos.size and pos.max() / pos.min() > 30)
    series = [Series(label, x[x > 0] if xlog else x, p[x > 0] if xlog else p, color, "step", width=1.8)
              for label, x, p, color in drawn]
    xrefs = [XRef(slo[name], f"SLO {fmt_duration(slo[name])}")] if slo.get(name) else []
    return line_chart(series, title=title, chart_id=chart_id, xfmt="duration", yfmt="pct", ylim=(0.0, 1.0),
                      xlog=xlog,
                      refs=[Ref(0.5, "p50", "lightgrey"), Ref(0.9, "p90", "grey"), Ref(0.99, "p99", "darkgrey")],
                      xrefs=xrefs, xlabel=LATENCY_TITLES[name] + (" (log scale)" if xlog else ""), ylabel="requests",
                      note="" if any(len(v) for _, v, _ in curves) else "no values", **size)


def _overlay(rd: RunData, mp: int) -> str:
    """Every shard's TTFT, TPOT and E2E CDFs on one chart each, the SLO drawn (two shards or more, or an SLO)."""
    shards = [sd for sd in rd.shards if sd.n_requests]
    if not shards or (len(shards) < 2 and not rd.slo):
        return ""
    figs = []
    for name, lab in LATENCY_LABELS.items():
        curves = [(f"{sd.shard_id}: {sd.label}", sd.latencies(name), SERIES_CYCLE[i % len(SERIES_CYCLE)])
                  for i, sd in enumerate(shards)]
        svg = cdf_chart(curves, name, f"{lab} CDF, every shard", f"cdf-all-{name[:-2]}", rd.slo, mp)
        cap = f"SLO {lab} {fmt_duration(rd.slo[name])}" if rd.slo.get(name) else "no SLO threshold for this latency"
        figs.append(_fig(f"{lab} CDF, every shard", svg, cap))
    return f'<h2 id="latencies">Latency distributions, every shard</h2><div class="grid compare">{"".join(figs)}</div>'


def _charts(sd: ShardData, mp: int, slo: dict) -> list:
    """The shard's figures, in page order."""
    st = sd.steps
    sid = sd.shard_id
    n = sd.n_steps
    t = st["clock_s"]
    end = float(np.nanmax(t + np.nan_to_num(st["duration_s"]))) if n else 1.0
    t0 = float(np.nanmin(t)) if n else 0.0
    xlim = (min(t0, 0.0), end if end > 0 else 1.0)
    figs = []

    # KV-cache occupancy: active area, cached band above it, physical line.
    x, (act, phys) = ds.m4_shared(t, [st["kv_usage"], st["physical_usage"]], mp)
    svg = line_chart([
        Series("active", x, act, "blue", "area", fill_opacity=0.45),
        Series("cached (free, reusable)", x, phys, "orange", "band", lo=act, hi=phys, width=0, fill_opacity=0.45,
               hover=False),
        Series("physical = active + cached", x, phys, "black", "line", width=1.2),
    ], title=f"KV-cache occupancy, shard {sid}", chart_id=f"kv-usage-{sid}", yfmt="pct",
        ylim=(0.0, max(1.0, float(np.nanmax(phys, initial=0.0)))),
        xlim=xlim, xlabel="simulated time", ylabel="share of usable blocks")
    cap = _drawn(n, len(x), "min/max per bucket")
    if sd.usable_blocks:
        cap = f"100% = {sd.usable_blocks:,} usable blocks. " + cap
    figs.append(_fig("KV-cache occupancy", svg, cap))

    if sd.has_bytes:
        ab, cb = st["kv_cache_active_bytes"], st["kv_cache_cached_bytes"]
        x, (a, p) = ds.m4_shared(t, [ab, ab + cb], mp)
        refs = []
        if sd.usable_blocks and sd.block_bytes:
            cap_b = sd.block_bytes * sd.usable_blocks
            refs.append(Ref(cap_b, f"capacity {fmt_bytes(cap_b)}", "grey"))
        svg = line_chart([
            Series("active", x, a, "blue", "area", fill_opacity=0.45),
            Series("cached", x, p, "orange", "band", lo=a, hi=p, width=0, fill_opacity=0.45, hover=False),
            Series("physical", x, p, "black", "line", width=1.2),
        ], title=f"KV-cache bytes, shard {sid}", chart_id=f"kv-bytes-{sid}", yfmt="bytes", xlim=xlim, refs=refs,
            xlabel="simulated time", ylabel="bytes, all KV-cache groups")
        figs.append(_fig("KV-cache bytes (all groups)", svg, _drawn(n, len(x), "min/max per bucket")))

    # Queues.
    xr, run = ds.m4(t, st["running"], mp // 2)
    xw, wait = ds.m4(t, st["waiting"], mp // 2)
    refs = []
    if sd.config.get("max_num_seqs"):
        refs.append(Ref(float(sd.config["max_num_seqs"]), f"max_num_seqs {sd.config['max_num_seqs']}"))
    svg = line_chart([Series("running", xr, run, "blue", "step"), Series("waiting", xw, wait, "red", "step")],
                     title=f"Running and waiting requests, shard {sid}", chart_id=f"queues-{sid}", yfmt="count",
                     xlim=xlim, refs=refs, xlabel="simulated time", ylabel="requests after each step")
    figs.append(_fig("Running and waiting requests", svg, _drawn(n, max(len(xr), len(xw)), "min/max per bucket")))

    # Scheduled tokens per step.
    budget = sd.config.get("max_num_scheduled_tokens") or sd.config.get("max_num_batched_tokens")
    refs = [Ref(float(budget), f"token budget {budget:,}")] if isinstance(budget, int) else []
    if n <= mp:
        series = [Series("prefill", t, st["prefill_tokens"], "purple", "step"),
                  Series("decode", t, st["decode_tokens"], "green", "step")]
        cap = _drawn(n, n, "")
    else:
        xp, plo, phi, pm = ds.band(t, st["prefill_tokens"], mp // 2)
        xd, dlo, dhi, dm = ds.band(t, st["decode_tokens"], mp // 2)
        series = [Series("prefill (mean)", xp, pm, "purple", "band", lo=plo, hi=phi, fill_opacity=0.18),
                  Series("decode (mean)", xd, dm, "green", "band", lo=dlo, hi=dhi, fill_opacity=0.18)]
        cap = (f"{n:,} steps: line = mean per bucket of {n / max(len(xp), 1):,.0f} steps, band = min to max; "
               "numbers use every step")
    svg = line_chart(series, title=f"Scheduled tokens per step, shard {sid}", chart_id=f"tokens-{sid}",
                     yfmt="count", xlim=xlim, refs=refs, xlabel="simulated time", ylabel="tokens per step")
    figs.append(_fig("Scheduled prefill and decode tokens per step", svg, cap))

    # Throughput over time windows (exact sums per window).
    nw = ds.window_count(n)
    edges, pre = ds.windows(t, st["prefill_tokens"], xlim[0], xlim[1], nw)
    _, dec = ds.windows(t, st["decode_tokens"], xlim[0], xlim[1], nw)
    _, fin = ds.windows(t, st["num_finished"], xlim[0], xlim[1], nw)
    w = edges[1] - edges[0]
    hold = lambda v: np.r_[v, v[-1]] / w  # noqa: E731 - a step line over whole windows
    svg = line_chart([Series("prefill tokens/s", edges, hold(pre), "purple", "step"),
                      Series("decode (output) tokens/s", edges, hold(dec), "green", "step")],
                     title=f"Throughput, shard {sid}", chart_id=f"throughput-{sid}", yfmt="rate", xlim=xlim,
                     xlabel="simulated time", ylabel="tokens per second")
    figs.append(_fig("Throughput", svg, f"sums over {nw} windows of {fmt_duration(w)}; "
                                        f"finished requests peak at {fmt_count(_round(fin.max() / w))}/s"))

    # Prefix reuse: hit rate per window, cached blocks over time.
    _, q = ds.windows(t, st["prefix_queries"], xlim[0], xlim[1], nw)
    _, h = ds.windows(t, st["prefix_hits"], xlim[0], xlim[1], nw)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(q > 0, h / np.where(q > 0, q, 1), np.nan)
    mid = (edges[:-1] + edges[1:]) / 2
    ok = np.isfinite(rate)
    xc, cshare = ds.m4(t, st["physical_usage"] - st["kv_usage"], mp // 2)
    total = float(np.nansum(st["prefix_hits"])) / float(np.nansum(st["prefix_queries"]) or 1)
    svg = line_chart([Series("hit rate per window", mid[ok], rate[ok], "green", "line", width=1.8),
                      Series("cached blocks (share of usable)", xc, cshare, "orange", "area", fill_opacity=0.25,
                             width=1.0)],
                     title=f"Prefix reuse, shard {sid}", chart_id=f"prefix-{sid}", yfmt="pct", ylim=(0.0, 1.0),
                     xlim=xlim, refs=[Ref(total, f"whole run {fmt_pct(total)}", "green")],
                     xlabel="simulated time", ylabel="hit tokens / lookup tokens",
                     note="" if ok.any() else "no prefix-cache lookups")
    figs.append(_fig("Prefix-cache reuse", svg, f"hit rate over {nw} windows (tokens hit / tokens looked up); "
                                               "cached blocks are free blocks still holding a reusable prefix"))

    # Preemptions: cumulative, and requests preempted but not resumed yet.
    cp = np.cumsum(np.nan_to_num(st["num_preempted"]))
    out = cp - np.cumsum(np.nan_to_num(st["num_resumed"]))
    xp_, yp = ds.m4(t, cp, mp // 2)
    xo, yo = ds.m4(t, out, mp // 2)
    total_p = int(cp[-1]) if n else 0
    svg = line_chart([Series("preemptions so far", xp_, yp, "red", "step", width=1.8),
                      Series("preempted, not resumed yet", xo, yo, "blue", "step", fill_opacity=0.3)],
                     title=f"Preemptions, shard {sid}", chart_id=f"preempt-{sid}", yfmt="count", xlim=xlim,
                     ylim=None if total_p else (0.0, 5.0), xlabel="simulated time", ylabel="requests",
                     note="" if total_p else "no preemptions")
    victims = int((sd.requests["preemptions"] > 0).sum())
    figs.append(_fig("Preemptions", svg, f"{total_p:,} preemptions of {victims:,} requests; at most "
                                         f"{int(out.max()) if n else 0:,} waiting to resume at once"))

    # Latency CDFs.
    cdfs = []
    for name in LATENCY_LABELS:
        v = sd.latencies(name)
        lab = LATENCY_LABELS[name]
        svg = cdf_chart([(f"{lab} CDF", v, "blue")], name, f"{lab} CDF, shard {sid}", f"cdf-{name[:-2]}-{sid}",
                        slo, mp, width=440, height=260)
        p50, p90, p99 = np.percentile(v, [50, 90, 99]) if v.size else (None, None, None)
        cap = (f"{v.size:,} requests · p50 {fmt_duration(p50)} · p90 {fmt_duration(p90)} · p99 {fmt_duration(p99)}"
               if v.size else "no request has this latency")
        cdfs.append(_fig(f"{lab} CDF", svg, cap, "cdf"))
    return figs, cdfs


# Runs of more shards than this show each shard's charts collapsed (its headline stays in view).
OPEN_SHARDS = 6


def _shard_section(sd: ShardData, mp: int, slo: dict, open_: bool) -> str:
    sid = sd.shard_id
    head = (f'<section class="shard" id="shard-{sid}" data-shard="{sid}"><h2>Shard {sid}: {escape(sd.label)}</h2>'
            f'<p class="engine">{escape(_engine_line(sd))}</p>')
    if sd.n_steps == 0:
        return head + ('<p class="empty">This shard replayed no requests (the model had no rows in this run\'s '
                       "inputs).</p></section>")
    figs, cdfs = _charts(sd, mp, slo)
    return (head + _stats(sd) + f'<details class="charts"{" open" if open_ else ""}><summary>charts and latency '
            f'distributions</summary>' + replica_panel(sd) + f'<div class="grid">{"".join(figs)}</div>' +
            spec_panel(sd, mp) + offload_panel(sd, mp)
            + f'<h3>Latency distributions</h3><div class="grid three">{"".join(cdfs)}</div>'
            '</details></section>')


# ---------------------------------------------------------------------------- document

CSS = """
:root{--fg:#1f2937;--muted:#6b7280;--line:#e5e7eb;--bg:#f6f7f9;--card:#fff;--accent:#0072b2}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,
"Helvetica Neue",Arial,sans-serif}
header.top{background:#111827;color:#f9fafb;padding:18px 28px}
header.top h1{margin:0;font-size:22px;font-weight:600}
header.top .sub{color:#9ca3af;margin-top:2px}
nav{position:sticky;top:0;z-index:5;background:#fff;border-bottom:1px solid var(--line);padding:8px 28px;
font-size:13px;overflow-x:auto;white-space:nowrap}
nav a{color:var(--accent);text-decoration:none;margin-right:18px}
nav a:hover{text-decoration:underline}
main{max-width:1400px;margin:0 auto;padding:8px 28px 40px}
h2{font-size:19px;margin:30px 0 6px;padding-top:6px}
h3{font-size:15px;margin:18px 0 8px;color:#374151}
table.meta{border-collapse:collapse;margin:14px 0 4px;font-size:13px}
table.meta th{text-align:left;color:var(--muted);font-weight:500;padding:2px 16px 2px 0;vertical-align:top;
white-space:nowrap}
table.meta td{padding:2px 0;word-break:break-word}
.scroll{overflow-x:auto;background:var(--card);border:1px solid var(--line);border-radius:8px}
table.summary{border-collapse:collapse;width:100%;font-size:13px;font-variant-numeric:tabular-nums}
table.summary th{background:#f3f4f6;text-align:right;padding:6px 7px;font-weight:600;vertical-align:bottom;
border-bottom:1px solid var(--line);cursor:help;line-height:1.25}
table.summary th:nth-child(2){text-align:left}
table.summary td{padding:6px 7px;border-bottom:1px solid var(--line);white-space:nowrap}
table.summary td.num{text-align:right}
table.summary tbody tr:hover{background:#f9fafb}
table.summary a{color:var(--accent);text-decoration:none;font-weight:500}
table.replicas th:first-child{text-align:left}
table.replicas th:nth-child(2){text-align:right}
table.replicas tr.total td{font-weight:600;border-top:2px solid var(--line)}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:16px}
.grid.three{grid-template-columns:repeat(auto-fit,minmax(360px,1fr))}
.grid.compare{align-items:start}
figure.card{margin:0;background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 12px 8px;
min-width:0}
figure.card figcaption{font-weight:600;font-size:14px;margin-bottom:2px}
figure.card .cap{margin:4px 0 0;color:var(--muted);font-size:12px}
section.shard{border-top:2px solid #d1d5db;margin-top:34px}
p.engine{color:var(--muted);margin:0 0 12px;font-size:13px}
p.empty{background:#fff7ed;border:1px solid #fed7aa;border-radius:8px;padding:10px 14px}
.stats{display:grid;grid-template-columns:repeat(auto-fill,minmax(200px,1fr));gap:10px;margin:0 0 16px}
.stat{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:8px 12px}
.stat .lab{color:var(--muted);font-size:12px}
.stat .val{font-size:20px;font-weight:600;font-variant-numeric:tabular-nums}
.stat .sub{color:var(--muted);font-size:12px}
svg.chart{display:block;width:100%;height:auto;font-family:inherit;font-size:11px;overflow:visible}
svg.chart .grid line{stroke:#eef0f3;stroke-width:1}
svg.chart .axis line{stroke:#9ca3af;stroke-width:1}
svg.chart .axis text{fill:#4b5563}
svg.chart .axis-label{fill:var(--muted);font-size:10.5px}
svg.chart .legend text{fill:#374151}
svg.chart .lg{cursor:pointer}
svg.chart .lg.off{opacity:.35}
svg.chart .lg:focus{outline:none}
svg.chart .lg:focus text{text-decoration:underline}
svg.chart .note{fill:var(--muted);font-size:13px}
svg.chart .val{fill:#374151;font-size:10.5px}
svg.chart line.xh{stroke:#111827;stroke-width:.8;stroke-dasharray:3 3;pointer-events:none}
svg.bars rect.bar:hover{opacity:.8}
.tip{position:absolute;z-index:10;pointer-events:none;background:rgba(17,24,39,.94);color:#f9fafb;border-radius:6px;
padding:6px 9px;font-size:12px;line-height:1.4;white-space:nowrap;box-shadow:0 2px 8px rgba(0,0,0,.25)}
.tip b{font-weight:600}
.tip i{display:inline-block;width:9px;height:9px;border-radius:2px;margin-right:6px;vertical-align:middle}
footer{color:var(--muted);font-size:12px;margin-top:36px;border-top:1px solid var(--line);padding-top:10px}
@media (max-width:700px){.grid,.grid.three{grid-template-columns:1fr}main{padding:8px 12px}}
details.charts>summary{cursor:pointer;color:var(--accent);font-size:13px;margin:10px 0}
table.sortable th{cursor:pointer}
table.sortable th[aria-sort=ascending]::after{content:" \\25B2"}
table.sortable th[aria-sort=descending]::after{content:" \\25BC"}
td.knobs{white-space:normal;word-break:break-word;min-width:220px}
@media print{nav,.tip{display:none}section.shard{break-before:page}details.charts>summary{display:none}}
"""

SCRIPT = r"""
(function () {
  "use strict";
  var tip = document.createElement("div");
  tip.className = "tip";
  tip.style.display = "none";
  document.body.appendChild(tip);

  function g3(v) {
    if (v === 0) return "0";
    var a = Math.abs(v), s;
    if (a >= 100) s = v.toFixed(0);
    else if (a >= 10) s = v.toFixed(1);
    else if (a >= 1) s = v.toFixed(2);
    else s = v.toPrecision(3);
    return String(parseFloat(s));
  }
  function count(v) {
    var a = Math.abs(v);
    if (a >= 1e9) return g3(v / 1e9) + "G";
    if (a >= 1e6) return g3(v / 1e6) + "M";
    if (a >= 1e4) return g3(v / 1e3) + "k";
    return a >= 100 ? Math.round(v).toLocaleString("en-US") : g3(v);
  }
  function dur(v) {
    var a = Math.abs(v);
    if (a === 0) return "0 s";
    if (a < 1e-3) return g3(v * 1e6) + " \u00b5s";
    if (a < 1) return g3(v * 1e3) + " ms";
    if (a < 120) return g3(v) + " s";
    if (a < 7200) return g3(v / 60) + " min";
    return g3(v / 3600) + " h";
  }
  function bytes(v) {
    var u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"], k = 0;
    while (k < u.length - 1 && Math.abs(v) >= Math.pow(1024, k + 1)) k++;
    return g3(v / Math.pow(1024, k)) + " " + u[k];
  }
  function fmt(v, f) {
    if (!isFinite(v)) return "-";
    if (f === "pct") return g3(v * 100) + "%";
    if (f === "bytes") return bytes(v);
    if (f === "time" || f === "duration") return dur(v);
    if (f === "rate") return count(v) + "/s";
    return count(v);
  }
  function parse(d) {
    var parts = d.slice(1).split("L"), n = parts.length;
    var xs = new Float64Array(n), ys = new Float64Array(n);
    for (var i = 0; i < n; i++) {
      var c = parts[i].indexOf(",");
      xs[i] = +parts[i].slice(0, c);
      ys[i] = +parts[i].slice(c + 1);
    }
    return {x: xs, y: ys};
  }
  function nearest(xs, px) {
    var lo = 0, hi = xs.length - 1;
    while (hi - lo > 1) {
      var mid = (lo + hi) >> 1;
      if (xs[mid] <= px) lo = mid; else hi = mid;
    }
    return Math.abs(xs[hi] - px) < Math.abs(xs[lo] - px) ? hi : lo;
  }

  var charts = document.querySelectorAll("svg.chart[data-px0]");
  Array.prototype.forEach.call(charts, function (svg) {
    var D = svg.dataset;
    var px0 = +D.px0, px1 = +D.px1, py0 = +D.py0, py1 = +D.py1;
    var x0 = +D.x0, x1 = +D.x1, y0 = +D.y0, y1 = +D.y1, xlog = D.xlog === "1";
    var lines = Array.prototype.slice.call(svg.querySelectorAll("path.hv"));
    var pts = lines.map(function (p) { return parse(p.getAttribute("d")); });
    var xh = svg.querySelector("line.xh");
    function hide() { tip.style.display = "none"; if (xh) xh.setAttribute("visibility", "hidden"); }
    svg.addEventListener("mousemove", function (ev) {
      var m = svg.getScreenCTM();
      if (!m) return;
      var pt = svg.createSVGPoint();
      pt.x = ev.clientX; pt.y = ev.clientY;
      var p = pt.matrixTransform(m.inverse());
      if (p.x < px0 || p.x > px1 || p.y < py1 - 4 || p.y > py0 + 4) { hide(); return; }
      var xv = x0 + (p.x - px0) / (px1 - px0) * (x1 - x0);
      if (xlog) xv = Math.pow(10, xv);
      var rows = ["<b>" + fmt(xv, D.xfmt) + "</b>"];
      lines.forEach(function (path, k) {
        if (path.parentNode.style.display === "none" || pts[k].x.length === 0) return;
        var i = nearest(pts[k].x, p.x);
        var yv = y0 + (py0 - pts[k].y[i]) / (py0 - py1) * (y1 - y0);
        rows.push('<i style="background:' + path.getAttribute("stroke") + '"></i>' +
                  path.getAttribute("data-name") + ": " + fmt(yv, D.yfmt));
      });
      tip.innerHTML = rows.join("<br>");
      tip.style.display = "block";
      var left = ev.pageX + 14;
      if (left + tip.offsetWidth > window.scrollX + document.documentElement.clientWidth - 8) {
        left = ev.pageX - tip.offsetWidth - 14;
      }
      tip.style.left = left + "px";
      tip.style.top = (ev.pageY + 12) + "px";
      if (xh) {
        xh.setAttribute("x1", p.x); xh.setAttribute("x2", p.x);
        xh.setAttribute("visibility", "visible");
      }
    });
    svg.addEventListener("mouseleave", hide);
  });

  Array.prototype.forEach.call(document.querySelectorAll("svg.chart g.lg"), function (item) {
    function toggle() {
      var svg = item.ownerSVGElement, k = item.getAttribute("data-series");
      var off = item.classList.toggle("off");
      item.setAttribute("aria-pressed", off ? "false" : "true");
      Array.prototype.forEach.call(svg.querySelectorAll('g.series[data-series="' + k + '"]'), function (s) {
        s.style.display = off ? "none" : "";
      });
    }
    item.addEventListener("click", toggle);
    item.addEventListener("keydown", function (ev) {
      if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); toggle(); }
    });
  });
  // Sortable tables: a heading click sorts the rows by that column (numbers by data-value, else the text;
  // empty cells last), a second click reverses.
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    var heads = table.querySelectorAll("thead th");
    Array.prototype.forEach.call(heads, function (th, col) {
      th.setAttribute("tabindex", "0");
      function sort() {
        var asc = th.getAttribute("aria-sort") !== "ascending";
        Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", asc ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        function key(row) {
          var cell = row.cells[col];
          if (!cell) return null;
          if (cell.hasAttribute("data-value")) return +cell.getAttribute("data-value");
          var t = cell.textContent.trim();
          return t === "" || t === "-" ? null : t;
        }
        rows.sort(function (a, b) {
          var x = key(a), y = key(b);
          if (x === null || y === null) return (x === null) - (y === null);
          var c = (typeof x === "number" && typeof y === "number") ? x - y : String(x).localeCompare(String(y));
          return asc ? c : -c;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      }
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (ev) {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); sort(); }
      });
    });
  });
  document.documentElement.setAttribute("data-report-ready", String(charts.length));
})();
"""


def render(rd: RunData, max_points: int = ds.MAX_POINTS) -> str:
    """The report of ``rd`` as one HTML document (a string)."""
    r = rd.run
    title = f"aisim report: {r['name']} ({r['run_id']})"
    nav = ['<a href="#summary">summary</a>']
    if len(rd.shards) > 1:
        nav.append('<a href="#compare">compare</a>')
    nav += [f'<a href="#shard-{sd.shard_id}">{sd.shard_id}: {escape(sd.label)}</a>' for sd in rd.shards]
    if rd.slo or len(rd.shards) > 1:
        nav.append('<a href="#latencies">latencies</a>')
    if rd.sweep:
        nav.append('<a href="#sweep">sweep</a>')
    open_ = len(rd.shards) <= OPEN_SHARDS
    sections = "".join(_shard_section(sd, max_points, rd.slo, open_) for sd in rd.shards)
    n_req = sum(sd.n_requests for sd in rd.shards)
    n_steps = sum(sd.n_steps for sd in rd.shards)
    if not rd.shards:
        sections = '<p class="empty">This run has no shards.</p>'
    body = "".join([
        _header(rd),
        '<h2>Run summary</h2>',
        _summary_table(rd) if rd.shards else "",
        _comparison(rd),
        _overlay(rd, max_points),
        sweep_section(rd.sweep, rd.slo),
        sections,
    ])
    return document(title, f"run {r['name']}",
                    f'{len(rd.shards)} shard{"s" if len(rd.shards) != 1 else ""} · {n_req:,} requests · '
                    f'{n_steps:,} engine steps · ' + ("from aisim replay --out" if "folders" in r else
                                                          f'run id {r["run_id"]}'), nav, body, rd.database,
                    f"Every number is computed on the full data; long series are drawn from at most {max_points:,} "
                    "points each (min/max per bucket, so spikes stay visible).")


def document(title: str, heading: str, sub: str, nav: list, body: str, database: str, note: str) -> str:
    """A self-contained report page: ``nav`` links (HTML), ``body`` (HTML), the house CSS and script.

    ``heading`` and ``sub`` are text; ``note`` (text) goes in the footer before the reading hints.
    """
    from aisim import __version__

    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta name="generator" content="aisim {escape(__version__)}">',
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>",
        f'<header class="top"><h1>aisim report · {escape(heading)}</h1><div class="sub">{escape(sub)}</div></header>',
        f'<nav>{"".join(nav)}</nav><main>',
        body,
        f'<footer>Generated by aisim {escape(__version__)} from {escape(database)}. Times are simulated '
        f"seconds. {escape(note)} Hover a chart for values; click a legend entry to hide or show its series; "
        "click a table heading to sort.</footer>",
        f"</main><script>{SCRIPT}</script></body></html>\n",
    ])


__all__ = ["CSP", "document", "render"]
