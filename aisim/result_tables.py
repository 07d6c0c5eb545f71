"""The replay's result tables from the core's columns: ``requests`` and ``steps``, their columns
and types as :mod:`aisim.columns` declares them (used by :mod:`aisim.replay`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aisim._core.constants import REQUEST_STATUS, names_by_code
from aisim._core.constants import STEP_KINDS as STEP_KIND_CODES
from aisim.arrowwrap import arrow_array
from aisim.columns import REQUESTS, STEPS
from aisim.config.engine import EngineConfig

# Request status and step-line names, listed by the core's codes (aisim._core.constants).
STATUS_NAMES = names_by_code(REQUEST_STATUS)
STEP_KINDS = names_by_code(STEP_KIND_CODES)
# The requests table's status labels: the core's, then ``rejected`` (aisim.summary.REJECTED).
STATUS_LABELS = STATUS_NAMES + ["rejected"]


def _labels(codes, names) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(arrow_array(codes.astype(np.int8), pa.int8()), pa.array(names, pa.string()))


def _nan_where(mask, values):
    v = values.astype(np.float64, copy=True)
    v[mask] = np.nan
    return v


def requests_table(trace: pa.Table, r: dict) -> pa.Table:
    """The replay's ``requests`` table, columns and types as :data:`aisim.columns.REQUESTS` declares them."""
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
    return _table(cols, REQUESTS.replay_schema())


def steps_table(s: dict, engine: EngineConfig) -> pa.Table:
    """Step columns plus KV-cache occupancy in blocks, bytes and usage.

    ``active`` blocks are referenced by requests; ``cached`` blocks are free
    (evictable) but still hold a reusable prefix; ``empty`` blocks hold nothing.
    ``kv_usage`` is vLLM's (``KVCacheManager.usage``: active / usable blocks);
    physical usage counts cached blocks too.  Columns and types are
    :data:`aisim.columns.STEPS`'s.
    """
    from aisim.config.kvgroups import block_bytes

    usable = float(engine.num_gpu_blocks - 1)
    cols = dict(s)
    cols["kind"] = _labels(s["kind"], STEP_KINDS)
    active = (engine.num_gpu_blocks - 1) - s["free_blocks"].astype(np.int64)
    cols["active_blocks"] = active.astype(np.int32)
    cols["empty_blocks"] = (s["free_blocks"] - s["cached_blocks"]).astype(np.int32)
    cols["kv_usage"] = active / usable
    cols["physical_usage"] = (active + s["cached_blocks"]) / usable
    bpb = block_bytes(engine)
    cols["kv_cache_active_bytes"] = active * bpb
    cols["kv_cache_cached_bytes"] = s["cached_blocks"].astype(np.int64) * bpb
    return _table(cols, STEPS.replay_schema())


def _table(cols: dict, schema: pa.Schema) -> pa.Table:
    """``cols`` as a table of exactly ``schema``: its columns, in its order, of its types (no casts)."""
    return pa.Table.from_arrays([arrow_array(cols[f.name], f.type) for f in schema], schema=schema)
