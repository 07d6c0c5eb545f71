"""The report's KV offload panel: the GPU prefix cache and the CPU tier behind it.

A shard whose engine had a KV offload tier (``summaries.offload_cpu_chunks`` > 0) gets a panel in
its section: the hit rate per tier (and the disk tier's reads and writes when it had one) (the share of prompt tokens served at a request's first
admission from the GPU prefix cache, ``cached_tokens``, and from the CPU tier,
``offload_hit_tokens``), the tier's traffic (tokens loaded, blocks stored and evicted), the tier's
occupancy over simulated time against its size, and its loads and stores per time window.  When the
run replays one model on engines with and without a tier, the comparison section gets TTFT p50 and
p99 with against without.  A shard without a tier shows nothing of this.
"""

from __future__ import annotations

import numpy as np

from aisim.report import downsample as ds
from aisim.report.data import RunData, ShardData
from aisim.report.spec import _fig, _stat
from aisim.report.svg import Ref, Series, bar_chart, fmt_count, fmt_pct, line_chart


def has_tier(sd: ShardData) -> bool:
    """Whether the shard's engine had a KV offload tier."""
    return bool(sd.summary.get("offload_cpu_chunks") or 0)


def tier_rates(sd: ShardData) -> dict:
    """``prompt_tokens``, ``gpu_hit_rate`` and ``cpu_hit_rate``: the shares of prompt tokens each tier
    served at first admission (the CPU rate is None without a tier)."""
    rq = sd.requests
    prompt = float(np.nansum(rq["prompt_tokens"]))
    gpu = float(np.nansum(rq["cached_tokens"])) / prompt if prompt else None
    cpu = float(np.nansum(rq["offload_hit_tokens"])) / prompt if prompt and has_tier(sd) else None
    return {"prompt_tokens": prompt, "gpu_hit_rate": gpu, "cpu_hit_rate": cpu}


def offload_panel(sd: ShardData, mp: int) -> str:
    """The shard's KV offload panel (HTML), or "" when its engine had no tier."""
    if sd.n_steps == 0 or not has_tier(sd):
        return ""
    sid, st, s = sd.shard_id, sd.steps, sd.summary
    r = tier_rates(sd)
    size = float(s["offload_cpu_chunks"])
    stats = [
        _stat("GPU prefix cache hit rate", fmt_pct(r["gpu_hit_rate"]), "prompt tokens cached at first admission",
              "offload_gpu_hit_rate", r["gpu_hit_rate"]),
        _stat("CPU tier hit rate", fmt_pct(r["cpu_hit_rate"]), f"{fmt_count(s['offload_load_tokens'])} tokens "
              f"loaded by {fmt_count(s['offload_loads'])} loads", "offload_cpu_hit_rate", r["cpu_hit_rate"]),
        _stat("CPU tier stores / evictions", f"{fmt_count(s['offload_store_chunks'])} / "
              f"{fmt_count(s['offload_cpu_evicted'])}", f"offloaded blocks, of a tier of {fmt_count(size)}",
              "offload_store_chunks", float(s["offload_store_chunks"])),
    ]
    disk = st["offload_disk_chunks"]
    if np.any(~np.isnan(np.asarray(disk, dtype=float))):
        # A disk tier behind the CPU tier (its columns are NULL without one).
        reads = float(np.nansum(st["offload_disk_read_chunks"]))
        stats.append(_stat("Disk tier reads / writes", f"{fmt_count(reads)} / "
                           f"{fmt_count(float(np.nansum(st['offload_disk_write_chunks'])))}",
                           f"offloaded blocks; {fmt_count(float(np.nanmax(disk)))} on disk (never evicted)",
                           "offload_disk_read_chunks", reads))
    t = st["clock_s"]
    end = float(np.nanmax(t + np.nan_to_num(st["duration_s"])))
    t0 = min(float(np.nanmin(t)), 0.0)
    end = end if end > t0 else t0 + 1.0
    x, y = ds.m4(t, st["offload_cpu_used"], mp)
    svg = line_chart([Series("blocks holding data", x, y, "blue", "step", width=1.6)],
                     title=f"CPU tier occupancy, shard {sid}", chart_id=f"off-used-{sid}", xlim=(t0, end),
                     ylim=(0.0, size * 1.05), refs=[Ref(size, f"tier size {fmt_count(size)}", "grey")],
                     xlabel="simulated time", ylabel="offloaded blocks")
    figs = [_fig("CPU tier occupancy", svg, "offloaded blocks holding data after each step, against the tier's "
                                            "size (vLLM's CPUOffloadingManager evicts the least recent)")]
    nw = ds.window_count(sd.n_steps)
    edges, loads = ds.windows(t, st["offload_load_chunks"], t0, end, nw)
    _, stores = ds.windows(t, st["offload_store_chunks"], t0, end, nw)
    mid = (edges[:-1] + edges[1:]) / 2
    svg = line_chart([Series("loaded (CPU to GPU)", mid, loads, "green", "line", width=1.6),
                      Series("stored (GPU to CPU)", mid, stores, "orange", "line", width=1.6)],
                     title=f"CPU tier traffic, shard {sid}", chart_id=f"off-traffic-{sid}", xlim=(t0, end),
                     xlabel="simulated time", ylabel="offloaded blocks per window")
    figs.append(_fig("CPU tier traffic", svg, f"offloaded blocks loaded and stored over {nw} windows"))
    return (f'<h3>KV offload</h3><div class="stats">{"".join(stats)}</div>'
            f'<div class="grid">{"".join(figs)}</div>')


def offload_comparison(rd: RunData) -> str:
    """TTFT p50 and p99 with against without a KV offload tier, per model replayed both ways ("" otherwise)."""
    by_model = {}
    for sd in rd.shards:
        if sd.n_steps:
            by_model.setdefault(sd.shard["model"], []).append(sd)
    cats, p50, p99 = [], [], []
    for model, shards in by_model.items():
        tiered = [sd for sd in shards if has_tier(sd)]
        if not tiered or len(tiered) == len(shards):
            continue
        for sd in shards:
            v = sd.latencies("ttft_s")
            tier = f"{fmt_count(sd.summary['offload_cpu_chunks'])}-block tier" if has_tier(sd) else "no tier"
            cats.append(f"{model} / {sd.shard['engine']} ({tier})")
            p50.append(float(np.percentile(v, 50)) if v.size else None)
            p99.append(float(np.percentile(v, 99)) if v.size else None)
    if not cats:
        return ""
    svg = bar_chart(cats, [("TTFT p50", p50, "blue"), ("TTFT p99", p99, "purple")],
                    title="TTFT with and without a KV offload tier", chart_id="cmp-offload-ttft", fmt="duration")
    cap = "TTFT median and 99th percentile of each engine of a model replayed with and without a CPU tier"
    return f'<div class="grid compare">{_fig("TTFT with and without a KV offload tier", svg, cap)}</div>'


__all__ = ["has_tier", "offload_comparison", "offload_panel", "tier_rates"]
