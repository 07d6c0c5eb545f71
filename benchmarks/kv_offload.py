"""Does a CPU tier behind the GPU cache pay, and what does it cost to replay?

Run from the repository root after building the extension::

    python benchmarks/kv_offload.py [--repeat N]

The Mooncake sample trace (``tests/data/traces/mooncake``, 3,993 requests, 512-token hash blocks)
and the recorded multi-turn offload scenario (``tests/data/oracle/offload/offload_multiturn``,
424 requests) are replayed on a GPU pool small enough to churn, without and with a CPU tier
(vLLM's CPU OffloadingConnector, ``kv_offload``; docs/kv-offload.md).  Printed per trace: the
prefix tokens served by each tier at admission (GPU hits, CPU-tier loads) as shares of the
prompt tokens, mean and p90 TTFT, and the replay's wall time with the tier over the one without
(best of ``--repeat`` alternated pairs).  Target: that ratio at most 1.5.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

from aisim.config.engine import engine_config_from_dict  # noqa: E402
from aisim.replay import replay  # noqa: E402
from aisim.traces import read_trace  # noqa: E402

MOONCAKE = os.path.join(REPO, "tests", "data", "traces", "mooncake", "synthetic_trace.jsonl")
MULTITURN = os.path.join(REPO, "tests", "data", "oracle", "offload", "offload_multiturn")


def mooncake():
    """The Mooncake sample on a pool of 8,192 blocks (128k tokens); prompts average ~8k tokens."""
    eng = {"num_gpu_blocks": 8192, "block_size": 16, "max_num_seqs": 64, "max_num_batched_tokens": 8192,
           "max_model_len": 131072, "kv_cache_groups": [{"type": "full"}], "startup_check": False,
           "time_model": {"kind": "linear", "base_s": 0.01, "per_token_s": 2e-6}}
    return eng, read_trace(MOONCAKE), {"cpu_blocks": 65536, "kv_bytes_per_block": 2 * 32 * 8 * 128 * 2 * 16,
                                       "pcie_gen": 5}


def multiturn():
    """The recorded multi-turn scenario (480 GPU blocks, a tier of 2,500)."""
    from helpers import oracle_engine_dict, oracle_hash_id_trace

    eng = oracle_engine_dict(MULTITURN, "0.34.0")
    off = eng.pop("kv_offload")
    return eng, oracle_hash_id_trace(os.path.join(MULTITURN, "trace.jsonl")), off


def _timed(trace, cfg):
    gc.disable()
    t0 = time.perf_counter()
    res = replay(trace, cfg, reject_too_long=True)
    dt = time.perf_counter() - t0
    gc.enable()
    return res, dt


def _stats(res):
    s = res.summary
    prompt = s["prompt_tokens"]
    ttft = res.requests.column("ttft_s").to_numpy(zero_copy_only=False)
    import numpy as np

    out = {"gpu_hit_share": s["prefix_cache_stats"]["hits"] / max(s["prefix_cache_stats"]["queries"], 1),
           "ttft_mean_s": float(np.nanmean(ttft)), "ttft_p90_s": float(np.nanpercentile(ttft, 90)),
           "steps": s["steps"]}
    ko = s.get("kv_offload")
    out["cpu_hit_share"] = (ko["connector_prefix_cache_stats"]["hits"] / max(prompt, 1)) if ko else 0.0
    out["cpu_evicted_chunks"] = ko["cpu_evicted_chunks"] if ko else 0
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    report = {}
    for name, make in (("mooncake", mooncake), ("multiturn", multiturn)):
        eng, trace, off = make()
        base = engine_config_from_dict(eng)
        tier = engine_config_from_dict({**eng, "kv_offload": off})
        best = {"off": float("inf"), "on": float("inf")}
        for _ in range(args.repeat):
            r_off, t_off = _timed(trace, base)
            r_on, t_on = _timed(trace, tier)
            best["off"], best["on"] = min(best["off"], t_off), min(best["on"], t_on)
        report[name] = {"without": _stats(r_off), "with_cpu_tier": _stats(r_on),
                        "replay_s": best, "cost_ratio": best["on"] / best["off"]}
        w, c = report[name]["without"], report[name]["with_cpu_tier"]
        print(f"{name}: GPU hits {w['gpu_hit_share']:.1%} -> {c['gpu_hit_share']:.1%} of lookups, CPU tier "
              f"{c['cpu_hit_share']:.1%} of prompt tokens; TTFT mean {w['ttft_mean_s']:.3f} -> "
              f"{c['ttft_mean_s']:.3f} s, p90 {w['ttft_p90_s']:.3f} -> {c['ttft_p90_s']:.3f} s; replay "
              f"{best['off'] * 1e3:.1f} -> {best['on'] * 1e3:.1f} ms (x{report[name]['cost_ratio']:.2f}, target <= 1.5)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
