"""Does a CPU tier pay, and what does it cost the replay?  KV offload on a Mooncake and an agentic trace.

Run from the repository root after building the extension::

    python benchmarks/kv_offload.py [--repeat R] [--json PATH] [--markdown] [--async-scheduling]

Each workload is one trace on llama-3.1-8b on one H100 (the roofline of ``aisim plan --model
llama-3.1-8b --gpu H100``, vLLM 0.34.0, synchronous scheduling; ``--async-scheduling``: vLLM's default)
with a GPU pool that churns, replayed without a KV offload tier and with each of its CPU tiers
(vLLM's ``--kv-offloading-size``; loads and stores timed on the H100's PCIe 5.0 x16 link).  For each
it prints the hit rate per tier -- the share of prompt
tokens served at a request's first admission from the GPU prefix cache (``cached_tokens``) and
from the CPU tier (``offload_hit_tokens``) -- TTFT p50/p99, the engine steps (transfers add some),
and the replay's wall time with the tier
over without it (best of ``--repeat`` alternated runs in this process: a shared machine's noise
only slows a run down), also per engine step.  The target is a wall-time ratio of at most 1.5.

Workloads:

- ``mooncake``: ``tests/data/traces/mooncake/synthetic_trace.jsonl`` (3,993 requests, 61 M prompt
  tokens in 512-token hash blocks) sent at a quarter of its rate (``--rate-scale 0.25``: about one
  request a second), max_model_len 196,608, vLLM's pool on an H100 (8,192 blocks of 64 tokens,
  512 Ki tokens), CPU tiers of 256 GiB and 1 TiB (chunks of 8 MiB), and the 256 GiB one with a disk tier.
- The rows with a disk tier (``kv_offload.disk_tier``, the NVMe defaults): the CPU hit rate counts
  the tokens loaded from the CPU tier after a read from disk too.
- ``weka``: the three agentic sessions of ``tests/data/traces/weka/`` together (92 turns of up to
  101 Ki tokens, each resending its conversation) at half their rate, a pool of 2,100 blocks (131 Ki
  tokens, about one conversation), a 64 GiB tier (also with a disk tier behind it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACES = os.path.join(REPO, "tests", "data", "traces")  # the public samples bundled with the tests
WORKLOADS = {
    "mooncake": {"trace": os.path.join(TRACES, "mooncake", "synthetic_trace.jsonl"), "format": "mooncake",
                 "rate_scale": 0.25, "max_model_len": 196608, "num_gpu_blocks": 8192, "tiers_gib": (256.0, 1024.0),
                 "disk_gib": (256.0,)},
    "weka": {"trace": os.path.join(TRACES, "weka"), "format": "agentic", "rate_scale": 0.5,
             "max_model_len": 131072, "num_gpu_blocks": 2100, "tiers_gib": (64.0,), "disk_gib": (64.0,)},
}


def _engines(w: dict, async_scheduling: bool = False) -> dict:
    """The workload's engines: ``"none"`` without a tier, then one per tier size (GiB)."""
    from aisim.plan import offload_flags, plan_from_model

    cfg, _ = plan_from_model("llama-3.1-8b", None, 1, None, gpu="H100", vllm_version="0.34.0")
    cfg = cfg.replace(async_scheduling=async_scheduling, num_gpu_blocks=w["num_gpu_blocks"], max_model_len=w["max_model_len"],
                      plan_notes=[])
    # Transfers on the clock of the H100's PCIe 5.0 x16 link (docs/kv-offload.md); a disk tier behind
    # some CPU tiers (the NVMe defaults of kv_offload.disk_read_gbps / disk_write_gbps).
    out = {"none": cfg, **{gib: cfg.replace(kv_offload={**offload_flags(cfg, gib), "pcie_gen": 5})
                           for gib in w["tiers_gib"]}}
    for gib in w.get("disk_gib", ()):
        out[f"{gib:g}+disk"] = cfg.replace(kv_offload={**offload_flags(cfg, gib), "pcie_gen": 5, "disk_tier": True})
    return out


