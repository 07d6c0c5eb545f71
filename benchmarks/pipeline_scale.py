"""How well does the batch pipeline scale, and how fast does it land?

Run from the repository root after building the extension
(``python setup.py build_ext --inplace``)::

    python benchmarks/pipeline_scale.py [--requests N] [--shards 8] [--repeat 3] [--json PATH]

Workload: ``--shards`` models (default 8), one synthetic oracle-format trace
file and one engine configuration each, so 8 input files and 8 shards.  Each
trace has ``--requests`` requests (default 12,000) with 1,000-2,000 output
tokens, 150-1,300-token prompts sharing one of 64 prefixes, arriving about
every 5.5 engine steps: about 250 requests run at once (``max_num_seqs``
256, 8,192-token budget, 50,000 KV blocks), one shard replays in about
1.5 s, and the run lands about 0.6 million rows.

1. **Scaling.**  The same spec runs on a ``distributed.LocalCluster`` of 1
   and of 2 worker processes (one thread each), both started beforehand and
   passed as ``--scheduler ADDRESS``, so cluster start-up is not timed; runs
   alternate between the two.  The figure is the shard phase, from submitting
   the graph to the last shard's result (reading the 8 files, replaying the 8
   shards, shipping the Arrow results back), best of ``--repeat``.  Target: 2
   workers at least 1.8x faster than 1.  Both databases must be identical
   (bookkeeping columns aside).  For scale, the benchmark first measures the
   machine's own ceiling: how much faster 2 processes of pure-Python CPU
   work finish than 1 (a shared or throttled VM may not reach 2x).

2. **Landing rate.**  Rows landed per second of the landing transaction
   (schema and views, the runs row and ``INSERT ... SELECT`` from the Arrow
   tables of every shard, commit), as measured inside those runs, best of
   all of them.  Target: at least 1 million rows/s.

The last lines say PASS or FAIL per target; the exit status is 0 either way
(benchmark machines are noisy, and a 2-worker speed-up needs 2 idle cores).

**At scale** (``--scale N [N ...]``, not run by CI): a gateway's day of
``N`` requests of 4 models, each replayed on 2 engine configurations (8
shards), for every ``N`` given (e.g. ``--scale 1000000 10000000``).  The
traces are 4 Mooncake JSONL files with a ``model`` column (written by
DuckDB), about a third of the requests multi-turn sessions whose turns
share their prefix, arrivals every 10 ms per file; an engine step costs 10
ms.  Each run is a fresh driver process with a fresh ``LocalCluster`` of 1
and of 2 workers (``--workers``), so peak memory is per run: the driver's
(``ru_maxrss``, the Dask scheduler included) and the largest of its
workers'.  Printed: wall time, requests per second end to end, rows landed
per second of landing, and both peaks.  Targets: the driver under 1 GB at
any size; a worker's peak at the largest ``N`` within 1.5x of its peak at
the smallest; 2 workers at least 1.5x as many requests per second as 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # runnable from a checkout without installing
    sys.path.insert(0, REPO)

SPEEDUP_TARGET = 1.8
LANDING_TARGET = 1_000_000

ENGINE = {"num_gpu_blocks": 50000, "block_size": 16, "max_num_seqs": 256, "max_num_batched_tokens": 8192,
          "max_model_len": 4096}


def write_trace(path: str, n: int, seed: int) -> None:
    """An oracle-format trace of ``n`` requests (deterministic in ``seed``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    gaps = rng.integers(0, 12, n)
    groups = rng.integers(0, 64, n)
    prefix = rng.integers(128, 768, n)
    suffix = rng.integers(16, 512, n)
    out = rng.integers(1000, 2000, n)
    step = np.cumsum(gaps)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            fh.write(json.dumps({"request_id": f"r{i}", "prompt_len": int(prefix[i] + suffix[i]),
                                 "max_tokens": int(out[i]), "arrival_step": int(step[i]),
                                 "prefix_group": int(groups[i]), "prefix_len": int(prefix[i])}) + "\n")


def write_spec(root: str, shards: int, requests: int) -> str:
    with open(os.path.join(root, "engine.json"), "w", encoding="utf-8") as fh:
        json.dump(ENGINE, fh)
    lines = ['name = "scale"', 'database = "scale.duckdb"', ""]
    for i in range(shards):
        write_trace(os.path.join(root, f"model-{i}.jsonl"), requests, seed=1000 + i)
        lines += ["[[sources]]", f'paths = ["model-{i}.jsonl"]', 'format = "oracle"', f'model = "model-{i}"', ""]
    for i in range(shards):
        lines += ["[[deployments]]", f'model = "model-{i}"', 'engines = { base = "engine.json" }', ""]
    path = os.path.join(root, "scale.toml")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines))
    return path


