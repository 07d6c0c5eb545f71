"""How fast does aisim replay a trace?

Run from the repository root after building the extension
(``python setup.py build_ext --inplace``)::

    python benchmarks/replay_speed.py [--repeat N] [--json PATH] [--profile]

Two workloads are replayed, each ``--repeat`` times (default 5) after one
untimed warm-up, and the best wall time is reported (the median is printed
too).  Only the call ``replay(trace, eng)`` is timed: reading the trace file or
building the trace table is setup and is reported separately.  The cyclic
garbage collector is paused during each timed call, as :mod:`timeit` does.

1. ``bench_full`` -- the recorded oracle scenario in
   ``tests/data/oracle/scenarios/bench_full`` (2,000 requests with shared
   prefixes, 128 sequences, 2,048-token budget, 2,048 KV blocks).  Reported as
   simulated requests per second and as microseconds per *scheduled
   request-step* (wall time / ``summary['scheduled_req_steps']``, one request
   scheduled in one engine step).  Reference: vLLM 0.32.0's own scheduler,
   driven without a model, runs this scenario at 480 requests/s, i.e. 15.75 us
   per scheduled request-step.  Target: aisim at least 100x faster.

2. ``synthetic`` -- 1,000 distinct requests (one private token stream each,
   no prefix sharing), 1,024 prompt and 128 output tokens, all arriving at
   step 0, concurrency 16 (``max_num_seqs`` 16, 8,192-token budget,
   ``max_model_len`` 4,096, prefix caching on, one full-attention group, block
   size 16) and enough KV blocks that capacity never limits.  Reference: the
   fastest known simulator does 58,000 requests/s on this shape.  Target:
   at least 60,000 requests/s.

3. ``mooncake`` -- the Mooncake sample trace in ``tests/data/traces/mooncake`` (3,993 requests,
   long prompts, 512-token hash blocks), 128 sequences, an 8,192-token budget, 8,192 usable blocks,
   prompts of ``max_model_len`` (131,072) or more rejected; and ``decode_heavy`` -- 2,000
   requests of 512 prompt and 1,024 output tokens, eight arriving per step, 256 sequences.

Macro-steps (a quiet stretch of decoding replayed in one move, ``replay(..., macro_steps=...)``)
are on in every figure above; a second table times each workload with them on and off in
alternated pairs and prints the median of the paired ratios (off / on).  Targets: >= 5x and
>= 300,000 requests/s on ``synthetic``, >= 3x on ``bench_full`` and ``mooncake``, no workload
slower (median ratio >= 0.95).  The table also says how each workload's steps fell into
stretches (``Engine.macro_counts``): how many, their mean length in steps, and the share of steps
they covered; a stretch ends with every admission and every finish, so short stretches bound
what macro-steps can save.  Its last columns replay the same requests with one output token each
(``decode-free``): every prompt is still prefilled, cached, admitted and finished, but nothing
decodes, so no way of replaying decodes faster gets below that time, and best off over it
(``bound``) is the most any macro-step could give the workload.

When Dynamo's mocker is installed (here, or in the interpreter given by ``--mocker-python``), it
replays every target workload with the same engine in the same run (``mocker_workloads.py``):
``synthetic``, the first 3,000 and all of Mooncake's conversation trace (``--conversation``; skipped,
saying where to get it, when absent), Mooncake's synthetic trace and Azure's code trace on a pool
that churns; each side's median of ``--repeat`` runs, ``mocker / aisim`` and a PASS or FAIL line
against 5x.  ``--mocker-only`` runs that section alone.

A third table splits the best ``replay`` call into the compiled core
(``Engine(...)`` construction and ``Engine.run()``, which includes handing the
result columns over to numpy) and the Python around it (validation, Arrow to numpy
conversion, the result tables and the summary).  ``--profile`` additionally
prints a cProfile of the synthetic replay.

The last lines say PASS or FAIL per target.  The exit status is 0 either way:
benchmark machines are noisy and the ratios are what matter.  A workload that
did not replay as described (unfinished requests, preemptions where none are
possible) is reported as FAIL with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # runnable from a checkout without installing
    sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import pyarrow  # noqa: E402

import aisim._core.engine as core_engine  # noqa: E402
from aisim.config.engine import engine_config_from_dict, load_engine_config  # noqa: E402
from aisim.replay import replay  # noqa: E402
from aisim.traces import read_oracle_trace, read_trace  # noqa: E402
from aisim.traces.schema import stream_id, trace_table  # noqa: E402

import mocker_workloads as vs_mocker  # noqa: E402

SCENARIO = os.path.join(REPO, "tests", "data", "oracle", "scenarios", "bench_full")
MOONCAKE = os.path.join(REPO, "tests", "data", "traces", "mooncake", "synthetic_trace.jsonl")

# Reference figures.
VLLM_REQ_S = 480.0  # vLLM 0.32.0 scheduler on bench_full
VLLM_US_PER_REQ_STEP = 15.75  # the same, per scheduled request-step
TARGET_SPEEDUP = 100.0  # aisim / vLLM on bench_full
FASTEST_SIM_REQ_S = 58_000.0  # fastest known simulator on the synthetic shape
TARGET_SYNTH_REQ_S = 60_000.0
# Macro-steps against single steps (median of paired ratios), and the synthetic shape's rate with them.
TARGET_MACRO = {"synthetic": 5.0, "bench_full": 3.0, "mooncake": 3.0}
TARGET_MACRO_SYNTH_REQ_S = 300_000.0
NOT_SLOWER = 0.95

# Synthetic workload shape.
SYN_REQUESTS = 1_000
SYN_PROMPT = 1_024
SYN_OUTPUT = 128
SYN_CONCURRENCY = 16
SYN_BLOCK = 16
SYN_SLACK_BLOCKS = 64


# ----------------------------------------------------------------- workloads


def bench_full_workload():
    """The oracle scenario: (engine config, trace table, parse seconds)."""
    t0 = time.perf_counter()
    eng = load_engine_config(os.path.join(SCENARIO, "config.json"))
    trace = read_oracle_trace(os.path.join(SCENARIO, "trace.jsonl"), eng.max_model_len)
    return eng, trace, time.perf_counter() - t0


def synthetic_workload(groups=({"type": "full"},), block_size=SYN_BLOCK, unit=None):
    """The synthetic shape: (engine config, trace table, build seconds).

    ``groups`` selects the KV-cache layout; the grouped variants replay the same
    requests so their cost per request-step compares with the single group's.
    """
    # Every running sequence can hold its whole prompt + output at once in
    # every group, plus slack; vLLM's null block 0 is inside the slack.
    blocks_per_seq = len(groups) * -(-(SYN_PROMPT + SYN_OUTPUT) // block_size) + 4
    eng = engine_config_from_dict(
        {
            "num_gpu_blocks": SYN_CONCURRENCY * blocks_per_seq + SYN_SLACK_BLOCKS,
            "block_size": block_size,
            "max_num_seqs": SYN_CONCURRENCY,
            "max_num_batched_tokens": 8192,
            "max_model_len": 4096,
            "enable_prefix_caching": True,
            "kv_cache_groups": list(groups),
            **({"prefix_match_unit": unit, "vllm_version": "0.32.0"} if unit else {}),
        },
        source="synthetic",
    )
    t0 = time.perf_counter()
    ids = [f"syn{i}" for i in range(SYN_REQUESTS)]
    n = len(ids)
    rows = {
        "request_id": ids,
        "arrival_step": [0] * n,
        "arrival_s": [None] * n,
        "prompt_tokens": [SYN_PROMPT] * n,
        "output_tokens": [SYN_OUTPUT] * n,
        "priority": [0] * n,
        # One private stream per request: no two prompts share a token.
        "segments": [[(stream_id("prompt", rid), 0, SYN_PROMPT)] for rid in ids],
    }
    trace = trace_table(rows, "step")
    return eng, trace, time.perf_counter() - t0


GROUP_EVIDENCE = {"prefix_cacheable": True, "page_size_bytes": 4096}


def hybrid_mamba_workload():
    """Full attention + Mamba state in align mode (64-token blocks), same requests."""
    return synthetic_workload(({"type": "full", **GROUP_EVIDENCE},
                               {"type": "mamba", "prefill_checkpoint_blocks": 0, **GROUP_EVIDENCE}),
                              block_size=64, unit=64)


def sliding_window_workload():
    """Full attention + a 128-token sliding window, same requests."""
    return synthetic_workload(({"type": "full", **GROUP_EVIDENCE},
                               {"type": "sliding_window", "sliding_window": 128, **GROUP_EVIDENCE}), unit=16)


def mooncake_workload():
    """The Mooncake sample trace on a 128-sequence engine: (engine config, trace table, read seconds).

    8,193 blocks: vLLM's null block and 8,192 usable, what one request of ``max_model_len`` needs.
    """
    eng = engine_config_from_dict(
        {"num_gpu_blocks": 8193, "block_size": 16, "max_num_seqs": 128, "max_num_batched_tokens": 8192,
         "max_model_len": 131072, "enable_prefix_caching": True, "kv_cache_groups": [{"type": "full"}]},
        source="mooncake")
    t0 = time.perf_counter()
    trace = read_trace(MOONCAKE)
    return eng, trace, time.perf_counter() - t0


def decode_heavy_workload():
    """2,000 requests of 512 prompt and 1,024 output tokens, 256 sequences: (engine, trace, seconds)."""
    n, prompt, output, seqs = 2000, 512, 1024, 256
    eng = engine_config_from_dict(
        {"num_gpu_blocks": seqs * (-(-(prompt + output) // SYN_BLOCK) + 2) + SYN_SLACK_BLOCKS,
         "block_size": SYN_BLOCK, "max_num_seqs": seqs, "max_num_batched_tokens": 8192, "max_model_len": 4096,
         "enable_prefix_caching": True, "kv_cache_groups": [{"type": "full"}]},
        source="decode_heavy")
    t0 = time.perf_counter()
    ids = [f"dh{i}" for i in range(n)]
    rows = {"request_id": ids, "arrival_step": [i // 8 for i in range(n)], "arrival_s": [None] * n,
            "prompt_tokens": [prompt] * n, "output_tokens": [output] * n, "priority": [0] * n,
            "segments": [[(stream_id("prompt", rid), 0, prompt)] for rid in ids]}
    return eng, trace_table(rows, "step"), time.perf_counter() - t0


def check_grouped(res):
    s = res.summary
    if s["finished"] != s["requests"]:
        return f"{s['unfinished']} request(s) unfinished"
    if s["preemptions"]:
        return f"{s['preemptions']} preemption(s): KV capacity limited the replay"
    return None


def check_bench_full(res):
    s = res.summary
    if s["finished"] != s["requests"]:
        return f"{s['unfinished']} request(s) unfinished"
    return None


def check_synthetic(res):
    s = res.summary
    if s["finished"] != s["requests"]:
        return f"{s['unfinished']} request(s) unfinished"
    if s["preemptions"]:
        return f"{s['preemptions']} preemption(s): KV capacity limited the replay"
    running = int(np.max(res.steps.column("num_reqs").to_numpy(zero_copy_only=False)))
    if running != SYN_CONCURRENCY:
        return f"peak concurrency {running}, expected {SYN_CONCURRENCY}"
    if s["prefix_hit_tokens_at_admission"]:
        return "prefix-cache hits in a workload without shared tokens"
    return None


# ------------------------------------------------------------------- timing


@contextlib.contextmanager
def _gc_paused():
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def time_replay(trace, eng, repeat):
    """Best-of-``repeat`` wall time of ``replay(trace, eng)``: (times, last result)."""
    res = replay(trace, eng)  # warm-up: imports, allocator, caches
    times = []
    for _ in range(repeat):
        with _gc_paused():
            t0 = time.perf_counter()
            res = replay(trace, eng)
            times.append(time.perf_counter() - t0)
    return times, res


def time_macro(trace, eng, repeat, **kw):
    """Macro-steps on and off in alternated pairs: best on, best off, median of off/on, requests."""
    replay(trace, eng, macro_steps=False, **kw)  # warm-up
    on, off, ratios = [], [], []
    for _ in range(repeat):
        pair = {}
        for macro in (True, False):
            with _gc_paused():
                t0 = time.perf_counter()
                res = replay(trace, eng, macro_steps=macro, **kw)
                pair[macro] = time.perf_counter() - t0
        on.append(pair[True])
        off.append(pair[False])
        ratios.append(pair[False] / pair[True])
    counts = macro_counts(trace, eng, **kw)
    return {"best_on_s": min(on), "best_off_s": min(off), "median_ratio": statistics.median(ratios),
            "requests": res.summary["requests"], "steps": res.summary["steps"],
            "stretches": counts["stretches"] if counts else None,
            "stretch_steps": counts["steps"] if counts else None,
            "decode_free_s": time_decode_free(trace, eng, repeat, **kw)}


def time_decode_free(trace, eng, repeat, **kw):
    """Best wall time of the same requests with one output token each: every prompt is still
    prefilled, cached, admitted and finished, and the Python around the core is the same, but
    nothing decodes.  No way of replaying decodes faster takes a replay below it, so best off
    over it bounds the macro-step ratio."""
    i = trace.schema.get_field_index("output_tokens")
    one = trace.set_column(i, trace.schema.field(i), pyarrow.array([1] * trace.num_rows, pyarrow.int32()))
    replay(one, eng, **kw)  # warm-up
    times = []
    for _ in range(repeat):
        with _gc_paused():
            t0 = time.perf_counter()
            replay(one, eng, **kw)
            times.append(time.perf_counter() - t0)
    return min(times)


def macro_counts(trace, eng, **kw):
    """The stretches one replay with macro-steps takes and the engine steps they cover
    (``Engine.macro_counts``), or None when ``replay`` no longer goes through ``Engine``."""
    real = core_engine.Engine
    timer = _TimedEngine(real)
    core_engine.Engine = timer
    try:
        replay(trace, eng, **kw)
    finally:
        core_engine.Engine = real
    return timer.macro


class _TimedEngine:
    """Stands in for ``aisim._core.engine.Engine`` and times its two calls."""

    def __init__(self, real):
        self.real = real
        self.init_s = self.run_s = self.macro = None

    def __call__(self, config, trace, **kwargs):
        t0 = time.perf_counter()
        engine = self.real(config, trace, **kwargs)
        self.init_s = time.perf_counter() - t0
        outer = self

        class _Run:
            def run(self):
                t1 = time.perf_counter()
                out = engine.run()
                outer.run_s = time.perf_counter() - t1
                outer.macro = engine.macro_counts
                return out

        return _Run()


def time_phases(trace, eng, repeat):
    """Split ``replay`` into core construction, core run and Python overhead.

    ``replay`` imports ``Engine`` from :mod:`aisim._core.engine` on each call,
    so the module attribute is swapped for a timing wrapper for the duration
    of these runs (and restored).  Returns the breakdown of the fastest run,
    or None when ``replay`` no longer goes through that door.
    """
    real = core_engine.Engine
    best = None
    try:
        for _ in range(repeat):
            timer = _TimedEngine(real)
            core_engine.Engine = timer
            with _gc_paused():
                t0 = time.perf_counter()
                replay(trace, eng)
                total = time.perf_counter() - t0
            if timer.run_s is None:
                return None
            if best is None or total < best["total_s"]:
                best = {
                    "total_s": total,
                    "engine_init_s": timer.init_s,
                    "engine_run_s": timer.run_s,
                    "python_s": total - timer.init_s - timer.run_s,
                }
    finally:
        core_engine.Engine = real
    return best


def profile_replay(trace, eng, repeat, top=20):
    """cProfile text of ``repeat`` replays, sorted by own time."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(repeat):
        replay(trace, eng)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


