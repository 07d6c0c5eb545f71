"""A trace table whose segments split a run or hold an empty one replays as its canonical form
(aisim/trace_checks.py ``_canonical``): the block hashes are the tokens', whatever their split."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aisim.config.engine import engine_config_from_dict
from aisim.replay import replay
from aisim.trace_checks import _canonical
from aisim.traces.schema import canonical_segments, stream_id, trace_table

from helpers import assert_same_replay, make_trace
from test_offload_private import R0, R1, R2
from test_offload_private import _engine as _small_engine


def test_runs_merged_and_empty_segments_dropped():
    # Request 0: stream 7 tokens 0-9 and 10-14 (one run), an empty one, stream 8 from 0; request 1:
    # stream 7 from 15 (contiguous with request 0's run, but another request's: kept apart), then
    # stream 7 from 30 (a gap: kept apart); request 2: only an empty segment.
    offsets = np.array([0, 4, 6, 7])
    stream = np.array([7, 7, 9, 8, 7, 7, 5], dtype=np.uint64)
    first = np.array([0, 10, 3, 0, 15, 30, 0], dtype=np.int64)
    length = np.array([10, 5, 0, 6, 4, 2, 0], dtype=np.int64)
    start, cnt, s, f, n = _canonical(offsets, stream, first, length)
    assert start.tolist() == [0, 2, 4]
    assert cnt.tolist() == [2, 2, 0]
    assert s.tolist() == [7, 8, 7, 7]
    assert f.tolist() == [0, 0, 15, 30]
    assert n.tolist() == [15, 6, 4, 2]


def test_canonical_segments_kept_as_they_are():
    offsets = np.array([0, 2, 3])
    stream = np.array([1, 2, 1], dtype=np.uint64)
    first = np.array([0, 0, 0], dtype=np.int64)
    length = np.array([4, 4, 8], dtype=np.int64)
    start, cnt, s, f, n = _canonical(offsets, stream, first, length)
    assert (start.tolist(), cnt.tolist(), s.tolist(), f.tolist(), n.tolist()) == (
        [0, 2], [2, 1], [1, 2, 1], [0, 0, 0], [4, 4, 8])


def _split_table(requests, splits):
    """``requests`` as :func:`helpers.make_trace` builds them, their segments as given in ``splits``
    (request id to (stream, first, length) triples), not made canonical."""
    rows = {k: [] for k in ("request_id", "arrival_step", "arrival_s", "prompt_tokens", "output_tokens",
                            "priority", "segments", "accept")}
    for r in requests:
        rows["request_id"].append(r["id"])
        rows["arrival_step"].append(r["at"])
        rows["arrival_s"].append(None)
        rows["prompt_tokens"].append(r["prompt"])
        rows["output_tokens"].append(r["max_tokens"])
        rows["priority"].append(0)
        rows["segments"].append([(stream_id("t", s), f, n) for s, f, n in splits[r["id"]]])
        rows["accept"].append(None)
    return trace_table(rows, "step")


def test_a_split_trace_replays_as_its_canonical_form():
    # test_offload_dense's first case (r1 and r2 share 32 tokens: two chunks stored under their
    # dense ids by r1, loaded by r2), with r1's shared run split in two and an empty segment, r2's
    # split elsewhere.
    reqs = [{**R0, "at": 0}, {**R1, "at": 0}, R2]
    eng = engine_config_from_dict(_small_engine(16))
    ref = replay(make_trace(reqs), eng, record_decisions=True)
    split = _split_table(reqs, {
        "r0": [("private-r0", 0, 20), ("private-r0", 20, 44)],
        "r1": [("shared", 0, 16), ("shared", 16, 16), ("own1", 32, 0), ("own1", 32, 32)],
        "r2": [("shared", 0, 8), ("shared", 8, 24), ("own2", 32, 16)],
    })
    got = replay(split, eng, record_decisions=True)
    assert_same_replay(got, ref)
    off = got.summary["kv_offload"]
    assert (off["stores"], off["store_chunks"], off["loads"], off["load_tokens"]) == (3, 9, 1, 48)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 12), st.integers(0, 4)), max_size=6),
                max_size=6))
def test_the_table_form_agrees_with_one_requests_form(requests):
    # Small streams, tokens and lengths, so that runs continue each other, repeat, gap and empty
    # segments all come up: _canonical over the whole table gives, request by request, what
    # canonical_segments (the readers' form) gives for that request alone.
    offsets = np.cumsum([0] + [len(r) for r in requests])
    segs = [s for r in requests for s in r]
    stream = np.array([s[0] for s in segs], dtype=np.uint64)
    first = np.array([s[1] for s in segs], dtype=np.int64)
    length = np.array([s[2] for s in segs], dtype=np.int64)
    start, cnt, s, f, n = _canonical(offsets, stream, first, length)
    for i, r in enumerate(requests):
        got = list(zip(s[start[i]:start[i] + cnt[i]].tolist(), f[start[i]:start[i] + cnt[i]].tolist(),
                       n[start[i]:start[i] + cnt[i]].tolist()))
        assert got == canonical_segments(r)
    assert start.tolist() == np.concatenate([[0], np.cumsum(cnt)[:-1]]).tolist()[:len(requests)]
