"""The trace table every reader produces and :func:`aisim.replay` consumes.

One row per request, in arrival order (ties keep file order):

==================  ==========================  ==========================================
column              type                        meaning
==================  ==========================  ==========================================
``model``           string (nullable)           model the request is for (pipeline sharding)
``request_id``      string                      unique within the trace
``session_id``      string (nullable)           multi-turn session
``turn``            int32                       turn index within the session (0 = first)
``arrival_step``    int64 (null when timed)     engine iteration before which it arrives
``arrival_s``       float64 (null when stepped) seconds from the trace start
``prompt_tokens``   int32                       prompt length
``output_tokens``   int32                       tokens to generate (``max_tokens``)
``priority``        int32                       lower runs first (priority policy)
``segments``        list<struct>                the prompt's token identity, see below
``accept``          list<int32> (nullable)      speculative decoding: drafts accepted at the
                                                request's 1st, 2nd, ... verification (cycled)
==================  ==========================  ==========================================

Token identity is what prefix caching sees.  A prompt is a list of segments
``(stream, first, length)``: ``length`` consecutive tokens of token stream
``stream`` starting at offset ``first``.  Two requests share a token iff they
share (stream, offset).  A trace's shared-prefix ids (Mooncake hash ids, the
oracle's prefix groups, multi-turn history) all become segments; output tokens
of a request are the stream :func:`output_stream` of its request id.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa

SEGMENT_TYPE = pa.struct([("stream", pa.uint64()), ("first", pa.int64()), ("length", pa.int64())])

TRACE_SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("request_id", pa.string()),
        ("session_id", pa.string()),
        ("turn", pa.int32()),
        ("arrival_step", pa.int64()),
        ("arrival_s", pa.float64()),
        ("prompt_tokens", pa.int32()),
        ("output_tokens", pa.int32()),
        ("priority", pa.int32()),
        ("segments", pa.list_(SEGMENT_TYPE)),
        ("accept", pa.list_(pa.int32())),
    ]
)

# Columns a trace file may leave out (all null then): older aisim Parquet traces have none of them.
OPTIONAL_COLUMNS = ("accept",)

# The columns every trace table has, in schema order.
REQUIRED_COLUMNS = tuple(name for name in TRACE_SCHEMA.names if name not in OPTIONAL_COLUMNS)


def stream_id(kind: str, name: str) -> int:
    """A stable 64-bit token-stream id for ``kind:name`` (never 0)."""
    digest = hashlib.blake2b(f"{kind}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1


def output_streams(request_ids) -> np.ndarray:
    """The token streams of the requests' output tokens (uint64, never 0).

    FNV-1a over each id's UTF-8 bytes, finished with a splitmix64 avalanche
    (``aisim._core.tracescan.id_streams``); the value depends only on the id,
    never on the batch.

    Parameters
    ----------
    request_ids : iterable of str, or pyarrow string array
        The ids (an Arrow array is read from its buffers, without a Python
        string per id).
    """
    from aisim._core.tracescan import id_streams

    if isinstance(request_ids, pa.ChunkedArray):
        request_ids = request_ids.combine_chunks()
    if not isinstance(request_ids, pa.Array):
        request_ids = pa.array(list(request_ids), pa.string())
    arr = request_ids
    n = len(arr)
    out = np.zeros(n, dtype=np.uint64)
    if n == 0:
        return out
    wide = arr.type == pa.large_string()
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64 if wide else np.int32)[arr.offset:arr.offset + n + 1]
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8) if arr.buffers()[2] is not None else np.zeros(0, np.uint8)
    id_streams(data, offsets.astype(np.int64), out)
    return out


def output_stream(request_id: str) -> int:
    """The token stream of one request's output tokens (see :func:`output_streams`)."""
    return int(output_streams([request_id])[0])


def canonical_segments(segments):
    """Merge adjacent contiguous runs of one stream and drop empty ones.

    Any decomposition of the same tokens then gives the same segments, so the
    same block hashes.
    """
    out = []
    for stream, first, length in segments:
        if length <= 0:
            continue
        if out and out[-1][0] == stream and out[-1][1] + out[-1][2] == first:
            out[-1] = (stream, out[-1][1], out[-1][2] + length)
        else:
            out.append((stream, first, length))
    return out


def trace_table(rows: dict, clock: str) -> pa.Table:
    """Build a trace table from column lists, sorted stably by arrival.

    ``rows`` holds one list per column; ``model``, ``session_id``, ``turn`` and
    ``accept`` may be left out (null, null, 0, null).  ``clock`` is ``"step"`` or ``"time"``.
    """
    n = len(rows["request_id"])
    rows = dict(rows)
    rows.setdefault("model", [None] * n)
    rows.setdefault("session_id", [None] * n)
    rows.setdefault("turn", [0] * n)
    rows.setdefault("accept", [None] * n)
    key = rows["arrival_step"] if clock == "step" else rows["arrival_s"]
    order = np.argsort(np.asarray(key, dtype=np.float64), kind="stable")
    cols = {k: [v[i] for i in order] for k, v in rows.items()}
    table = pa.table(
        {
            "model": pa.array(cols["model"], pa.string()),
            "request_id": pa.array(cols["request_id"], pa.string()),
            "session_id": pa.array(cols["session_id"], pa.string()),
            "turn": pa.array(cols["turn"], pa.int32()),
            "arrival_step": pa.array(cols["arrival_step"], pa.int64()),
            "arrival_s": pa.array(cols["arrival_s"], pa.float64()),
            "prompt_tokens": pa.array(cols["prompt_tokens"], pa.int32()),
            "output_tokens": pa.array(cols["output_tokens"], pa.int32()),
            "priority": pa.array(cols["priority"], pa.int32()),
            "segments": pa.array(
                [[{"stream": s, "first": f, "length": n} for s, f, n in segs] for segs in cols["segments"]],
                pa.list_(SEGMENT_TYPE),
            ),
            "accept": pa.array(cols["accept"], pa.list_(pa.int32())),
        },
        schema=TRACE_SCHEMA,
    )
    return table.replace_schema_metadata({"clock": clock})
