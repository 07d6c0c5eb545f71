"""Why an engine cannot replay a trace: the checks :func:`aisim.replay.replay` runs before it
starts (a sweep or a capacity search asks them of every candidate first, :func:`check_trace`), and
the trace's segment arrays they read once for the checks and the core."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aisim.config.engine import EngineConfig
from aisim.config.kvgroups import request_blocks
from aisim.config.speculative import scheduler_view
from aisim.errors import TraceError
from aisim.traces.schema import REQUIRED_COLUMNS


def _segments_arrays(trace: pa.Table):
    """Each request's first segment and segment count, and every segment's stream, first token and
    length, in :func:`aisim.traces.schema.canonical_segments` form (:func:`_canonical`)."""
    seg = trace.column("segments").combine_chunks()
    offsets = seg.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    values = seg.values
    stream = values.field("stream").to_numpy(zero_copy_only=False).astype(np.uint64)
    first = values.field("first").to_numpy(zero_copy_only=False).astype(np.int64)
    length = values.field("length").to_numpy(zero_copy_only=False).astype(np.int64)
    # The segments of the rows in the table (a slice's list array may start past its values).
    stream, first, length = (a[offsets[0]:offsets[-1]] for a in (stream, first, length))
    return _canonical(offsets - offsets[0], stream, first, length)


def _continues(stream, first, length):
    """For each segment but the first, whether it continues the one before it: the same stream,
    from the token after that one's last."""
    return (stream[1:] == stream[:-1]) & (first[1:] == first[:-1] + length[:-1])


def _canonical(offsets, stream, first, length):
    """The segments of the requests (request i's from ``offsets[i]`` to ``offsets[i + 1]``),
    canonical: empty ones dropped, and a request's run that continues the one before it (same
    stream, the next token) merged into it, as :func:`aisim.traces.schema.canonical_segments`
    makes one request's (the readers write them so; a table built by hand may not, and
    ``tests/test_canonical_segments.py`` holds the two to one answer).  vLLM hashes token ids, so
    every split of the same tokens must hash the same; the core hashes runs, and finds the runs
    other requests share (the dense ids of KV offload) by them."""
    count = np.diff(offsets)
    # The usual case, checked without a request index: nothing empty, no pair to merge (a pair
    # across two requests never is: the pairs ending at a request's first segment are cleared).
    pairs = _continues(stream, first, length)
    firsts = offsets[1:-1]
    pairs[firsts[(firsts > 0) & (firsts < length.size)] - 1] = False
    if not pairs.any() and (length > 0).all():
        return offsets[:-1].astype(np.int32), count.astype(np.int32), stream, first, length
    req = np.repeat(np.arange(count.size, dtype=np.int64), count)
    keep = length > 0
    if not keep.all():
        req, stream, first, length = req[keep], stream[keep], first[keep], length[keep]
    joins = np.zeros(req.size, dtype=bool)
    joins[1:] = (req[1:] == req[:-1]) & _continues(stream, first, length)
    if joins.any():
        heads = np.flatnonzero(~joins)
        length = np.add.reduceat(length, heads) if heads.size else length[:0]
        req, stream, first = req[heads], stream[heads], first[heads]
    count = np.bincount(req, minlength=count.size)
    start = np.concatenate([[0], np.cumsum(count)[:-1]]) if count.size else count
    return start.astype(np.int32), count.astype(np.int32), stream, first, length


def _validate(trace: pa.Table, engine: EngineConfig, reject_too_long: bool = False):
    """Raise the first fault of ``trace`` (:func:`check_trace`); else return its segment arrays
    (:func:`_segments_arrays`, None for an empty trace), read once for the checks and the core."""
    if not isinstance(trace, pa.Table):
        raise TypeError("trace must be a pyarrow.Table with the trace schema (aisim.traces)")
    names = set(trace.schema.names)
    missing = [name for name in REQUIRED_COLUMNS if name not in names]
    if missing:
        raise TraceError(f"trace table lacks column(s): {', '.join(missing)}")
    timed = (trace.schema.metadata or {}).get(b"clock") == b"time"
    found, segs = _faults_and_segments(trace, engine, timed, reject_too_long)
    if found:
        raise TraceError(found[min(found)])
    return segs


