"""What a trace holds: counts, length percentiles, sessions and its ideal prefix-cache hit ratio.

The ideal ratio is computed here in Python, independently of the compiled
core: requests are taken in table (arrival) order; a request hits the longest
run of full ``block``-token blocks at the start of its prompt whose tokens (and
every token before them) some earlier request also had in a full block; then
its own full blocks join the cache forever.  A request's cached sequence is its
prompt followed by its output minus the last output token (the tokens vLLM
computes KV for), so a later turn that repeats an earlier output hits it.
Token identity is the segments' ``(stream, offset)``, so two requests share a
block exactly when the chained block hashes of the replay core would agree.
The ratio is hit tokens over prompt tokens; there is no "recompute the last
prompt token" cap.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa

from aisim.stats import percentiles
from aisim.traces.common import bad_rows, table_meta
from aisim.traces.schema import canonical_segments, output_streams

DEFAULT_BLOCK = 16


def inspect_trace(table: pa.Table, unit_tokens: int | None = None, include_output: bool = True) -> dict:
    """Summarise a trace table.

    Parameters
    ----------
    table : pyarrow.Table
        A trace table.
    unit_tokens : int, optional
        Block size of the ideal hit ratio; default the table's ``unit_tokens``
        metadata, else 16.
    include_output : bool
        Whether requests' output tokens enter the ideal cache (see the module).

    Returns
    -------
    dict
        ``requests``, ``clock``, ``first_arrival``/``last_arrival`` (seconds or
        steps), ``duration_s`` (None for a step clock), ``models`` (count per
        model, ``"(none)"`` for unset), ``sessions``, ``prompt_tokens`` and
        ``output_tokens`` (``total``, ``mean``, ``p50``, ``p90``, ``p99``,
        ``max``), ``block_size``, ``ideal_hit_tokens``, ``ideal_hit_ratio``,
        ``bad_rows``, ``format`` and ``source_format`` (the format a Parquet
        trace was converted from).
    """
    n = table.num_rows
    clock = table_meta(table, "clock") or "time"
    block = unit_tokens or _int_or_none(table_meta(table, "unit_tokens")) or DEFAULT_BLOCK
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"unit_tokens must be a positive integer, got {block!r}")
    arrival = table.column("arrival_s" if clock == "time" else "arrival_step").to_numpy(zero_copy_only=False)
    arrival = arrival.astype(np.float64)
    prompt = table.column("prompt_tokens").to_numpy(zero_copy_only=False).astype(np.int64)
    output = table.column("output_tokens").to_numpy(zero_copy_only=False).astype(np.int64)
    models = Counter("(none)" if m is None else m for m in table.column("model").to_pylist())
    sessions = {s for s in table.column("session_id").to_pylist() if s is not None}
    first = float(np.nanmin(arrival)) if n else None
    last = float(np.nanmax(arrival)) if n else None
    hit = ideal_hit_tokens(table, block, include_output)
    total_prompt = int(prompt.sum())
    return {
        "requests": n,
        "format": table_meta(table, "format"),
        "source_format": table_meta(table, "source_format"),
        "clock": clock,
        "first_arrival": first,
        "last_arrival": last,
        "duration_s": (last - first) if clock == "time" and n else None,
        "models": dict(sorted(models.items(), key=lambda kv: (-kv[1], kv[0]))),
        "sessions": len(sessions),
        "prompt_tokens": _stats(prompt),
        "output_tokens": _stats(output),
        "block_size": block,
        "ideal_hit_tokens": hit,
        "ideal_hit_ratio": hit / total_prompt if total_prompt else 0.0,
        "bad_rows": bad_rows(table),
    }


def ideal_hit_tokens(table: pa.Table, block: int, include_output: bool = True) -> int:
    """Prompt tokens an infinite prefix cache of ``block``-token blocks would hit (see the module).

    Parameters
    ----------
    table : pyarrow.Table
        A trace table, taken in row order.
    block : int
        Block size in tokens.
    include_output : bool
        Whether requests' output tokens (but the last) enter the cache.

    Returns
    -------
    int
    """
    ids = table.column("request_id").to_pylist()
    prompts = table.column("prompt_tokens").to_pylist()
    outputs = table.column("output_tokens").to_pylist()
    out_streams = output_streams(ids).tolist() if include_output else None
    root = {}
    hit = 0
    for i, segs in enumerate(table.column("segments").to_pylist()):
        segs = canonical_segments((s["stream"], s["first"], s["length"]) for s in segs)
        hit += _match(root, segs) // block * block
        cached = prompts[i]
        if include_output and outputs[i] > 1:
            segs.append((out_streams[i], 0, outputs[i] - 1))
            cached += outputs[i] - 1
        _insert(root, segs, cached // block * block)
    return hit


# A radix tree of cached token sequences: node = {(stream, first): [length, child node]}; an edge
# holds `length` consecutive tokens of one stream.  Edges split where sequences part.

def _match(root: dict, segs) -> int:
    node, matched = root, 0
    for stream, first, length in segs:
        while length > 0:
            edge = node.get((stream, first))
            if edge is None:
                return matched
            elen, child = edge
            if length < elen:
                return matched + length
            matched += elen
            node, first, length = child, first + elen, length - elen
    return matched


def _insert(root: dict, segs, limit: int) -> None:
    node, left = root, limit
    for stream, first, length in segs:
        length = min(length, left)
        while length > 0:
            edge = node.get((stream, first))
            if edge is None:
                child = {}
                node[(stream, first)] = [length, child]
                node, left = child, left - length
                break
            elen, child = edge
            if length < elen:
                mid = {(stream, first + length): [elen - length, child]}
                edge[0], edge[1] = length, mid
                node, left = mid, left - length
                break
            node, first, length, left = child, first + elen, length - elen, left - elen
        if left <= 0:
            return


def _stats(v: np.ndarray) -> dict:
    if v.size == 0:
        return {"total": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    p50, p90, p99 = percentiles(v)
    return {"total": int(v.sum()), "mean": float(v.mean()), "p50": p50, "p90": p90, "p99": p99,
            "max": int(v.max())}


def _int_or_none(text):
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