def dump(db: str) -> dict:
    import duckdb

    from aisim.pipeline.landing import TABLES
    from aisim.pipeline.run import BOOKKEEPING

    con = duckdb.connect(db, read_only=True)
    try:
        out = {}
        for t in TABLES:
            cols = [r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE "
                                              "table_name = ? ORDER BY ordinal_position", [t]).fetchall()
                    if r[0] not in BOOKKEEPING.get(t, ())]
            out[t] = con.execute(f"SELECT {', '.join(cols)} FROM {t}").fetchall()
        return out
    finally:
        con.close()


def _summary(workers: int, startup: float, runs: list) -> dict:
    best, db = min(runs, key=lambda x: x[0].compute_s)
    return {
        "workers": workers,
        "cluster_start_s": startup,
        "shard_phase_s": best.compute_s,
        "shard_phase_all_s": [r.compute_s for r, _ in runs],
        "task_s_sum": sum(s["task_s"] for s in best.shards),
        "rows_landed": best.rows_landed,
        "land_s": [r.land_s for r, _ in runs],
        "landing_rows_s": [r.rows_landed / r.land_s for r, _ in runs],
        "wall_s": best.wall_s,
        "db": db,
        "requests": best.rows.get("requests", 0),
        "steps": best.rows.get("steps", 0),
    }


def run_both(spec: str, root: str, repeat: int) -> tuple:
    """Runs on a 1-worker and a 2-worker LocalCluster, alternating, ``repeat`` times each.

    Both clusters are started first and kept up, and the runs alternate, so a
    slow spell of a shared machine hits both worker counts alike.
    """
    import logging

    from distributed import LocalCluster

    from aisim.pipeline.graph import QUIET_CLUSTER
    from aisim.pipeline.run import run_pipeline

    clusters, startup = {}, {}
    try:
        for n in (1, 2):
            t0 = time.perf_counter()
            clusters[n] = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                       silence_logs=logging.ERROR, **QUIET_CLUSTER)
            startup[n] = time.perf_counter() - t0
        runs = {1: [], 2: []}
        for r in range(repeat):
            for n in (1, 2):
                db = os.path.join(root, f"w{n}-{r}.duckdb")
                report = run_pipeline(spec, scheduler=clusters[n].scheduler_address, database=db)
                runs[n].append((report, db))
                print(f"  run {r + 1}/{repeat}, {n} worker{'s' if n > 1 else ''}: shard phase "
                      f"{report.compute_s:.2f} s, landing {report.rows_landed / report.land_s / 1e6:.2f} M rows/s")
    finally:
        for c in clusters.values():
            c.close()
    return _summary(1, startup[1], runs[1]), _summary(2, startup[2], runs[2])


def _spin(n: int) -> int:
    s = 0
    for i in range(n):
        s += i
    return s


def machine_ceiling(repeat: int, n: int = 20_000_000) -> float:
    """What 2 processes of pure CPU work gain over 1 here (best of ``repeat``): the machine's own ceiling."""
    import multiprocessing as mp

    best1 = best2 = float("inf")
    with mp.get_context("spawn").Pool(2) as pool:
        for _ in range(repeat):
            t0 = time.perf_counter()
            pool.map(_spin, [n])
            best1 = min(best1, time.perf_counter() - t0)
            t0 = time.perf_counter()
            pool.map(_spin, [n, n])
            best2 = min(best2, time.perf_counter() - t0)
    return 2 * best1 / best2


