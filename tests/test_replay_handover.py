"""How a replay's inputs reach the core and its rows come back: request id ranks, the columns
the core hands over, the result tables' labels."""

import gc

import numpy as np
import pyarrow as pa
import pytest

import aisim.replay as rp
import aisim.replay_input as ri
from aisim._core.constants import REQUEST_STATUS
from aisim._core.engine import Engine
from aisim.config.engine import engine_config_from_dict
from aisim.core_input import CoreTrace, core_config
from helpers import make_trace

# Python's str order (code points): "" < "B" < "a" = "a" < "b" < "é" (U+E9) < U+FFFF < U+10000;
# UTF-16 would put U+10000 (a surrogate pair, 0xD800...) before U+FFFF.
IDS = ["b", "a", "é", "\U00010000", "\uffff", "a", "B", ""]
RANKS = [4, 2, 5, 7, 6, 3, 1, 0]


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string()])
def test_id_ranks_follow_python_string_order_ties_in_trace_order(typ):
    ids = pa.chunked_array([pa.array(IDS[:3], typ), pa.array(IDS[3:], typ)])
    assert ri._id_rank(ids).tolist() == RANKS
    assert ri._id_rank(ids).dtype == np.int32


@pytest.mark.parametrize("limit", [None, 8])
def test_id_ranks_of_ids_with_zero_bytes_or_too_long_to_lay_out(monkeypatch, limit):
    # "a" < "a\0" < "a\0b" < "ab" (a zero byte is no padding); with a low limit the ids are
    # compared as Python strings, with the same ranks.
    if limit is not None:
        monkeypatch.setattr(ri, "_ID_BYTES_MAX", limit)
    ids = pa.chunked_array([pa.array(["ab", "a\0", "a", "a\0b"])])
    assert ri._id_rank(ids).tolist() == [3, 1, 0, 2]
    # A slice of a longer array (its buffers start before its first id).
    assert ri._id_rank(pa.array(["zz"] + IDS).slice(1)).tolist() == RANKS


def test_a_null_request_id_is_refused_as_before():
    with pytest.raises(TypeError):
        ri._id_rank(pa.chunked_array([pa.array(["a", None, "b"])]))


def _engine():
    return engine_config_from_dict({"num_gpu_blocks": 64, "block_size": 16, "max_num_seqs": 4,
                                    "max_num_batched_tokens": 64, "max_model_len": 256})


def test_run_hands_its_columns_over_and_they_outlive_the_engine():
    # a: 4 prompt tokens at step 0, 3 out; b: 20 prompt tokens at step 1, 1 out.
    # Step 0 prefills a (its first token); step 1 prefills b (its only token) and decodes a;
    # step 2 decodes a's third token.
    eng = _engine()
    trace = make_trace([{"id": "a", "prompt": 4, "max_tokens": 3, "at": 0},
                        {"id": "b", "prompt": 20, "max_tokens": 1, "at": 1}])
    segs = rp._validate(trace, eng)
    core = Engine(core_config(eng), CoreTrace(**rp._whole_arrays(trace, eng, False, segs)))
    out = core.run()
    del core
    gc.collect()
    st, rq = out["steps"], out["requests"]
    assert st["step"][:3].tolist() == [0, 1, 2]
    assert st["prefill_tokens"][:3].tolist() == [4, 20, 0]
    assert st["decode_tokens"][:3].tolist() == [0, 1, 1]
    assert st["num_reqs"][:3].tolist() == [1, 2, 1]
    assert rq["output_tokens"].tolist() == [3, 1]
    assert rq["status"].tolist() == [REQUEST_STATUS["finished"]] * 2
    # Arrays of their own: as long as the rows, writable, each column its own buffer.
    assert all(len(v) == len(st["step"]) for v in st.values())
    assert len({v.ctypes.data for v in st.values()}) == len(st)
    st["step"][0] = 99
    assert st["step"][:2].tolist() == [99, 1]


def test_a_whole_replay_equals_its_stream_after_the_handover():
    eng = _engine()
    trace = make_trace([{"id": f"r{i}", "prompt": 8 + i, "max_tokens": 2 + i % 3, "at": i // 2} for i in range(9)])
    whole = rp.replay(trace, eng)
    parts = {"requests": [], "steps": []}
    for kind, *rest in rp.replay_stream(trace.to_batches(max_chunksize=2), eng, timed=False,
                                        expected=trace.num_rows, out_rows=3):
        if kind != "summary":
            parts[kind].append(rest[0])
    assert pa.concat_tables(parts["requests"]).equals(whole.requests)
    assert pa.concat_tables(parts["steps"]).equals(whole.steps)


def test_labels_share_one_dictionary_and_keep_the_codes():
    from aisim.result_tables import STATUS_LABELS, _labels

    a = _labels(np.array([4, 0, 5], np.int8), STATUS_LABELS)
    b = _labels(np.array([1], np.int64), STATUS_LABELS)
    assert a.to_pylist() == ["finished", "pending", "rejected"]
    assert b.to_pylist() == ["waiting"]
    assert a.type == pa.dictionary(pa.int8(), pa.string())
    assert a.dictionary.equals(b.dictionary)


def test_id_ranks_equal_python_sorting_on_random_ids():
    import random

    rng = random.Random(7)
    alphabet = ["a", "b", "Z", "0", "é", "\u4e2d", "\uffff", "\U0001f600", "\x01"]
    ids = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 6))) for _ in range(2000)]
    expected = np.empty(len(ids), np.int32)
    expected[sorted(range(len(ids)), key=lambda i: (ids[i], i))] = np.arange(len(ids))
    assert ri._id_rank(pa.chunked_array([pa.array(ids[:700]), pa.array(ids[700:])])).tolist() == expected.tolist()
