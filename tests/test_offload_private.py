"""Chunks whose key no other request of the trace shares, kept out of the CPU tier's key map.

A request's chunk past the tokens it shares with any other request of the trace (ReqC.key_blocks)
can only be looked up by the request itself; the tier stores it without a key map entry and finds
it through the request's hint (ext/offload_map.pxi, ``_off_priv_from``, ``_off_own``); its
eviction deletes no entry.  The shared chunks go through the map as before.  Two small replays
with hand-derived figures, each asserted identical to the replay that puts every chunk in the
map (the hook ``_set_offload_hints(False)``).

Both use 16-token blocks and chunks, a GPU pool of 9 usable blocks and two requests of 64 prompt
tokens decoding 60 each: the second one admitted needs a fifth block in the step after its
prefill and only one is free, so it is preempted (vLLM preempts the last running request).  The
first one's decode takes a new block at positions 80, 96 and 112 (steps 17, 33 and 49 when it
decodes from step 1): each evicts one of the preempted request's cached blocks, tail first, so
its GPU hit falls from 64 tokens to 48, 32 and 16, and the connector offers the rest of its
four chunks from the CPU tier.  r1 shares its first 32 tokens with r2 (chunks 0 and 1 are in
the map), its last two chunks are private; r0 shares nothing.
"""

from __future__ import annotations

import json

import pytest

from aisim._core import scheduler

from helpers import run_log


def _engine(cpu_blocks):
    return {"num_gpu_blocks": 10, "block_size": 16, "max_model_len": 320, "max_num_seqs": 2,
            "max_num_batched_tokens": 256, "startup_check": False, "vllm_version": "0.34.0",
            "kv_cache_groups": [{"type": "full"}], "kv_offload": {"cpu_blocks": cpu_blocks}}


R1 = {"id": "r1", "prompt": 64, "max_tokens": 60, "segments": [("shared", 0, 32), ("own1", 32, 32)]}
R0 = {"id": "r0", "prompt": 64, "max_tokens": 60}
R2 = {"id": "r2", "at": 200, "prompt": 48, "max_tokens": 2, "segments": [("shared", 0, 32), ("own2", 32, 16)]}


def _trails(engine, requests):
    """Each request's lookups where (local hit, tokens offered) changes, the load and store jobs
    ([step, request, ...] in order), the evictions by step and the summary, replayed with the private chunks
    out of the map and with every chunk in it; asserts the two identical."""
    out = []
    for hints in (True, False):
        old = scheduler._set_offload_hints(hints)
        try:
            steps, summary, result = run_log(engine, requests)
        finally:
            scheduler._set_offload_hints(old)
        lookups, last, jobs, evicted = {}, {}, {}, {}
        for k, s in sorted(steps.items()):
            off = s["offload"]
            for q, lk in off["lookups"].items():
                if lk != last.get(q):
                    lookups.setdefault(q, {})[k] = lk
                    last[q] = lk
            for kind in ("loads", "stores"):
                for job in off[kind].values():
                    jobs.setdefault(kind, []).append([k, *job])
            if off["cpu_evicted"]:
                evicted[k] = off["cpu_evicted"]
        loaded = dict(zip(result.requests.column("request_id").to_pylist(),
                          result.requests.column("offload_loaded_tokens").to_pylist()))
        out.append((lookups, jobs, evicted, loaded, json.dumps(summary)))
    assert out[0] == out[1]
    return out[0]


def test_private_chunks_found_by_their_own_request_after_preemption():
    # r0 and r1 prefill in step 0 and store their four chunks each (a tier of 16: no eviction).
    # r1 is preempted in step 1; as r0 takes its GPU blocks, r1's lookups are offered its own
    # chunks past the GPU hit: chunk 3 (private), then 2-3 (private), then 1-3 (chunk 1 through the
    # map).  r0 finishes in step 59 (60 tokens from step 0) and r1 loads 48 tokens (3 chunks) in
    # step 60.  r2 (step 200) hits r1's 32 shared tokens on the GPU and offers its chunks 0-1,
    # which the map finds (stored by r1): its store writes only its chunk 2.
    lookups, jobs, evicted, loaded, _ = _trails(_engine(16), [{**R0, "at": 0}, {**R1, "at": 0}, R2])
    assert lookups["r1"] == {0: [0, 0], 2: [64, 0], 17: [48, 16], 33: [32, 32], 49: [16, 48]}
    assert jobs == {"stores": [[0, "r0", 4], [0, "r1", 4], [200, "r2", 1]], "loads": [[60, "r1", 48, 3]]}
    assert evicted == {}
    assert loaded == {"r0": 0, "r1": 48, "r2": 0}


def test_private_chunks_evicted_outside_the_map():
    # A tier of 6 chunks.  r1 prefills in step 0 and stores its four chunks; r0 arrives in step 2
    # and stores four: two free chunks and two evicted, r1's of lowest rank (rank of r1,
    # -position): its positions 3 and 2, both private, go without a map entry to delete, and their
    # chunks take r0's keys (r1's hints to them go stale).  r0 is preempted in step 3 and its own
    # chunks (all private) are offered back as r1's decode takes its GPU blocks (steps 17, 33, 49
    # counted from r1's decode in step 1); it loads 48 tokens in step 60 after r1 finishes in 59.
    # r2 (step 200) hits block 0 on the GPU (block 1 was taken by r1's decode) and loads r1's
    # chunk 1 from the tier through the map; its store of chunk 2 evicts one chunk.
    lookups, jobs, evicted, loaded, summary = _trails(_engine(6), [{**R1, "at": 0}, {**R0, "at": 2}, R2])
    assert lookups["r0"] == {2: [0, 0], 4: [64, 0], 17: [48, 16], 33: [32, 32], 49: [16, 48]}
    assert lookups["r2"] == {200: [16, 16]}
    assert jobs == {"stores": [[0, "r1", 4], [2, "r0", 4], [202, "r2", 1]],
                    "loads": [[60, "r0", 48, 3], [200, "r2", 16, 1]]}
    assert evicted == {2: 2, 202: 1}
    assert loaded == {"r1": 0, "r0": 48, "r2": 16}
    assert json.loads(summary)["kv_offload"]["cpu_evicted_chunks"] == 3


@pytest.mark.parametrize("cpu_blocks, evicted, load_tokens, stored", [(5, 26, 32, 31), (8, 22, 128, 30)])
def test_private_and_shared_chunks_churn_identically(cpu_blocks, evicted, load_tokens, stored):
    # Nine requests sharing 0-48 tokens of one prefix, the rest their own, on a tier of 5 or 8
    # chunks: private chunks evicted, their chunks reused for shared keys and the reverse.  The
    # figures are the replay's with every chunk in the map.
    reqs = []
    for k in range(9):
        shared = 16 * (k % 4)
        segs = ([("common", 0, shared)] if shared else []) + [(f"own{k}", shared, 64 - shared)]
        reqs.append({"id": f"q{k}", "at": 3 * k, "prompt": 64, "max_tokens": 20 + 5 * (k % 3), "segments": segs})
    summary = _trails(_engine(cpu_blocks), reqs)[4]
    off = json.loads(summary)["kv_offload"]
    assert (off["cpu_evicted_chunks"], off["load_tokens"], off["store_chunks"]) == (evicted, load_tokens, stored)
