"""The report's speculative-decoding panel: acceptance, and what it does to TPOT.

A shard whose engine verified draft tokens (``requests.spec_drafts`` > 0) gets
a panel in its section: the acceptance rate (accepted / drafted, the whole
shard), the accepted tokens a verifying step adds, the acceptance rate over
simulated time, the distribution of the per-request rate, and TPOT by
acceptance quartile (requests that accept more drafts finish their outputs in
fewer steps).  When the run replays one model on engines with and without
speculative decoding, the comparison section gets TPOT with against without.
A shard without drafts shows nothing of this.
"""

from __future__ import annotations

from html import escape

import numpy as np

from aisim.report import downsample as ds
from aisim.report.data import RunData, ShardData
from aisim.report.svg import Ref, Series, bar_chart, fmt_count, fmt_duration, fmt_pct, line_chart


def _drafted(sd: ShardData) -> bool:
    return bool(np.nansum(sd.requests["spec_drafts"]) > 0)


def acceptance(sd: ShardData) -> dict:
    """The shard's speculative-decoding numbers, from every request and step.

    Returns
    -------
    dict
        ``draft_tokens``, ``accepted_tokens``, ``rate`` (None without drafts),
        ``spec_steps`` (steps that verified drafts), ``accepted_per_step``
        (accepted tokens per such step) and ``per_request`` (the rates of
        requests that verified drafts).
    """
    rq, st = sd.requests, sd.steps
    drafts, acc = float(np.nansum(rq["spec_drafts"])), float(np.nansum(rq["spec_accepted"]))
    has = rq["spec_drafts"] > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        per = rq["spec_accepted"][has] / rq["spec_drafts"][has]
    steps = int((st["spec_tokens"] > 0).sum())
    return {
        "draft_tokens": drafts,
        "accepted_tokens": acc,
        "rate": acc / drafts if drafts else None,
        "spec_steps": steps,
        "accepted_per_step": float(np.nansum(st["spec_accepted"])) / steps if steps else None,
        "per_request": per,
    }


def _stat(label: str, value: str, sub: str, key: str, raw) -> str:
    v = raw if raw is None or np.isfinite(raw) else None
    data = f' data-key="{escape(key)}"' + ("" if v is None else f' data-value="{float(v)!r}"')
    return (f'<div class="stat"{data}><div class="lab">{escape(label)}</div>'
            f'<div class="val">{escape(value)}</div><div class="sub">{escape(sub)}</div></div>')


def _fig(title: str, svg: str, caption: str) -> str:
    return f'<figure class="card"><figcaption>{escape(title)}</figcaption>{svg}<p class="cap">{escape(caption)}</p></figure>'


