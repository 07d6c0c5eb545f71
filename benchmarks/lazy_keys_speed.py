"""How much do lazy keys save on Mooncake-shaped traces?  Both ways in one run, ratios.

Run from the repository root after building the extension::

    python benchmarks/lazy_keys_speed.py [--repeat N] [--conversation PATH] [--json PATH]

Each workload is replayed with lazy keys (the default: blocks that no other request in the
engine holds are cached outside the block pool's map, and a run of tokens several requests hold
is hashed once) and with ``replay(..., lazy_keys=False)``, which keys every block as it is cached,
block by block, as vLLM does.  The pairs alternate, ``--repeat`` times after one untimed warm-up
each; the figure is the best CPU time of each way (the shared machines these run on are noisy,
and CPU time counts only this process), and the ratio is block by block over lazy.  The results
are byte-identical either way (tests/test_lazy_keys.py).

Workloads:

* ``mooncake`` -- the Mooncake sample (tests/data/traces/mooncake, 3,993 requests, 512-token hash
  blocks) on 128 sequences, an 8,192-token budget and 8,192 blocks of 16 tokens (the replay_speed
  shape), prompts of 131,072 tokens or more rejected;
* ``mooncake_32k`` -- the same on a 32,768-block pool;
* ``conversation_3000`` -- the first 3,000 requests of Mooncake's conversation trace
  (``FAST25-release/traces/conversation_trace.jsonl`` of kvcache-ai/Mooncake, given by
  ``--conversation``; skipped when absent) on the 32,768-block pool;
* ``hybrid_mamba`` and ``sliding_window`` -- replay_speed.py's grouped synthetic shapes (Mamba
  groups take no lazy keys: the ratio says that costs nothing).

The exit status is 0 either way.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # runnable from a checkout without installing
    sys.path.insert(0, REPO)

from aisim.config.engine import engine_config_from_dict  # noqa: E402
from aisim.replay import replay  # noqa: E402
from aisim.traces import read_trace  # noqa: E402

from replay_speed import MOONCAKE, hybrid_mamba_workload, sliding_window_workload  # noqa: E402


def mooncake_engine(blocks):
    """The Mooncake shape of replay_speed.py on a pool of ``blocks`` blocks."""
    return engine_config_from_dict(
        {"num_gpu_blocks": blocks, "block_size": 16, "max_num_seqs": 128, "max_num_batched_tokens": 8192,
         "max_model_len": 131072, "enable_prefix_caching": True, "kv_cache_groups": [{"type": "full"}],
         "startup_check": False},
        source="mooncake")


def first_lines(path, n):
    """A temporary copy of the first ``n`` lines of ``path`` (a JSON-lines trace)."""
    fd, out = tempfile.mkstemp(suffix=".jsonl")
    with open(path, encoding="utf-8") as src, os.fdopen(fd, "w", encoding="utf-8") as dst:
        for i, line in enumerate(src):
            if i >= n:
                break
            dst.write(line)
    return out


def workloads(conversation):
    """(name, engine, trace, replay keywords) of every workload that can run here."""
    moon = read_trace(MOONCAKE)
    out = [("mooncake", mooncake_engine(8192), moon, {"reject_too_long": True}),
           ("mooncake_32k", mooncake_engine(32768), moon, {"reject_too_long": True})]
    if conversation and os.path.exists(conversation):
        tmp = first_lines(conversation, 3000)
        try:
            out.append(("conversation_3000", mooncake_engine(32768), read_trace(tmp), {"reject_too_long": True}))
        finally:
            os.unlink(tmp)
    for name, build in (("hybrid_mamba", hybrid_mamba_workload), ("sliding_window", sliding_window_workload)):
        eng, trace, _ = build()
        out.append((name, eng, trace, {}))
    return out


def cpu_time(trace, eng, kw):
    gc.collect()
    gc.disable()
    try:
        t0 = time.process_time()
        replay(trace, eng, **kw)
        return time.process_time() - t0
    finally:
        gc.enable()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="timed pairs per workload (best is reported)")
    ap.add_argument("--conversation", metavar="PATH", help="Mooncake's conversation_trace.jsonl")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    figures = {}
    print(f"{'workload':<20}{'requests':>9}{'lazy ms':>10}{'keyed ms':>10}{'keyed / lazy':>14}")
    for name, eng, trace, kw in workloads(args.conversation):
        replay(trace, eng, **kw)
        replay(trace, eng, lazy_keys=False, **kw)
        lazy, keyed = [], []
        for _ in range(args.repeat):
            lazy.append(cpu_time(trace, eng, kw))
            keyed.append(cpu_time(trace, eng, dict(kw, lazy_keys=False)))
        figures[name] = {"requests": trace.num_rows, "lazy_s": min(lazy), "keyed_s": min(keyed),
                         "ratio": min(keyed) / min(lazy)}
        f = figures[name]
        print(f"{name:<20}{f['requests']:>9,}{f['lazy_s'] * 1e3:>10.1f}{f['keyed_s'] * 1e3:>10.1f}{f['ratio']:>13.2f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(figures, fh, indent=2)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
