"""How fast does aisim read a Mooncake JSONL trace?

Run from the repository root::

    python benchmarks/trace_read_speed.py [--rows 500000] [--repeat 3] [--keep PATH] [--sample PATH]

Workload: one Mooncake JSONL file of ``--rows`` requests shaped like the
gateway traces of ``benchmarks/pipeline_scale.py --scale`` (seeded, so the
same bytes every run): a ``model`` column of 4 models, arrivals every 10 ms,
prompts of 200-2,199 tokens and 20-150 output tokens; a third of the rows
are turns of sessions (one session every 3,000 rows) whose hash ids are the
session's, the rest carry a 2-block system prompt of their model and ids of
their own.  Lines are written as DuckDB writes JSON (no spaces, ``null``
for an absent session).

Figures, one process, one core:

- **whole read**: :func:`aisim.traces.read_trace` from file to trace table,
  best of ``--repeat``; rows per second.  Target: at least 1,000,000.
- **phases** (one more read, step by step, as
  :func:`aisim.traces.blockread.read_blocks` runs them): the block texts
  from the file, the Arrow parse alone (``pyarrow.json`` on the same
  blocks), the stream ids alone (every block's distinct hash ids), the rest
  of the blocks' parse (checks and segment arrays), the resolve pass, and
  finish (arrivals, sort, concatenation); each as rows per second of its
  own time.

``--sample PATH`` also times the whole read of another Mooncake file (e.g.
the published sample in ``tests/data/traces/mooncake``).  The last line
says PASS or FAIL; the exit status is 0 either way (benchmark machines are
noisy).  Profile a run with ``python -m cProfile -s cumtime
benchmarks/trace_read_speed.py --repeat 1``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # runnable from a checkout without installing
    sys.path.insert(0, REPO)

TARGET = 1_000_000
MODELS = 4
SESSION_EVERY = 3  # every third row is a session's turn
SESSIONS = 3000  # rows i and i + 3000 * k are turns of one session


def write_gateway(path: str, n: int, seed: int = 0) -> None:
    """A gateway-shaped Mooncake JSONL trace of ``n`` rows (deterministic in ``seed``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    inp = rng.integers(200, 2200, n)
    out = rng.integers(20, 151, n)
    model = rng.integers(0, MODELS, n)
    blocks = (inp + 511) // 512
    with open(path, "w", encoding="utf-8") as fh:
        lines = []
        for i in range(n):
            k = int(blocks[i])
            if i % SESSION_EVERY == 0:
                s = i % SESSIONS
                ids = [1_000_000_000 + s * 8 + x for x in range(k)]
                session = f'"s-{s}"'
            else:
                m = int(model[i])
                ids = [m * 2 + x if x < 2 else 100_000_000_000 + i * 8 + x for x in range(k)]
                session = "null"
            lines.append(f'{{"timestamp":{1_700_000_000_000 + i * 10},"input_length":{inp[i]},'
                         f'"output_length":{out[i]},"hash_ids":[{",".join(map(str, ids))}],'
                         f'"session_id":{session},"model":"org/model-{model[i]}"}}\n')
            if len(lines) == 65536:
                fh.write("".join(lines))
                lines = []
        fh.write("".join(lines))


def whole_read(path: str, repeat: int) -> tuple:
    """``(best seconds, rows)`` of :func:`aisim.traces.read_trace` (format ``mooncake``)."""
    from aisim.traces import read_trace

    best, rows = float("inf"), 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        table = read_trace(path, "mooncake")
        best = min(best, time.perf_counter() - t0)
        rows = table.num_rows
        del table
    return best, rows


def _hash_ids(data: bytes):
    """A block's hash ids (for timing the stream ids alone): all of them, or the distinct ones for the old reader."""
    import numpy as np
    import pyarrow.compute as pc

    from aisim.traces.mooncake import _JSON_SCHEMA
    from aisim.traces.oracle import _read_json

    from aisim.traces import mooncake

    ids = pc.list_flatten(_read_json(data, _JSON_SCHEMA, "ignore").column("hash_ids")).to_numpy(zero_copy_only=False)
    return ids if hasattr(mooncake, "unit_streams") else np.unique(ids)


def _time_streams(ids_per_block: list) -> float:
    """Seconds to give every block's ids their streams, as a fresh reader does."""
    from aisim.traces import mooncake

    fmt = mooncake.MooncakeFormat()
    t0 = time.perf_counter()
    for ids in ids_per_block:
        if hasattr(mooncake, "unit_streams"):
            mooncake.unit_streams(ids, None)
        else:  # the reader before vectorised ids: blake2b of each distinct id's text
            fmt._unit_streams(ids)
    return time.perf_counter() - t0


def phases(path: str) -> dict:
    """Seconds per phase of one read, step by step (see the module docstring)."""
    import pyarrow as pa

    from aisim.traces import blockread, mooncake
    from aisim.traces.blocks import block_text, count_breaks, first_lines
    from aisim.traces.oracle import _read_json

    try:
        from aisim.traces.jsonlines import read_uniform
    except ImportError:  # the reader before uniform lines
        read_uniform = None
    fmt = mooncake.MooncakeFormat()
    out = {}
    t0 = time.perf_counter()
    ranges = blockread.plan(path)
    if hasattr(blockread, "block_texts"):
        texts = list(blockread.block_texts(path, ranges))
    else:  # the reader before one-pass block texts
        counts = [count_breaks(path, a, b) for a, b in ranges] if len(ranges) > 1 else [0]
        before = first_lines(counts)
        texts = [block_text(path, a, b, before[k]) for k, (a, b) in enumerate(ranges)]
    out["block texts"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    for data, _ in texts:
        if read_uniform is None or read_uniform(data, mooncake._JSON_SCHEMA) is None:
            _read_json(data, mooncake._JSON_SCHEMA, "ignore")
    out["JSON to columns"] = time.perf_counter() - t0

    ids = [_hash_ids(data) for data, _ in texts]
    out["stream ids"] = _time_streams(ids)

    t0 = time.perf_counter()
    parsed = [fmt.parse(path, data, first) for data, first in texts]
    out["checks + segments"] = max(time.perf_counter() - t0 - out["JSON to columns"] - out["stream ids"], 0.0)
    assert all(not p.bad for p in parsed)

    resolved = [None] * len(parsed)

    def emit(k, table):
        resolved[k] = table

    t0 = time.perf_counter()
    res = fmt.resolve(path, blockread.Blocks.of(parsed), None, emit)
    out["resolve"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    tables = [fmt.finish(t, res.info) for t in resolved if t is not None and t.num_rows]
    table = blockread.sort_by_arrival(pa.concat_tables(tables), "time").combine_chunks()
    out["finish"] = time.perf_counter() - t0
    out["rows"] = table.num_rows
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", help="write (or reuse) the generated trace at this path")
    ap.add_argument("--sample", help="also time the whole read of this Mooncake file")
    args = ap.parse_args(argv)

    tmp = None
    path = args.keep
    if path is None:
        tmp = tempfile.mkdtemp(prefix="aisim-read-")
        path = os.path.join(tmp, "gateway.jsonl")
    try:
        if not os.path.exists(path):
            t0 = time.perf_counter()
            write_gateway(path, args.rows, args.seed)
            print(f"setup: wrote {args.rows:,} rows ({os.path.getsize(path) / 1e6:.1f} MB) "
                  f"in {time.perf_counter() - t0:.1f} s")
        size = os.path.getsize(path)
        secs, rows = whole_read(path, args.repeat)
        rate = rows / secs
        ph = phases(path)
        print(f"\nMooncake JSONL, {rows:,} rows, {size / 1e6:.1f} MB, one process")
        print(f"  {'phase':<20} {'s':>7} {'rows/s':>13}")
        for name, s in ph.items():
            if name != "rows":
                print(f"  {name:<20} {s:7.3f} {ph['rows'] / s if s > 0 else float('inf'):13,.0f}")
        print(f"  {'whole read (best)':<20} {secs:7.3f} {rate:13,.0f}  ({size / secs / 1e6:.0f} MB/s)")
        if args.sample:
            s_secs, s_rows = whole_read(args.sample, args.repeat)
            print(f"\nsample {args.sample}: {s_rows:,} rows in {s_secs * 1e3:.1f} ms "
                  f"({s_rows / s_secs:,.0f} rows/s)")
        print(f"\n{'PASS' if rate >= TARGET else 'FAIL'}: whole read {rate:,.0f} rows/s "
              f"(target >= {TARGET:,} rows/s per core)")
    finally:
        if tmp is not None:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