def spec_panel(sd: ShardData, mp: int) -> str:
    """The shard's speculative-decoding panel (HTML), or "" when it verified no drafts."""
    if sd.n_steps == 0 or not _drafted(sd):
        return ""
    a = acceptance(sd)
    sid = sd.shard_id
    st, rq = sd.steps, sd.requests
    per = a["per_request"]
    stats = [
        _stat("draft acceptance", fmt_pct(a["rate"]), f"{fmt_count(a['accepted_tokens'])} of "
              f"{fmt_count(a['draft_tokens'])} draft tokens accepted", "spec_acceptance_rate", a["rate"]),
        _stat("accepted per verifying step", f"{a['accepted_per_step']:.2f}" if a["accepted_per_step"] else "-",
              f"{fmt_count(a['spec_steps'])} steps verified drafts", "spec_accepted_per_step",
              a["accepted_per_step"]),
    ]
    if per.size:
        p10, p50, p90 = np.percentile(per, [10, 50, 90])
        stats.append(_stat("per-request acceptance p50", fmt_pct(p50), f"p10 {fmt_pct(p10)} · p90 {fmt_pct(p90)}",
                           "spec_acceptance_p50", p50))
    figs = []
    # Acceptance over time: exact sums per window.
    t = st["clock_s"]
    end = float(np.nanmax(t + np.nan_to_num(st["duration_s"])))
    t0 = min(float(np.nanmin(t)), 0.0)
    nw = ds.window_count(sd.n_steps)
    edges, drafted = ds.windows(t, st["spec_tokens"], t0, end if end > t0 else t0 + 1.0, nw)
    _, accepted = ds.windows(t, st["spec_accepted"], t0, end if end > t0 else t0 + 1.0, nw)
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(drafted > 0, accepted / np.where(drafted > 0, drafted, 1), np.nan)
    mid = (edges[:-1] + edges[1:]) / 2
    ok = np.isfinite(rate)
    svg = line_chart([Series("accepted / drafted per window", mid[ok], rate[ok], "green", "line", width=1.8)],
                     title=f"Draft acceptance over time, shard {sid}", chart_id=f"spec-rate-{sid}", yfmt="pct",
                     ylim=(0.0, 1.0), xlim=(t0, end if end > t0 else t0 + 1.0),
                     refs=[Ref(a["rate"], f"whole run {fmt_pct(a['rate'])}", "green")],
                     xlabel="simulated time", ylabel="accepted / drafted tokens")
    figs.append(_fig("Draft acceptance over time", svg, f"draft tokens accepted over {nw} windows; -1 padding of "
                                                        "one-token admissions counts as drafted"))
    # Per-request acceptance-rate distribution.
    x, p = ds.cdf(per, mp)
    svg = line_chart([Series("acceptance CDF", x, p, "blue", "step", width=1.8)],
                     title=f"Per-request acceptance CDF, shard {sid}", chart_id=f"spec-cdf-{sid}", xfmt="pct",
                     yfmt="pct", ylim=(0.0, 1.0), xlim=(0.0, 1.0), xlabel="accepted / drafted, per request",
                     ylabel="requests", note="" if per.size else "no request verified drafts")
    figs.append(_fig("Per-request acceptance", svg, f"{per.size:,} requests verified drafts"))
    # TPOT by acceptance quartile.
    tpot = rq["tpot_s"]
    has = rq["spec_drafts"] > 0
    cats, meds = [], []
    for lo, hi in ((0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.01)):
        sel = has.copy()
        sel[has] = (per >= lo) & (per < hi)
        v = tpot[sel & np.isfinite(tpot)]
        cats.append(f"acceptance {int(lo * 100)}-{min(int(hi * 100), 100)}% ({v.size:,} requests)")
        meds.append(float(np.median(v)) if v.size else None)
    svg = bar_chart(cats, [("TPOT median", meds, "purple")], title=f"TPOT by acceptance, shard {sid}",
                    chart_id=f"spec-tpot-{sid}", fmt="duration")
    figs.append(_fig("TPOT by per-request acceptance", svg, "median time per output token of the requests in each "
                                                            "acceptance band"))
    return (f'<h3>Speculative decoding</h3><div class="stats">{"".join(stats)}</div>'
            f'<div class="grid">{"".join(figs)}</div>')


def spec_comparison(rd: RunData) -> str:
    """TPOT with against without speculative decoding, per model replayed both ways ("" otherwise)."""
    by_model = {}
    for sd in rd.shards:
        if sd.n_steps:
            by_model.setdefault(sd.shard["model"], []).append(sd)
    cats, with_, without = [], [], []
    for model, shards in by_model.items():
        base = [sd for sd in shards if not _drafted(sd)]
        spec = [sd for sd in shards if _drafted(sd)]
        if not base or not spec:
            continue
        ref = float(np.median([np.median(sd.latencies("tpot_s")) for sd in base if sd.latencies("tpot_s").size]
                              or [np.nan]))
        for sd in spec:
            v = sd.latencies("tpot_s")
            cats.append(f"{model} / {sd.shard['engine']}")
            with_.append(float(np.median(v)) if v.size else None)
            without.append(ref if np.isfinite(ref) else None)
    if not cats:
        return ""
    svg = bar_chart(cats, [("with drafts", with_, "green"), ("without (same model)", without, "grey")],
                    title="TPOT with and without speculative decoding", chart_id="cmp-spec-tpot", fmt="duration")
    cap = (f"TPOT median of each speculative engine against the median of its model's engines without drafts "
           f"({fmt_duration(without[0]) if without[0] is not None else '-'} for the first)")
    return f'<div class="grid compare">{_fig("TPOT with and without speculative decoding", svg, cap)}</div>'


__all__ = ["acceptance", "spec_comparison", "spec_panel"]