def _figures(result) -> dict:
    """Hit rate per tier (shares of prompt tokens at first admission), TTFT and the tier's traffic."""
    s = result.summary
    rq = result.requests
    prompt = sum(rq.column("prompt_tokens").to_pylist())
    out = {"requests": s["requests"], "finished": s["finished"], "prompt_tokens": prompt, "steps": result.steps.num_rows,
           "gpu_hit_rate": sum(rq.column("cached_tokens").to_pylist()) / prompt,
           "ttft_p50_s": s["ttft_s"]["p50"], "ttft_p99_s": s["ttft_s"]["p99"], "preemptions": s["preemptions"]}
    off = s.get("kv_offload")
    if off is not None:
        out.update(cpu_hit_rate=sum(rq.column("offload_hit_tokens").to_pylist()) / prompt,
                   load_tokens=off["load_tokens"], loads=off["loads"], store_chunks=off["store_chunks"],
                   cpu_evicted=off["cpu_evicted_chunks"], cpu_chunks=off["cpu_chunks"])
        if "disk" in off:
            out.update(disk_read_chunks=off["disk"]["promoted_chunks"], disk_chunks=off["disk"]["disk_chunks"])
    return out


def run(name: str, repeat: int, async_scheduling: bool = False) -> dict:
    """One workload: the figures of each engine and the best wall times (alternated orders)."""
    from aisim.replay import replay
    from aisim.traces import read_trace
    from aisim.traces.load import retime

    w = WORKLOADS[name]
    trace = retime(read_trace(w["trace"], w["format"]), rate_scale=w["rate_scale"])
    engines = _engines(w, async_scheduling)
    best = {k: float("inf") for k in engines}
    results = {}
    for r in range(repeat):
        for label in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
            t0 = time.perf_counter()
            results[label] = replay(trace, engines[label])
            best[label] = min(best[label], time.perf_counter() - t0)
    rows = []
    for label in engines:
        disk = isinstance(label, str) and label.endswith("+disk")
        rows.append({"workload": name, "gpu_blocks": w["num_gpu_blocks"], "rate_scale": w["rate_scale"],
                     "tier_gib": None if label == "none" else float(label[:-5]) if disk else label, "disk": disk,
                     **_figures(results[label]),
                     "wall_s": best[label], "wall_ratio": best[label] / best["none"],
                     # The same ratio per engine step replayed: a tier's loads make prefills shorter, so
                     # its replay runs more, smaller decode steps (the steps column) as the engine would.
                     "step_ratio": (best[label] / results[label].steps.num_rows)
                     / (best["none"] / results["none"].steps.num_rows)})
    return rows


def _pct(x) -> str:
    return f"{100 * x:.1f}%"


def markdown(rows: list) -> str:
    """The results as the table of docs/kv-offload.md."""
    lines = ["| trace | GPU pool | CPU tier | GPU hit rate | CPU hit rate | TTFT p50 | TTFT p99 | engine steps "
             "| replay wall time |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tier = "none" if r["tier_gib"] is None else f"{r['tier_gib']:g} GiB ({r['cpu_chunks']:,} chunks)"
        tier += " + disk" if r.get("disk") else ""
        cpu = "—" if r["tier_gib"] is None else _pct(r["cpu_hit_rate"])
        wall = f"{r['wall_s']:.2f} s" + ("" if r["tier_gib"] is None
                                          else f" ({r['wall_ratio']:.2f}x; {r['step_ratio']:.2f}x a step)")
        lines.append(f"| {r['workload']} | {r['gpu_blocks']:,} blocks | {tier} | {_pct(r['gpu_hit_rate'])} | {cpu} "
                     f"| {r['ttft_p50_s']:.2f} s | {r['ttft_p99_s']:.2f} s | {r['steps']:,} | {wall} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="alternated replays of each engine (default 3)")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), action="append", help="only these (default: all)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    ap.add_argument("--markdown", action="store_true", help="print the docs table too")
    ap.add_argument("--async-scheduling", action="store_true",
                    help="schedule asynchronously, as vLLM 0.33 and later serve by default")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    rows = [row for n in (args.workload or WORKLOADS) for row in run(n, args.repeat, args.async_scheduling)]
    for r in rows:
        tier = "no tier" if r["tier_gib"] is None else f"{r['tier_gib']:g} GiB tier" + (" + disk" if r["disk"] else "")
        cpu = "" if r["tier_gib"] is None else f", CPU hit {_pct(r['cpu_hit_rate'])}"
        print(f"{r['workload']}, {tier}: GPU hit {_pct(r['gpu_hit_rate'])}{cpu}, TTFT p50 {r['ttft_p50_s']:.3f} s, "
              f"p99 {r['ttft_p99_s']:.3f} s; {r['steps']:,} steps, wall {r['wall_s']:.2f} s"
              + ("" if r["tier_gib"] is None else f", ratio {r['wall_ratio']:.2f} (target <= 1.5), "
                                                  f"per step {r['step_ratio']:.2f}"))
    if args.markdown:
        print(markdown(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
