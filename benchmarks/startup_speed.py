"""How long does ``aisim replay`` take as a whole process, against Dynamo's mocker's whole process?

Run from the repository root after building the extension, with the mocker in another venv::

    python benchmarks/startup_speed.py --mocker-python /path/to/venv/bin/python [--runs N] [--json PATH]

On a short trace most of a replay's wall time is start-up: the interpreter, the imports, reading
the engine and the trace, printing the summary.  Each workload is replayed by ``aisim replay``
(the console script beside this interpreter, this checkout first on ``PYTHONPATH``, the summary
table on stdout) and by the mocker (``run_mocker_trace_replay``, its summary printed as JSON),
each as a new process, in turn (aisim, mocker, aisim, ...), ``--runs`` times after one warm-up
each.  Both run in this interpreter, so both pay the same interpreter start-up (``site`` and its
``.pth`` files): the mocker's packages come first on its ``PYTHONPATH``, from the environment of
``--mocker-python``.  Bytecode caches are written and used as an installed package's are
(``PYTHONDONTWRITEBYTECODE`` is dropped for both).  The engine is the one of
``benchmarks/mocker.py``: 128 sequences, an 8,192-token budget, 16,384 blocks (the mocker one
fewer: it has no null block), constant 10 ms steps; prompts of ``max_model_len`` or more are
rejected on both sides.

The workloads are the first 1,000, 100 and 10 requests of Mooncake's synthetic trace
(``tests/data/traces/mooncake``).  Printed: each side's median wall seconds and the median of the
paired ratios (aisim / mocker: below 1 is faster), and the interpreter alone (``-c pass``) for
scale; with ``--base CHECKOUT`` that checkout's ``aisim replay`` runs in the same rounds (its
median beside).  Target: the 1,000-request replay's process faster than the mocker's.  The last lines say
PASS or FAIL; the exit status is 0 either way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from mocker import PROCESS_SCRIPT, mocker_python  # noqa: E402

MOONCAKE = os.path.join(REPO, "tests", "data", "traces", "mooncake", "synthetic_trace.jsonl")
SIZES = (1000, 100, 10)
ENGINE = {"num_gpu_blocks": 16384, "block_size": 16, "max_num_seqs": 128, "max_num_batched_tokens": 8192,
          "max_model_len": 131072, "enable_prefix_caching": True, "kv_cache_groups": [{"type": "full"}]}
MOCKER_ENGINE = {k: ENGINE[k] for k in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len")}
MOCKER_ENGINE["num_gpu_blocks"] = ENGINE["num_gpu_blocks"] - 1


def aisim_command():
    """``aisim`` as a user runs it: the console script beside this interpreter, else the same entry point."""
    script = os.path.join(os.path.dirname(sys.executable), "aisim")
    if os.path.exists(script):
        return [script]
    return [sys.executable, "-c", "import sys; from aisim.cli import main; sys.exit(main())"]


def environment(first):
    """This environment with ``first`` first on the path and bytecode caches written."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = first + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def mocker_packages(python):
    """The folder that holds the ``dynamo`` package of ``python``'s environment."""
    code = "import dynamo._core as c, os; print(os.path.dirname(os.path.dirname(c.__file__)))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def wall(cmd):
    """One run's wall seconds (``cmd``: (argv, environment)); the command must succeed."""
    cmd, env = cmd
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed:\n{proc.stderr.decode(errors='replace')}")
    return t


def rotated(cmds, runs):
    """``runs`` rounds of every command, each round starting one further along, after one warm-up
    each: a list of times per command."""
    for c in cmds:
        wall(c)
    times = [[] for _ in cmds]
    for i in range(runs):
        for k in range(len(cmds)):
            j = (i + k) % len(cmds)
            times[j].append(wall(cmds[j]))
    return times


def head(n, out_dir):
    from mocker_workloads import head_lines

    return head_lines(MOONCAKE, n, out_dir)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=11, help="counted runs of each process (default 11)")
    ap.add_argument("--mocker-python", metavar="PYTHON", help="an interpreter with ai-dynamo-runtime installed")
    ap.add_argument("--base", metavar="CHECKOUT",
                    help="another checkout (built) whose aisim is timed in the same rounds, for before and after")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    mpy = mocker_python(args.mocker_python)
    if mpy is None:
        print("Dynamo's mocker: not installed here (pip install ai-dynamo-runtime, or --mocker-python)")
        return 0
    env_a, env_b = environment(REPO), environment(mocker_packages(mpy))
    rows, figures = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        engine = os.path.join(tmp, "engine.json")
        with open(engine, "w", encoding="utf-8") as fh:
            json.dump(ENGINE, fh)
        env_base = environment(os.path.abspath(args.base)) if args.base else None
        ta, tb = rotated([([sys.executable, "-c", "pass"], env_a), ([sys.executable, "-c", "pass"], env_b)], args.runs)
        rows.append(["interpreter alone (-c pass)", statistics.median(ta), statistics.median(tb),
                     statistics.median(x / y for x, y in zip(ta, tb)), None])
        for n in SIZES:
            trace = head(n, tmp)
            a = [*aisim_command(), "replay", "--engine", engine, "--trace", trace, "--reject-too-long"]
            job = {"kind": "mooncake", "path": trace, "trace_block_size": 512, "engine": MOCKER_ENGINE}
            b = [sys.executable, "-c", PROCESS_SCRIPT, json.dumps(job)]
            cmds = [(a, env_a), (b, env_b), *([(a, env_base)] if env_base else [])]
            ta, tb, *tc = rotated(cmds, args.runs)
            ratio = statistics.median(x / y for x, y in zip(ta, tb))
            base = statistics.median(tc[0]) if tc else None
            rows.append([f"replay of {n:,} Mooncake requests", statistics.median(ta), statistics.median(tb), ratio,
                         base])
            figures[n] = {"aisim_s": ta, "mocker_s": tb, "median_ratio": ratio, **({"base_s": tc[0]} if tc else {})}
    print(f"whole processes, median of {args.runs} alternated runs (after one warm-up each)")
    print(f"{'':<34}{'aisim s':>10}{'mocker s':>10}{'aisim/mocker':>14}" + (f"{'base s':>10}" if args.base else ""))
    for name, a, b, r, base in rows:
        print(f"{name:<34}{a:>10.3f}{b:>10.3f}{r:>13.2f}x" + (f"{base:>10.3f}" if base is not None else ""))
    r = figures[SIZES[0]]
    ok = statistics.median(r["aisim_s"]) < statistics.median(r["mocker_s"])
    print(f"{'PASS' if ok else 'FAIL'}  a {SIZES[0]:,}-request replay's process faster than the mocker's: "
          f"{statistics.median(r['aisim_s']):.3f} s against {statistics.median(r['mocker_s']):.3f} s "
          f"(median paired ratio {r['median_ratio']:.2f})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"runs": args.runs, "interpreter": rows[0][1:], "replays": figures}, fh, indent=2)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