# ---------------------------------------------------------------------------- at scale

SCALE_MODELS = 4
SCALE_FILES = 4
SCALE_ENGINES = {
    "wide": {"num_gpu_blocks": 60000, "block_size": 16, "max_num_seqs": 256, "max_num_batched_tokens": 8192,
             "max_model_len": 8192, "time_model": {"base_s": 0.01}},
    "narrow": {"num_gpu_blocks": 30000, "block_size": 16, "max_num_seqs": 128, "max_num_batched_tokens": 4096,
               "max_model_len": 8192, "time_model": {"base_s": 0.01}},
}


def write_scale_traces(root: str, n: int) -> list:
    """``SCALE_FILES`` Mooncake JSONL files of ``n`` requests in all (written by DuckDB, in arrival order).

    Row ``i`` of a file arrives at ``i * 10`` ms; a third of the rows are
    turns of sessions (one session every 3,000 rows, its turns 3,000 rows
    apart) whose hash ids are the session's, so a turn reuses the earlier
    turns' prefix; the rest have ids of their own, after a 2-block system
    prompt per model.  Prompts of 200-2,200 tokens, 20-150 output tokens.
    """
    import duckdb

    paths = []
    per = n // SCALE_FILES
    con = duckdb.connect()
    for f in range(SCALE_FILES):
        path = os.path.join(root, f"gateway-{f}.jsonl")
        rows = per + (n - per * SCALE_FILES if f == SCALE_FILES - 1 else 0)
        con.execute(f"""
            COPY (
              SELECT 1700000000000 + i * 10 AS timestamp,
                     200 + (hash(i, {f}) % 2000)::INTEGER AS input_length,
                     20 + (hash(i, {f}, 7) % 131)::INTEGER AS output_length,
                     CASE WHEN i % 3 = 0
                       THEN list_transform(range((200 + (hash(i, {f}) % 2000)::INTEGER + 511) // 512),
                                           lambda x: 1000000000::BIGINT * {f + 1} + (i % 3000) * 8 + x)
                       ELSE list_transform(range((200 + (hash(i, {f}) % 2000)::INTEGER + 511) // 512),
                                           lambda x: CASE WHEN x < 2 THEN (hash(i, {f}, 3) % {SCALE_MODELS}) * 2 + x
                                                          ELSE 100000000000::BIGINT * {f + 1} + i * 8 + x END)
                     END AS hash_ids,
                     CASE WHEN i % 3 = 0 THEN 's{f}-' || (i % 3000) END AS session_id,
                     'org/model-' || (hash(i, {f}, 3) % {SCALE_MODELS}) AS model
              FROM range({rows}) t(i)
            ) TO '{path}' (FORMAT JSON)""")
        paths.append(path)
    con.close()
    return paths


def write_scale_spec(root: str, n: int) -> str:
    t0 = time.perf_counter()
    write_scale_traces(root, n)
    print(f"setup: wrote {n:,} requests in {SCALE_FILES} Mooncake files "
          f"({sum(os.path.getsize(os.path.join(root, f)) for f in os.listdir(root)) / 1e9:.2f} GB) "
          f"in {time.perf_counter() - t0:.1f} s")
    lines = [f'name = "scale-{n}"', f'database = "scale-{n}.duckdb"', "",
             "[[sources]]", 'paths = ["gateway-*.jsonl"]', 'format = "mooncake"',
             'model_map = { ' + ", ".join(f'"org/model-{m}" = "model-{m}"' for m in range(SCALE_MODELS)) + " }", ""]
    for m in range(SCALE_MODELS):
        engines = ", ".join(f'{name} = {_toml_inline(cfg)}' for name, cfg in SCALE_ENGINES.items())
        lines += ["[[deployments]]", f'model = "model-{m}"', f"engines = {{ {engines} }}", ""]
    path = os.path.join(root, f"scale-{n}.toml")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines))
    return path


def _toml_inline(cfg: dict) -> str:
    items = []
    for k, v in cfg.items():
        items.append(f"{k} = {_toml_inline(v) if isinstance(v, dict) else json.dumps(v)}")
    return "{ " + ", ".join(items) + " }"


