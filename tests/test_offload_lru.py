"""The CPU tier's LRU order under churn: a linked list in rank order must evict exactly what
LRUCachePolicy's lazy heap evicts (vllm/v1/kv_offload/cpu/policies/lru.py).

The pinned figures were recorded with an implementation that kept the heap itself (every touch a
push, every eviction pops of (rank, key) entries); a different eviction anywhere changes later
lookups, loads and evictions, so the trail of every step is pinned by its digest.
"""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from helpers import run_log


def _engine(blocks, **offload):
    return {"num_gpu_blocks": blocks, "block_size": 16, "max_model_len": 320, "max_num_seqs": 4,
            "max_num_batched_tokens": 256, "startup_check": False, "vllm_version": "0.34.0",
            "kv_cache_groups": [{"type": "full"}], "kv_offload": offload}


def _churn(seed):
    """160 requests, two a step, over six shared prefixes: a GPU pool of 30 blocks preempts and a
    small tier evicts all the time."""
    rnd = random.Random(seed)
    reqs = []
    for k in range(160):
        shared_len = 16 * rnd.randrange(0, 12)
        prompt = shared_len + rnd.randrange(1, 120)
        segs = [(f"p{rnd.randrange(6)}", 0, shared_len)] if shared_len else []
        segs.append((f"own{k}", shared_len, prompt - shared_len))
        reqs.append({"id": f"r{k:03d}", "at": k // 2, "prompt": prompt, "max_tokens": rnd.randrange(1, 40),
                     "segments": segs})
    return reqs


@pytest.mark.parametrize("seed, offload, evicted, load_tokens, preemptions, digest", [
    (1, {"cpu_blocks": 24}, 1091, 1232, 22, "9142c95b3fb5fcd3"),
    (1, {"cpu_blocks": 40, "blocks_per_chunk": 2}, 335, 5056, 27, "b6e286f7caf32877"),
    (2, {"cpu_blocks": 24}, 1043, 1136, 25, "3e36d68fc9ba37fc"),
    (2, {"cpu_blocks": 40, "blocks_per_chunk": 2}, 320, 5264, 21, "3ad25702bf841d90"),
])
def test_churn_evicts_in_the_heap_order(seed, offload, evicted, load_tokens, preemptions, digest):
    steps, summary, _ = run_log(_engine(30, **offload), _churn(seed))
    trail = [[k, s["offload"]["cpu_evicted"], s["offload"]["lookups"], s["offload"]["loads"]]
             for k, s in sorted(steps.items())]
    off = summary["kv_offload"]
    assert (off["cpu_evicted_chunks"], off["load_tokens"], summary["preemptions"]) == (evicted, load_tokens,
                                                                                       preemptions)
    assert hashlib.sha256(json.dumps(trail, sort_keys=True).encode()).hexdigest()[:16] == digest