# -------------------------------------------------------------------- report


def machine_info():
    info = {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": platform.processor() or None,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pyarrow": pyarrow.__version__,
        "platform": platform.platform(),
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        if rev.returncode == 0:
            info["git"] = rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def figures(name, times, res, setup_s, phases, problem):
    s = res.summary
    best = min(times)
    return {
        "workload": name,
        "requests": s["requests"],
        "finished": s["finished"],
        "steps": s["steps"],
        "scheduled_req_steps": s["scheduled_req_steps"],
        "scheduled_tokens": s["scheduled_tokens"],
        "preemptions": s["preemptions"],
        "setup_s": setup_s,
        "times_s": times,
        "best_s": best,
        "median_s": statistics.median(times),
        "req_per_s": s["requests"] / best,
        "us_per_req_step": best / s["scheduled_req_steps"] * 1e6 if s["scheduled_req_steps"] else None,
        "phases": phases,
        "problem": problem,
    }


def _stretch_note(m):
    """How a workload's steps fell into stretches: how many, their mean length, the share covered."""
    if not m.get("stretches"):
        return "none"
    return f"{m['stretches']:,} ({m['stretch_steps'] / m['stretches']:.1f}, {m['stretch_steps'] / m['steps']:.0%})"


def _table(header, rows):
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    fmt = lambda cells: "  ".join(  # noqa: E731
        str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    lines = [fmt(header), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in rows]
    return "\n".join(lines)


def mocker_section(args, workloads):
    """aisim against Dynamo's mocker on every target workload, same run: the table's rows, or None."""
    import tempfile

    syn, syn_trace, _ = synthetic_workload()  # built in memory once, as the mocker builds its requests
    with tempfile.TemporaryDirectory() as tmp:
        found, skipped = vs_mocker.target_workloads(tmp, args.conversation)
        rows = vs_mocker.compare(
            [vs_mocker.Workload("synthetic", syn, lambda: syn_trace,
                                vs_mocker.synthetic_job(SYN_PROMPT, SYN_OUTPUT, SYN_REQUESTS),
                                note="1,000 x 1,024/128, concurrency 16"),
             *found[:2],
             vs_mocker.mooncake_file_workload("mooncake_synthetic", MOONCAKE, workloads["mooncake"].num_gpu_blocks,
                                              "Mooncake's synthetic trace, 8,193 blocks"),
             *found[2:]],
            args.repeat, args.mocker_python)
    if rows is None:
        print("Dynamo's mocker: not installed here (pip install ai-dynamo-runtime, or --mocker-python)")
        return None
    print(_table(vs_mocker.TABLE_HEADER, vs_mocker.table_rows(rows)))
    for line in skipped:
        print(f"SKIP  {line}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="timed replays per workload (best is reported)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the synthetic replay")
    ap.add_argument("--mocker-python", metavar="PYTHON",
                    help="an interpreter with ai-dynamo-runtime installed, to time Dynamo's mocker too")
    ap.add_argument("--conversation", metavar="PATH",
                    help="Mooncake's conversation_trace.jsonl (default: benchmarks/data/mooncake/, then "
                         "../shared/traces/mooncake/ beside the checkout)")
    ap.add_argument("--mocker-only", action="store_true",
                    help="only the comparison with Dynamo's mocker (its PASS/FAIL lines)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")

    info = machine_info()
    print(f"aisim replay speed  |  {info['cpu_count']} cores ({info['cpus_usable']} usable), "
          f"{info['cpu_model']}  |  Python {info['python']}, numpy {info['numpy']}, "
          f"pyarrow {info['pyarrow']}  |  git {info.get('git', '?')}  |  best of {args.repeat}")
    print()
    if args.mocker_only:
        engines = {"synthetic": synthetic_workload()[0], "mooncake": mooncake_workload()[0]}
        mock = mocker_section(args, engines)
        targets = print_verdicts(vs_mocker.verdicts(mock or []))
        if args.json:
            write_json(args.json, {"machine": info, "repeat": args.repeat, "mocker": mock, "targets": targets})
        return 0

    results = {}
    for name, build, check in (("bench_full", bench_full_workload, check_bench_full),
                               ("synthetic", synthetic_workload, check_synthetic),
                               ("hybrid_mamba", hybrid_mamba_workload, check_grouped),
                               ("sliding_window", sliding_window_workload, check_grouped)):
        eng, trace, setup_s = build()
        times, res = time_replay(trace, eng, args.repeat)
        phases = time_phases(trace, eng, args.repeat)
        results[name] = figures(name, times, res, setup_s, phases, check(res))
        if args.profile and name == "synthetic":
            profile_text = profile_replay(trace, eng, args.repeat)

    bf, sy = results["bench_full"], results["synthetic"]
    hy, sw = results["hybrid_mamba"], results["sliding_window"]
    for r in (hy, sw):
        r["cost_vs_single_group"] = r["us_per_req_step"] / sy["us_per_req_step"]
    bf["speedup_vs_vllm"] = bf["req_per_s"] / VLLM_REQ_S
    bf["speedup_vs_vllm_per_req_step"] = VLLM_US_PER_REQ_STEP / bf["us_per_req_step"]
    sy["ratio_vs_fastest_sim"] = sy["req_per_s"] / FASTEST_SIM_REQ_S

    rows = []
    for r in (bf, sy, hy, sw):
        rows.append([
            r["workload"], f"{r['requests']:,}", f"{r['steps']:,}", f"{r['scheduled_req_steps']:,}",
            f"{r['setup_s'] * 1e3:.1f}", f"{r['best_s'] * 1e3:.2f}", f"{r['median_s'] * 1e3:.2f}",
            f"{r['req_per_s']:,.0f}", f"{r['us_per_req_step']:.4f}",
        ])
    print(_table(["workload", "requests", "steps", "req-steps", "setup ms", "best ms", "median ms",
                  "req/s", "us/req-step"], rows))
    print()
    print(_table(
        ["reference", "theirs", "aisim", "ratio", "target"],
        [
            ["bench_full vs vLLM 0.32.0 req/s", f"{VLLM_REQ_S:,.0f}", f"{bf['req_per_s']:,.0f}",
             f"{bf['speedup_vs_vllm']:,.1f}x", f">= {TARGET_SPEEDUP:.0f}x"],
            ["bench_full vs vLLM 0.32.0 us/req-step", f"{VLLM_US_PER_REQ_STEP:.2f}",
             f"{bf['us_per_req_step']:.4f}", f"{bf['speedup_vs_vllm_per_req_step']:,.1f}x",
             f">= {TARGET_SPEEDUP:.0f}x"],
            ["synthetic vs fastest simulator req/s", f"{FASTEST_SIM_REQ_S:,.0f}", f"{sy['req_per_s']:,.0f}",
             f"{sy['ratio_vs_fastest_sim']:.2f}x", f">= {TARGET_SYNTH_REQ_S:,.0f} req/s"],
            ["hybrid_mamba us/req-step vs synthetic", f"{sy['us_per_req_step']:.4f}",
             f"{hy['us_per_req_step']:.4f}", f"{hy['cost_vs_single_group']:.2f}x", "<= 2x"],
            ["sliding_window us/req-step vs synthetic", f"{sy['us_per_req_step']:.4f}",
             f"{sw['us_per_req_step']:.4f}", f"{sw['cost_vs_single_group']:.2f}x", "<= 2x"],
        ],
    ))
    print()
    if all(r["phases"] for r in (bf, sy, hy, sw)):
        rows = []
        for r in (bf, sy, hy, sw):
            p = r["phases"]
            pct = lambda x: f"{x * 1e3:.2f} ({100 * x / p['total_s']:.0f}%)"  # noqa: E731
            rows.append([r["workload"], f"{p['total_s'] * 1e3:.2f}", pct(p["engine_init_s"]),
                         pct(p["engine_run_s"]), pct(p["python_s"])])
        print(_table(["where time goes (ms)", "replay", "Engine()", "Engine.run", "Python"], rows))
    else:
        print("where time goes: n/a (replay no longer calls aisim._core.engine.Engine)")
    print()
    macro = {}
    workloads = {}
    for name, build in (("bench_full", bench_full_workload), ("synthetic", synthetic_workload),
                        ("hybrid_mamba", hybrid_mamba_workload), ("sliding_window", sliding_window_workload),
                        ("mooncake", mooncake_workload), ("decode_heavy", decode_heavy_workload)):
        eng, trace, _ = build()
        workloads[name] = eng
        macro[name] = time_macro(trace, eng, args.repeat, reject_too_long=name == "mooncake")
    rows = [[name, f"{m['requests']:,}", f"{m['steps']:,}", _stretch_note(m), f"{m['best_off_s'] * 1e3:.2f}",
             f"{m['best_on_s'] * 1e3:.2f}", f"{m['requests'] / m['best_on_s']:,.0f}", f"{m['median_ratio']:.2f}x",
             f">= {TARGET_MACRO[name]:.0f}x" if name in TARGET_MACRO else f">= {NOT_SLOWER}x",
             f"{m['decode_free_s'] * 1e3:.2f}", f"{m['best_off_s'] / m['decode_free_s']:.2f}x"]
            for name, m in macro.items()]
    print(_table(["macro-steps (paired)", "requests", "steps", "stretches (steps each, covered)", "off ms",
                  "on ms", "on req/s", "off/on", "target", "decode-free ms", "bound"], rows))
    print()
    mock = mocker_section(args, workloads)
    print()
    if args.profile:
        print(f"cProfile of {args.repeat} synthetic replays (sorted by own time):")
        print(profile_text)

    verdicts = [
        ("bench_full >= 100x vLLM 0.32.0", bf["speedup_vs_vllm"] >= TARGET_SPEEDUP, bf["problem"],
         f"{bf['speedup_vs_vllm']:,.1f}x ({bf['req_per_s']:,.0f} req/s, {bf['us_per_req_step']:.4f} us/req-step)"),
        ("synthetic >= 60,000 req/s", sy["req_per_s"] >= TARGET_SYNTH_REQ_S, sy["problem"],
         f"{sy['req_per_s']:,.0f} req/s ({sy['ratio_vs_fastest_sim']:.2f}x the fastest known simulator)"),
        ("hybrid_mamba within 2x of the single group", hy["cost_vs_single_group"] <= 2.0, hy["problem"],
         f"{hy['cost_vs_single_group']:.2f}x ({hy['req_per_s']:,.0f} req/s)"),
        ("sliding_window within 2x of the single group", sw["cost_vs_single_group"] <= 2.0, sw["problem"],
         f"{sw['cost_vs_single_group']:.2f}x ({sw['req_per_s']:,.0f} req/s)"),
    ]
    for name, m in macro.items():
        goal = TARGET_MACRO.get(name, NOT_SLOWER)
        verdicts.append((f"{name}: macro-steps >= {goal}x single steps", m["median_ratio"] >= goal, None,
                         f"{m['median_ratio']:.2f}x (median of {args.repeat} pairs; decode-free bound "
                         f"{m['best_off_s'] / m['decode_free_s']:.2f}x)"))
    syn = macro["synthetic"]
    verdicts.append(("synthetic with macro-steps >= 300,000 req/s",
                     syn["requests"] / syn["best_on_s"] >= TARGET_MACRO_SYNTH_REQ_S, None,
                     f"{syn['requests'] / syn['best_on_s']:,.0f} req/s"))
    verdicts += vs_mocker.verdicts(mock or [])
    targets = print_verdicts(verdicts)

    if args.json:
        write_json(args.json, {
            "machine": info,
            "repeat": args.repeat,
            "references": {
                "vllm_0_32_0_bench_full_req_s": VLLM_REQ_S,
                "vllm_0_32_0_bench_full_us_per_req_step": VLLM_US_PER_REQ_STEP,
                "fastest_sim_synthetic_req_s": FASTEST_SIM_REQ_S,
            },
            "workloads": results,
            "macro_steps": macro,
            "mocker": mock,
            "targets": targets,
        })
    return 0


def print_verdicts(verdicts):
    """One PASS or FAIL line per (label, ok, problem, detail); {label: passed}."""
    targets = {}
    for label, ok, problem, detail in verdicts:
        passed = ok and problem is None
        targets[label] = passed
        why = f"; invalid run: {problem}" if problem else ""
        print(f"{'PASS' if passed else 'FAIL'}  {label}: {detail}{why}")
    return targets


def write_json(path, doc):
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")


if __name__ == "__main__":
    sys.exit(main())
