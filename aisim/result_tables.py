"""The replay's result tables from the core's columns: ``requests`` and ``steps``, their columns
and types as :mod:`aisim.columns` declares them (used by :mod:`aisim.replay`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aisim._core.constants import REQUEST_STATUS, names_by_code
from aisim._core.constants import STEP_KINDS as STEP_KIND_CODES
from aisim.arrowwrap import arrow_array
from aisim.columns import DISK_REQUESTS, DISK_STEPS, OFFLOAD_REQUESTS, OFFLOAD_STEPS, REQUESTS, STEPS
from aisim.config.engine import EngineConfig

# Request status and step-line names, listed by the core's codes (aisim._core.constants).
STATUS_NAMES = names_by_code(REQUEST_STATUS)
STEP_KINDS = names_by_code(STEP_KIND_CODES)
# The requests table's status labels: the core's, then ``rejected`` (aisim.summary.REJECTED).
STATUS_LABELS = STATUS_NAMES + ["rejected"]


# Each label list as an Arrow dictionary (its type and values), built once.
_DICTIONARIES = {}


def _labels(codes, names) -> pa.DictionaryArray:
    key = tuple(names)
    if key not in _DICTIONARIES:
        _DICTIONARIES[key] = (pa.dictionary(pa.int8(), pa.string()), pa.array(names, pa.string()))
    typ, values = _DICTIONARIES[key]
    codes = np.ascontiguousarray(codes, dtype=np.int8)
    return pa.DictionaryArray.from_buffers(typ, len(codes), [None, pa.py_buffer(codes)], values)


def _nan_where(mask, values):
    v = values.astype(np.float64, copy=True)
    v[mask] = np.nan
    return v


def requests_table(trace: pa.Table, r: dict) -> pa.Table:
    """The replay's ``requests`` table, columns and types as :data:`aisim.columns.REQUESTS` declares them,
    then the KV offload tier's (:data:`aisim.columns.OFFLOAD_REQUESTS`, ``DISK_REQUESTS``) when the
    core's columns ``r`` hold them."""
    arrival = r["arrival_s"]
    first_tok = r["first_token_s"]
    finish = r["finish_s"]
    out_tok = r["output_tokens"]
    done = finish >= 0
    ttft = _nan_where(first_tok < 0, first_tok - arrival)
    e2e = _nan_where(~done, finish - arrival)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(done & (out_tok > 1), (finish - first_tok) / np.maximum(out_tok - 1, 1), np.nan)
    cols = {
        "request_id": trace.column("request_id"),
        "arrival_s": _nan_where(arrival < 0, arrival),
        "picked_up_s": _nan_where(r["picked_up_s"] < 0, r["picked_up_s"]),
        "first_scheduled_s": _nan_where(r["first_scheduled_s"] < 0, r["first_scheduled_s"]),
        "first_token_s": _nan_where(first_tok < 0, first_tok),
        "finish_s": _nan_where(~done, finish),
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": e2e,
        "prompt_tokens": trace.column("prompt_tokens"),
        "output_tokens": out_tok.astype(np.int32),
        "cached_tokens": r["cached_tokens"].astype(np.int32),
        "cached_tokens_all_admissions": r["cached_tokens_all_admissions"].astype(np.int32),
        "preemptions": r["preemptions"],
        "status": _labels(r["status"], STATUS_LABELS),
        "spec_drafts": r["spec_drafts"].astype(np.int32),
        "spec_accepted": r["spec_accepted"].astype(np.int32),
    }
    tiers = _tiers(r, OFFLOAD_REQUESTS, DISK_REQUESTS)
    for t in tiers:
        cols.update((c.name, r[c.name]) for c in t.columns)
    return _table(cols, _schema(REQUESTS, tiers))


def steps_table(s: dict, engine: EngineConfig) -> pa.Table:
    """Step columns plus KV-cache occupancy in blocks, bytes and usage.

    ``active`` blocks are referenced by requests; ``cached`` blocks are free
    (evictable) but still hold a reusable prefix; ``empty`` blocks hold nothing.
    ``kv_usage`` is vLLM's (``KVCacheManager.usage``: active / usable blocks);
    physical usage counts cached blocks too.  Columns and types are
    :data:`aisim.columns.STEPS`'s, then the KV offload tier's (:data:`aisim.columns.OFFLOAD_STEPS`,
    ``DISK_STEPS``) when the core's columns ``s`` hold them.
    """
    from aisim.config.kvgroups import block_bytes

    usable = float(engine.usable_blocks)
    cols = dict(s)
    cols["kind"] = _labels(s["kind"], STEP_KINDS)
    active = engine.usable_blocks - s["free_blocks"].astype(np.int64)
    cols["active_blocks"] = active.astype(np.int32)
    cols["empty_blocks"] = (s["free_blocks"] - s["cached_blocks"]).astype(np.int32)
    cols["kv_usage"] = active / usable
    cols["physical_usage"] = (active + s["cached_blocks"]) / usable
    bpb = block_bytes(engine)
    cols["kv_cache_active_bytes"] = active * bpb
    cols["kv_cache_cached_bytes"] = s["cached_blocks"].astype(np.int64) * bpb
    return _table(cols, _schema(STEPS, _tiers(s, OFFLOAD_STEPS, DISK_STEPS)))


def _tiers(cols: dict, offload, disk) -> tuple:
    """The KV offload column tables whose columns the core's ``cols`` hold: the CPU tier's, then the
    disk tier's behind it (their columns follow the table's own, in this order)."""
    if offload.columns[0].name not in cols:
        return ()
    return (offload, disk) if disk.columns[-1].name in cols else (offload,)


# The replay schemas (with the offload tables' columns appended) with each field's numpy dtype
# (None: not a plain number), built once.
_SCHEMAS = {}


def _schema(table, tiers: tuple = ()):
    key = (table.name, *(t.name for t in tiers))
    if key not in _SCHEMAS:
        schema = table.replay_schema()
        if tiers:
            schema = pa.schema(list(schema) + [pa.field(c.name, c.arrow_type) for t in tiers for c in t.columns],
                               metadata=schema.metadata)
        plain = [f.type.to_pandas_dtype() if pa.types.is_integer(f.type) or pa.types.is_floating(f.type) else None
                 for f in schema]
        _SCHEMAS[key] = (schema, plain)
    return _SCHEMAS[key]


def _table(cols: dict, schema_dtypes) -> pa.Table:
    """``cols`` as a table of exactly the schema: its columns, in its order, of its types (no casts).

    A contiguous numpy column already of its field's type is wrapped as it is (as
    :func:`aisim.arrowwrap.arrow_array` wraps it); anything else goes through ``arrow_array``.
    """
    schema, dtypes = schema_dtypes
    arrays = []
    for f, dt in zip(schema, dtypes):
        v = cols[f.name]
        if dt is not None and type(v) is np.ndarray and v.dtype == dt and v.ndim == 1 and v.flags.c_contiguous:
            arrays.append(pa.Array.from_buffers(f.type, len(v), [None, pa.py_buffer(v)]))
        else:
            arrays.append(arrow_array(v, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)
