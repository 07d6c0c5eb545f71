"""How fast does aisim replay a deployment?

Run from the repository root after building the extension
(``python setup.py build_ext --inplace``)::

    python benchmarks/deploy_speed.py [--requests N] [--repeat N] [--json PATH]

The workload: 8 replicas behind the ``kv_aware`` router, a synthetic trace of 100,000 requests
(``aisim.traces.synth.synth_trace``): Poisson arrivals at ``RATE`` requests/s, which keeps the
replicas busy (their utilisation is printed), 20 shared prefixes of 1,024 tokens on half the
requests, lognormal suffixes of mean 512 tokens, 128 output tokens.  Each replica: 64 sequences,
an 8,192-token budget, 8,192 KV blocks of 16 tokens, a linear step time.

Timed: the core's run (``aisim.replay.run_deployment``: building the replicas and the router,
the event loop, handing the columns over) and the whole ``aisim.deploy.deploy`` call (plus the
result tables and the summary); best of ``--repeat`` after one warm-up, the cyclic garbage
collector paused.  For comparison, one engine replays the same requests (``aisim.replay``; it is
overloaded, so its queue grows: the ratio compares simulation speed per request, not serving).

Splits, printed as ratios of the core's CPU seconds on the same trace (best of half ``--repeat``;
CPU time is less disturbed than wall-clock time by other load on a shared machine):

* 8 replicas against 1 (both ``kv_aware``): what spreading the requests over the replicas costs
  per request (eight caches and schedulers, the router's masks over eight replicas);
* the router's share on 1 replica: ``kv_aware`` against ``round_robin`` there routes every
  request alike, so the replica's work is the same and the difference is the router's own
  (its prefix index, scores and bookings, the replica's cache events);
* ``kv_aware`` against ``round_robin`` on 8 replicas: the router's cost plus that of the
  different placements it makes.

Target: at least 50,000 simulated requests/s for the deployment's core on one core.  The last line
says PASS or FAIL; the exit status is 0 either way (benchmark machines are noisy).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # runnable from a checkout without installing
    sys.path.insert(0, REPO)

from aisim.config.deployment import deployment_config  # noqa: E402
from aisim.config.engine import engine_config_from_dict  # noqa: E402
from aisim.deploy import deploy  # noqa: E402
from aisim.replay import replay, run_deployment  # noqa: E402
from aisim.traces.synth import synth_trace  # noqa: E402

REPLICAS = 8
REQUESTS = 100_000
RATE = 360.0  # arrivals per second over the whole deployment
TARGET_REQ_S = 50_000.0

ENGINE = {
    "num_gpu_blocks": 8192,
    "block_size": 16,
    "max_num_seqs": 64,
    "max_num_batched_tokens": 8192,
    "max_model_len": 8192,
    "time_model": {"kind": "linear", "base_s": 0.005, "per_token_s": 2e-5, "per_req_s": 1e-5},
}


def workload(n: int):
    eng = engine_config_from_dict(ENGINE, source="deploy_speed")
    trace = synth_trace(n, seed=1, rate=RATE, prompt="lognormal:512:0.6", output="fixed:128",
                        prefix_groups=20, prefix_len=1024, prefix_fraction=0.5)
    return eng, trace


def best_of(fn, repeat: int) -> tuple:
    """The best wall-clock seconds, the last result and the best CPU seconds of this process."""
    fn()  # warm-up
    times, cpu, out = [], [], None
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            out = fn()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        finally:
            gc.enable()
    return min(times), out, min(cpu)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=REQUESTS)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    eng, trace = workload(args.requests)
    dep = deployment_config(REPLICAS, "kv_aware")
    n = trace.num_rows
    t_core, _, c_core = best_of(lambda: run_deployment(trace, eng, dep), args.repeat)
    t_full, result, _ = best_of(lambda: deploy(trace, eng, dep), args.repeat)
    half = max(1, args.repeat // 2)
    t_single, single, _ = best_of(lambda: replay(trace, eng), half)
    # The splits compare CPU seconds: less disturbed than wall-clock ones by other load.
    _, _, c_kv1 = best_of(lambda: run_deployment(trace, eng, deployment_config(1, "kv_aware")), half)
    _, _, c_rr1 = best_of(lambda: run_deployment(trace, eng, deployment_config(1, "round_robin")), half)
    _, _, c_rr8 = best_of(lambda: run_deployment(trace, eng, deployment_config(REPLICAS, "round_robin")), half)
    s = result.summary
    lb = s["load_balance"]
    record = {
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "requests": n,
        "replicas": REPLICAS,
        "router": "kv_aware",
        "core_s": t_core,
        "deploy_s": t_full,
        "single_engine_s": t_single,
        "core_req_s": n / t_core,
        "deploy_req_s": n / t_full,
        "single_engine_req_s": n / t_single,
        "core_vs_single": (n / t_core) / (n / t_single),
        "core_cpu_s": c_core,
        "one_replica_kv_aware_cpu_s": c_kv1,
        "one_replica_round_robin_cpu_s": c_rr1,
        "round_robin_cpu_s": c_rr8,
        "replicas_vs_one": c_core / c_kv1,
        "router_share_one_replica": 1.0 - c_rr1 / c_kv1,
        "kv_aware_vs_round_robin": c_core / c_rr8,
        "finished": s["finished"],
        "prefix_hit_rate": s["prefix_hit_rate"],
        "single_engine_prefix_hit_rate": single.summary["prefix_hit_rate"],
        "utilisation_min": lb["utilisation_min"],
        "utilisation_max": lb["utilisation_max"],
        "requests_per_replica_min": lb["requests_min"],
        "requests_per_replica_max": lb["requests_max"],
        "simulated_s": s["duration_s"],
    }
    print(f"deployment: {REPLICAS} replicas, kv_aware, {n:,} requests ({s['finished']:,} finished), "
          f"simulated {s['duration_s']:.1f} s")
    print(f"  replica utilisation {lb['utilisation_min']:.1%} .. {lb['utilisation_max']:.1%}, "
          f"requests per replica {lb['requests_min']:,} .. {lb['requests_max']:,}, "
          f"prefix hit rate {s['prefix_hit_rate']:.1%} (one engine: {single.summary['prefix_hit_rate']:.1%})")
    print(f"  core       {t_core:8.3f} s  {n / t_core:12,.0f} req/s")
    print(f"  deploy()   {t_full:8.3f} s  {n / t_full:12,.0f} req/s")
    print(f"  one engine {t_single:8.3f} s  {n / t_single:12,.0f} req/s  (core / one engine: "
          f"{record['core_vs_single']:.2f}x)")
    print(f"  splits (CPU s): core {c_core:.3f}; {REPLICAS} replicas / 1 replica (kv_aware, {c_kv1:.3f}) "
          f"{record['replicas_vs_one']:.2f}x; router share on 1 replica "
          f"{record['router_share_one_replica']:.0%} (round_robin {c_rr1:.3f}); "
          f"kv_aware / round_robin on {REPLICAS} replicas ({c_rr8:.3f}) {record['kv_aware_vs_round_robin']:.2f}x")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=2)
    ok = n / t_core >= TARGET_REQ_S and s["finished"] == n
    print(f"{'PASS' if ok else 'FAIL'}: core {n / t_core:,.0f} req/s (target {TARGET_REQ_S:,.0f}), "
          f"{s['finished']:,} of {n:,} finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
