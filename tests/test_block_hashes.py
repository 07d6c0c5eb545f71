"""The block-hash chain (ext/hashing.pxd, hash_extend) against its rule written out in Python.

A block's key mixes its parent's key with one digest of the runs (stream, first offset, length)
of its tokens: prompt segments in order, then the request's output stream; with lookahead L the
next L tokens' digest is mixed in after a marker.  The core computes the common block (one run)
on a short path; these keys must be the rule's to the bit, however the tokens fall into runs
and however the chain is extended call by call.
"""

import random

import pytest

from aisim._core.testing import KVCache

M64 = (1 << 64) - 1
SEED = 0x5EED5EED
LOOKAHEAD_MARK = 0x6C6F6F6B61686561


def mix64(x):
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def combine_mixed(h, mixed):
    return mix64(h ^ ((mixed + 0x9E3779B97F4A7C15 + ((h << 6) & M64) + (h >> 2)) & M64))


def combine(h, v):
    return combine_mixed(h, mix64(v))


RUN_FIRST, RUN_LENGTH, RUN_NEXT = 0x66697273, 0x6C656E67, 0x6E657874


def digest(block_runs):
    """One value for a block's runs, in order: each run (stream, first, length) mixed on its own,
    later runs folded in after the earlier ones."""
    out = None
    for s, f, n in block_runs:
        run = mix64(mix64(s) ^ mix64((f + RUN_FIRST) & M64) ^ mix64((n + RUN_LENGTH) & M64))
        out = run if out is None else mix64(out ^ RUN_NEXT) ^ run
    return out


def runs(tokens, start, n):
    """The runs of tokens[start:start + n] (tokens as (stream, offset), split where a segment ends)."""
    out = []
    for t in range(start, start + n):
        seg, stream, off = tokens[t]
        if out and out[-1][0] == seg:
            out[-1][3] += 1
        else:
            out.append([seg, stream, off, 1])
    return [(s, f, n) for _, s, f, n in out]


def reference(segments, out_stream, num_output, size, lookahead=0):
    """The keys of one request as the rule defines them."""
    tokens = [(i, s, f + k) for i, (s, f, n) in enumerate(segments) for k in range(n)]
    tokens += [(len(segments), out_stream, k) for k in range(num_output)]
    n_keys = (len(tokens) - lookahead) // size if len(tokens) > lookahead else 0
    keys, h = [], SEED
    for j in range(n_keys):
        k = combine_mixed(h, digest(runs(tokens, j * size, size)))
        if lookahead:
            k = combine_mixed(combine(k, LOOKAHEAD_MARK), digest(runs(tokens, (j + 1) * size, lookahead)))
        h = k if k else 1
        keys.append(h)
    return keys


def test_one_block_by_the_rule():
    # A 4-token prompt of stream 7 from offset 10, blocks of 4: one key.
    kv = KVCache(8, 4, 64, [[(7, 10, 4)]])
    assert kv.block_hashes(0) == [combine_mixed(SEED, digest([(7, 10, 4)]))]


@pytest.mark.parametrize("size,lookahead", [(1, 0), (4, 0), (16, 0), (5, 0), (4, 3), (16, 1), (7, 9)])
def test_keys_follow_the_rule_however_the_tokens_fall(size, lookahead):
    rng = random.Random(size * 100 + lookahead)
    for case in range(25):
        segments = [(rng.choice([3, 5, 2**63 + 9]), rng.randrange(0, 50), rng.randrange(1, 3 * size + 2))
                    for _ in range(rng.randrange(1, 6))]
        prompt = sum(n for _, _, n in segments)
        kv = KVCache(8, size, prompt + 8 * size + lookahead + 1, [segments], hash_block_size=size,
                     sched_block_size=size, hash_lookahead=lookahead)
        out_stream = (1 << 63) | 0  # the test handle's output stream of request 0
        got = []
        # Extend call by call, as outputs arrive, so the cursor stops inside runs too.
        for out in sorted(rng.sample(range(0, 8 * size), 4)):
            got = kv.block_hashes(0, out)
            assert got == reference(segments, out_stream, out, size, lookahead), (case, segments, out)
        assert len(got) == max(prompt + out - lookahead, 0) // size


def output_stream_rule(request_id):
    """A request's output stream: FNV-1a over its id's UTF-8 bytes, the length and the golden ratio
    folded in, then splitmix64's avalanche; never 0."""
    data = request_id.encode()
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & M64
    return mix64(h ^ ((len(data) + 0x9E3779B97F4A7C15) & M64)) or 1


def test_output_streams_follow_their_rule():
    import pyarrow as pa

    from aisim.traces.schema import output_streams

    rng = random.Random(3)
    ids = ["", "a", "syn0", "é", "日本語", "x" * 300] + [
        "".join(rng.choice("abz09é日\x01") for _ in range(rng.randint(0, 40))) for _ in range(500)]
    want = [output_stream_rule(i) for i in ids]
    assert output_streams(ids).tolist() == want
    # An Arrow slice of a large_string array and a chunked array read from their buffers alike.
    assert output_streams(pa.array(ids, pa.large_string()).slice(3, 100)).tolist() == want[3:103]
    assert output_streams(pa.chunked_array([pa.array(ids[:10]), pa.array(ids[10:50])])).tolist() == want[:50]
    assert hex(want[1]) == "0xb07fb2a571b3216e"
