"""Is this checkout's replay as fast as another one's?  Both builds, one run, ratios.

Run from the repository root after building the extension here and in the
other checkout (``python setup.py build_ext --inplace`` in each)::

    python benchmarks/replay_speed_compare.py --base PATH [--rounds N] [--repeat R] [--json PATH]

``PATH`` is another checkout (for instance ``git worktree add /tmp/base main``
or ``git archive main | tar -x -C /tmp/base``, built there).  Each round runs
``benchmarks/replay_speed.py --repeat R`` once in the base checkout and once
here, alternating which goes first, each in its own process; a workload's
figure is its best time over every round.  A shared machine's noise only ever
slows a run down, so the best of many alternated runs compares the two builds
under the same conditions.  The table gives both best times and the ratio
(this checkout / base: below 1 is faster); the exit status is 0 either way.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _one(checkout: str, repeat: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "figures.json")
        subprocess.run([sys.executable, os.path.join(checkout, "benchmarks", "replay_speed.py"),
                        "--repeat", str(repeat), "--json", out],
                       cwd=checkout, check=True, stdout=subprocess.DEVNULL)
        with open(out, encoding="utf-8") as fh:
            return json.load(fh)["workloads"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the other checkout (built)")
    ap.add_argument("--rounds", type=int, default=4, help="alternated runs of each build (default 4)")
    ap.add_argument("--repeat", type=int, default=5, help="timed replays per workload and run (default 5)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.repeat < 1:
        ap.error("--rounds and --repeat must be at least 1")
    base = os.path.abspath(args.base)
    best = {"base": {}, "this": {}}
    for r in range(args.rounds):
        order = (("base", base), ("this", HERE)) if r % 2 == 0 else (("this", HERE), ("base", base))
        for label, checkout in order:
            for name, w in _one(checkout, args.repeat).items():
                prev = best[label].get(name)
                best[label][name] = w["best_s"] if prev is None else min(prev, w["best_s"])
    names = [n for n in best["base"] if n in best["this"]]
    print(f"best of {args.rounds} alternated runs x {args.repeat} replays  |  base {base}")
    print(f"{'workload':<16}{'base ms':>10}{'this ms':>10}{'ratio':>8}")
    ratios = {}
    for n in names:
        ratios[n] = best["this"][n] / best["base"][n]
        print(f"{n:<16}{best['base'][n] * 1e3:>10.2f}{best['this'][n] * 1e3:>10.2f}{ratios[n]:>8.3f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"base": base, "rounds": args.rounds, "repeat": args.repeat, "best_s": best,
                       "ratio": ratios}, fh, indent=2)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