def check_trace(trace: pa.Table, engine: EngineConfig, *, reject_too_long: bool = False) -> str | None:
    """Why ``engine`` cannot replay ``trace``, or None when it can.

    The checks :func:`aisim.replay.replay` runs before it starts (see :func:`_row_faults`):
    a configuration sweep asks them of every candidate before replaying any.

    Parameters
    ----------
    trace : pyarrow.Table
        A trace table (:mod:`aisim.traces.schema`).
    engine : EngineConfig
    reject_too_long : bool
        Prompts of ``max_model_len`` tokens or more are rejected, not an error
        (as :func:`aisim.replay.replay` takes it).

    Returns
    -------
    str or None
        The message :func:`aisim.replay.replay` would raise as a :class:`~aisim.errors.TraceError`.
    """
    timed = (trace.schema.metadata or {}).get(b"clock") == b"time"
    found = _row_faults(trace, engine, timed, reject_too_long)
    return found[min(found)] if found else None


def too_long(prompt, engine: EngineConfig):
    """Which prompts vLLM's server rejects on ``engine``: ``prompt_len >= max_model_len``.

    vLLM: ``vllm/v1/engine/input_processor.py`` ``InputProcessor._validate_prompt_len``
    refuses a decoder prompt longer than ``max_model_len``, and one of exactly
    ``max_model_len`` tokens, which leaves no room for an output token.
    """
    return np.asarray(prompt) >= engine.max_model_len


def _row_faults(trace: pa.Table, engine: EngineConfig, timed: bool, reject_too_long: bool = False) -> dict:
    """The first row (in trace order) failing each check: check number -> message.

    The checks run in this order, and a replay reports the first check any
    row fails (its first such row): counts of at least 1, a finite
    non-negative arrival, a prompt below ``max_model_len``, a request that
    fits an empty pool, segments covering the prompt.  With
    ``reject_too_long`` a prompt of ``max_model_len`` tokens or more is no
    fault (it is rejected), and the pool need only hold the other requests.
    """
    return _faults_and_segments(trace, engine, timed, reject_too_long)[0]


def _faults_and_segments(trace: pa.Table, engine: EngineConfig, timed: bool, reject_too_long: bool = False):
    """:func:`_row_faults` and the segment arrays it read (None for an empty trace)."""
    found = {}
    n = trace.num_rows
    if n == 0:
        return found, None
    ids = trace.column("request_id")

    def rid(i):
        return ids[int(i)].as_py()

    prompt = trace.column("prompt_tokens").to_numpy(zero_copy_only=False)
    out = trace.column("output_tokens").to_numpy(zero_copy_only=False)
    bad = np.flatnonzero((prompt < 1) | (out < 1))
    if bad.size:
        found[0] = f"request '{rid(bad[0])}': prompt_tokens and output_tokens must be at least 1"
    name = "arrival_s" if timed else "arrival_step"
    arrival = trace.column(name)
    # A null arrival reads as NaN, refused with the finite check below.
    values = arrival.to_numpy(zero_copy_only=False).astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if bad.size:
        v = arrival[int(bad[0])].as_py()
        found[1] = f"request '{rid(bad[0])}': {name} must be a finite non-negative number, got {v!r}"
    rejected = too_long(prompt, engine)
    bad = np.flatnonzero(rejected) if not reject_too_long else ()
    if len(bad):
        i = bad[0]
        found[2] = (f"request '{rid(i)}': prompt_tokens ({prompt[i]}) must be below max_model_len "
                    f"({engine.max_model_len}); vLLM rejects such a prompt")
    # Every request must fit an empty pool, or the replay could never finish it.  With speculative
    # decoding its last verification reaches k drafts and the drafter's lookahead slots further.
    extra = 0
    if engine.speculative is not None:
        view = scheduler_view(engine)
        extra = view["num_speculative_tokens"] - 1 + view["num_lookahead_tokens"]
    longest = np.minimum(prompt.astype(np.int64) + out + extra, engine.max_model_len)
    need = request_blocks(engine, longest)
    bad = np.flatnonzero((need > engine.usable_blocks) & ~rejected)
    if bad.size:
        i = bad[0]
        found[3] = (f"request '{rid(i)}' needs {need[i]} KV-cache blocks for {longest[i]} tokens but the pool has "
                    f"only {engine.usable_blocks} usable blocks (num_gpu_blocks={engine.num_gpu_blocks})")
    segs = _segments_arrays(trace)
    start, count, _, _, length = segs
    cum = np.concatenate([[0], np.cumsum(length)])
    covered = cum[start + count] - cum[start]
    bad = np.flatnonzero(covered != prompt)
    if bad.size:
        i = bad[0]
        found[4] = f"request '{rid(i)}': its segments cover {covered[i]} tokens, not prompt_tokens ({prompt[i]})"
    return found, segs
