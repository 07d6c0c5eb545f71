"""Fuzz every trace reader, configuration loader and spec parser for long: the CI test's targets, many examples.

::

    python benchmarks/fuzz_readers.py --examples 10000            # every target
    python benchmarks/fuzz_readers.py --examples 2000 --only oracle --only azure

Each target (``tests/fuzzing.py``) must read what Hypothesis draws to a valid object or raise
``aisim.errors.InputError`` naming the file; the script prints, per target, the examples run, the
time taken and the first failure Hypothesis found (shrunk), and exits 1 when any target failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]


def main(argv=None) -> int:
    from hypothesis import HealthCheck, given, seed, settings

    from fuzzing import targets

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=10000, help="examples per target (default 10000)")
    ap.add_argument("--only", action="append", help="run only this target (repeatable)")
    ap.add_argument("--seed", type=int, default=0, help="Hypothesis seed (default 0)")
    args = ap.parse_args(argv)
    failed = 0
    for target in targets():
        if args.only and target.name not in args.only:
            continue
        count = {"n": 0}
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as workdir:
            @seed(args.seed)
            @settings(max_examples=args.examples, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(target.strategy)
            def check(value):
                count["n"] += 1
                target.check(value, workdir)

            try:
                check()
                verdict = "ok"
            except Exception as exc:  # what Hypothesis found, shrunk
                failed += 1
                verdict = "FAILED: " + "".join(traceback.format_exception_only(type(exc), exc)).strip()
        print(f"{target.name:16s} {count['n']:7d} examples {time.perf_counter() - t0:8.1f} s  {verdict}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