def child_run(spec: str, workers: int, out: str) -> None:
    """One run in this (fresh) process; writes its figures, with the peaks of this process and its workers."""
    import logging
    import resource

    from distributed import Client, LocalCluster

    from aisim.pipeline.graph import QUIET_CLUSTER
    from aisim.pipeline.run import run_pipeline

    t0 = time.perf_counter()
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, silence_logs=logging.ERROR,
                      **QUIET_CLUSTER) as cluster, Client(cluster) as client:
        report = run_pipeline(spec, scheduler=cluster.scheduler_address, force=True)
        peaks = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    wall = time.perf_counter() - t0
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"workers": workers, "wall_s": wall, "run_wall_s": report.wall_s, "compute_s": report.compute_s,
                   "land_s": report.land_s, "rows_landed": report.rows_landed, "rows_read": report.rows_read,
                   "requests": report.rows.get("requests", 0), "steps": report.rows.get("steps", 0),
                   "driver_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   "worker_peak_mb": max(peaks.values()) / 1024}, fh)


def run_scale(sizes: list, workers_list: list, keep: str | None) -> list:
    import subprocess

    results = []
    for n in sizes:
        root = keep or tempfile.mkdtemp(prefix=f"aisim-scale-{n}-")
        os.makedirs(root, exist_ok=True)
        try:
            spec = write_scale_spec(root, n)
            for w in workers_list:
                out = os.path.join(root, f"result-{w}.json")
                subprocess.run([sys.executable, os.path.abspath(__file__), "--child-run", spec, str(w), out],
                               check=True)
                with open(out, encoding="utf-8") as fh:
                    r = json.load(fh)
                r["n"] = n
                results.append(r)
                print(f"  {n:,} requests, {w} worker{'s' if w > 1 else ''}: wall {r['wall_s']:.1f} s "
                      f"({r['rows_read'] / r['run_wall_s']:,.0f} requests/s end to end; shards {r['compute_s']:.1f} s, "
                      f"landing {r['land_s']:.1f} s at {r['rows_landed'] / r['land_s']:,.0f} rows/s); "
                      f"peak RSS driver {r['driver_peak_mb']:,.0f} MB, worker {r['worker_peak_mb']:,.0f} MB",
                      flush=True)
        finally:
            if keep is None:
                import shutil

                shutil.rmtree(root, ignore_errors=True)
    return results


def report_scale(results: list) -> None:
    print()
    print(f"{'requests':>11}  {'workers':>7}  {'wall s':>7}  {'req/s':>9}  {'rows landed':>12}  {'landing rows/s':>14}  "
          f"{'driver MB':>9}  {'worker MB':>9}")
    for r in results:
        print(f"{r['n']:>11,}  {r['workers']:>7}  {r['run_wall_s']:>7.1f}  {r['rows_read'] / r['run_wall_s']:>9,.0f}  "
              f"{r['rows_landed']:>12,}  {r['rows_landed'] / r['land_s']:>14,.0f}  {r['driver_peak_mb']:>9,.0f}  "
              f"{r['worker_peak_mb']:>9,.0f}")
    print()
    driver = max(r["driver_peak_mb"] for r in results)
    print(f"{'PASS' if driver < 1024 else 'FAIL'}  driver peak RSS: {driver:,.0f} MB (target < 1,024 MB at any size)")
    sizes = sorted({r["n"] for r in results})
    if len(sizes) > 1:
        small = max(r["worker_peak_mb"] for r in results if r["n"] == sizes[0])
        big = max(r["worker_peak_mb"] for r in results if r["n"] == sizes[-1])
        print(f"{'PASS' if big <= 1.5 * small else 'FAIL'}  worker peak RSS at {sizes[-1]:,}: {big:,.0f} MB, "
              f"{big / small:.2f}x its peak at {sizes[0]:,} ({small:,.0f} MB; target <= 1.5x)")
    for n in sizes:
        by = {r["workers"]: r for r in results if r["n"] == n}
        if 1 in by and 2 in by:
            rate = {w: by[w]["rows_read"] / by[w]["run_wall_s"] for w in (1, 2)}
            ratio = rate[2] / rate[1]
            print(f"{'PASS' if ratio >= 1.5 else 'FAIL'}  {n:,} requests: 2 workers {ratio:.2f}x the requests/s "
                  f"of 1 ({rate[2]:,.0f} vs {rate[1]:,.0f}; target >= 1.5x)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=12000, help="requests per trace (default 12,000)")
    ap.add_argument("--shards", type=int, default=8, help="models = input files = shards (default 8)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per worker count; the best counts (default 5)")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--scale", type=int, nargs="+", metavar="N",
                    help="instead: gateway runs of N requests (4 models x 2 engines), e.g. 1000000 10000000")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="with --scale: cluster sizes (1 2)")
    ap.add_argument("--keep", metavar="DIR", help="with --scale: keep the traces and databases in DIR")
    ap.add_argument("--child-run", nargs=3, metavar=("SPEC", "WORKERS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_run:
        child_run(args.child_run[0], int(args.child_run[1]), args.child_run[2])
        return 0
    if args.scale:
        print(f"pipeline_scale at scale: {', '.join(f'{n:,}' for n in args.scale)} requests; "
              f"python {platform.python_version()}, {len(os.sched_getaffinity(0))} usable CPUs")
        results = run_scale(args.scale, args.workers, args.keep)
        report_scale(results)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(results, fh, indent=2)
        return 0

    print(f"pipeline_scale: {args.shards} shards x {args.requests:,} requests; python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable)")
    with tempfile.TemporaryDirectory(prefix="aisim-scale-") as root:
        t0 = time.perf_counter()
        spec = write_spec(root, args.shards, args.requests)
        print(f"setup: wrote {args.shards} traces in {time.perf_counter() - t0:.1f} s")
        ceiling = machine_ceiling(args.repeat)
        print(f"machine: 2 processes of pure CPU work run {ceiling:.2f}x faster than 1 (best of {args.repeat})")
        one, two = run_both(spec, root, args.repeat)
        same = dump(one["db"]) == dump(two["db"])
    speedup = one["shard_phase_s"] / two["shard_phase_s"]
    landing = max(one["landing_rows_s"] + two["landing_rows_s"])

    print()
    print(f"{'workers':>7}  {'cluster start':>13}  {'shard phase (best)':>18}  {'runs':>22}  {'task time sum':>13}  "
          f"{'wall':>6}")
    for r in (one, two):
        runs = ", ".join(f"{x:.2f}" for x in r["shard_phase_all_s"])
        print(f"{r['workers']:>7}  {r['cluster_start_s']:>11.2f} s  {r['shard_phase_s']:>16.2f} s  {runs:>22}  "
              f"{r['task_s_sum']:>11.2f} s  {r['wall_s']:>4.1f} s")
    print()
    print(f"rows landed per run: {one['rows_landed']:,} ({one['requests']:,} requests, {one['steps']:,} steps, "
          f"shards, summaries, runs)")
    rates = ", ".join(f"{x / 1e6:.2f}" for x in one["landing_rows_s"] + two["landing_rows_s"])
    print(f"landing rate per run (M rows/s): {rates}")
    print(f"databases of 1 and 2 workers identical: {same}")
    print()
    ok_speed = speedup >= SPEEDUP_TARGET and same
    ok_land = landing >= LANDING_TARGET
    print(f"{'PASS' if ok_speed else 'FAIL'}  speed-up of 2 workers over 1: {speedup:.2f}x "
          f"(target >= {SPEEDUP_TARGET}x; this machine's ceiling {ceiling:.2f}x{'' if same else '; databases differ'})")
    print(f"{'PASS' if ok_land else 'FAIL'}  landing rate: {landing:,.0f} rows/s (target >= {LANDING_TARGET:,})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"speedup": speedup, "machine_ceiling": ceiling, "landing_rows_s": landing, "identical": same,
                       "one": {k: v for k, v in one.items() if k != "db"},
                       "two": {k: v for k, v in two.items() if k != "db"}}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
