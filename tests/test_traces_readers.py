"""Trace readers (Mooncake, Azure, agentic, Parquet), synthetic traces, ``inspect_trace`` and ``aisim trace``.

Expected counts are computed here from the raw sample files with the standard
library only, never by calling a reader a second time.
"""

import csv
import glob
import json
import os
from collections import Counter
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.config.engine import engine_config_from_dict
from aisim.errors import ConfigError, TraceError
from aisim.replay import replay
from aisim.traces import READERS, guess_format, read_trace
from aisim.traces.agentic import read_agentic
from aisim.traces.azure import read_azure
from aisim.traces.common import bad_rows
from aisim.traces.inspect import inspect_trace
from aisim.traces.mooncake import read_mooncake, unit_stream, unit_streams
from aisim.traces.parquet import read_parquet, write_trace
from aisim.traces.schema import output_stream, stream_id
from aisim.traces.synth import synth_trace

from conftest import DATA

TRACES = os.path.join(DATA, "traces")
MOONCAKE = os.path.join(TRACES, "mooncake", "synthetic_trace.jsonl")
AZURE = os.path.join(TRACES, "azure2023", "AzureLLMInferenceTrace_code_head500.csv")
WEKA = os.path.join(TRACES, "weka")
WEKA_FILES = sorted(glob.glob(os.path.join(WEKA, "*.json")))


def segs(table, i):
    return [(s["stream"], s["first"], s["length"]) for s in table.column("segments")[i].as_py()]


def _tokens(segments, n):
    """The first ``n`` tokens as (stream, offset) pairs."""
    out = []
    for stream, first, length in segments:
        out.extend((stream, first + k) for k in range(min(length, n - len(out))))
    return out


def col(table, name):
    return table.column(name).to_pylist()


@pytest.fixture(scope="module")
def mooncake_raw():
    with open(MOONCAKE) as fh:
        return [json.loads(line) for line in fh]


@pytest.fixture(scope="module")
def mooncake_table():
    return read_mooncake(MOONCAKE)


# ------------------------------------------------------------------------------------------ Mooncake

def test_mooncake_counts_match_the_raw_file(mooncake_raw, mooncake_table):
    t = mooncake_table
    stamps = [o["timestamp"] for o in mooncake_raw]
    assert t.num_rows == len(mooncake_raw) == 3993
    assert sum(col(t, "prompt_tokens")) == sum(o["input_length"] for o in mooncake_raw)
    assert sum(col(t, "output_tokens")) == sum(o["output_length"] for o in mooncake_raw)
    assert set(col(t, "session_id")) == {None}
    arrival = col(t, "arrival_s")
    assert arrival[0] == 0.0 and arrival[-1] == pytest.approx((max(stamps) - min(stamps)) / 1000)
    assert arrival == sorted(arrival)
    assert t.schema.metadata[b"clock"] == b"time" and t.schema.metadata[b"unit_tokens"] == b"512"
    assert bad_rows(t) == 0
    assert col(t, "request_id")[:2] == ["synthetic_trace:1", "synthetic_trace:2"]


def test_mooncake_hash_ids_become_unit_segments(mooncake_raw, mooncake_table):
    first = mooncake_raw[0]
    n, ids = first["input_length"], first["hash_ids"]
    expect = [(_splitmix(u, ""), 0, 512) for u in ids[:-1]]
    expect.append((_splitmix(ids[-1], ""), 0, n - 512 * (len(ids) - 1)))
    assert segs(mooncake_table, 0) == expect
    assert guess_format(MOONCAKE) == "mooncake"


def _splitmix(u, namespace):
    """splitmix64 of ``u * golden + seed`` in Python integers: the stream of Mooncake hash id ``u``."""
    m = 2**64
    x = (u * 0x9E3779B97F4A7C15 + stream_id("mooncake-units", namespace)) % m
    x ^= x >> 30
    x = x * 0xBF58476D1CE4E5B9 % m
    x ^= x >> 27
    x = x * 0x94D049BB133111EB % m
    x ^= x >> 31
    return x or 1


def test_mooncake_unit_streams_are_splitmix64_of_the_ids():
    ids = [0, 1, 2, 511, 2**31, 2**63 - 1]
    assert [int(x) for x in unit_streams(np.array(ids, np.int64))] == [_splitmix(u, "") for u in ids]
    assert [int(x) for x in unit_streams(np.array(ids, np.int64), "ns")] == [_splitmix(u, "=ns") for u in ids]
    assert unit_stream(2**64 - 1) == _splitmix(2**64 - 1, "")
    # The id whose mixed value is 0 (id * golden + seed wraps to 0) gets stream 1; uint64 ids as int64 ones.
    zero = (-stream_id("mooncake-units", "") * pow(0x9E3779B97F4A7C15, -1, 2**64)) % 2**64
    assert _splitmix(zero, "") == 1 and [int(x) for x in unit_streams(np.array([zero, 5], np.uint64))] == [1, _splitmix(5, "")]
    assert unit_streams(np.array([[3, 4]], np.int64)[:, ::-1][0]).tolist() == [_splitmix(4, ""), _splitmix(3, "")]
    # Past 64 bits (only the line path reads such ids): a hash of the id's text.
    assert unit_stream(2**64) == stream_id("mooncake-unit", str(2**64))
    assert unit_stream(2**64, "x") == stream_id("mooncake-unit", f"x:{2**64}")
    # A namespace, even an empty one, keeps equal ids apart.
    assert len({unit_stream(7), unit_stream(7, ""), unit_stream(7, "x")}) == 3


def test_mooncake_ids_past_int64_go_by_the_line_path(tmp_path):
    rows = [{"timestamp": i, "input_length": 600, "output_length": 1, "hash_ids": [5, 2**63 + i]} for i in range(2)]
    rows += [{"timestamp": 9, "input_length": 600, "output_length": 1, "hash_ids": [5, 2**70]}] * 2
    t = read_mooncake(_write_lines(tmp_path / "big.jsonl", rows))
    assert [s[1][0] for s in map(lambda i: segs(t, i), range(4))] == \
        [_splitmix(2**63, ""), _splitmix(2**63 + 1, ""), stream_id("mooncake-unit", str(2**70)),
         stream_id("mooncake-unit", str(2**70))]
    assert {segs(t, i)[0] for i in range(4)} == {(_splitmix(5, ""), 0, 512)}


def test_mooncake_ideal_hit_ratio_two_ways(mooncake_raw, mooncake_table):
    # The obvious computation over hash ids: a block is cached once an earlier request had the
    # same prefix of ids ending in a full 512-token block.
    seen, hit, total = set(), 0, 0
    for o in sorted(mooncake_raw, key=lambda o: o["timestamp"]):
        ids, full = o["hash_ids"], o["input_length"] // 512
        k = 0
        while k < full and tuple(ids[: k + 1]) in seen:
            k += 1
        hit += 512 * k
        total += o["input_length"]
        seen.update(tuple(ids[: j + 1]) for j in range(full))
    info = inspect_trace(mooncake_table)
    assert info["block_size"] == 512
    assert info["ideal_hit_tokens"] == hit
    assert info["ideal_hit_ratio"] == pytest.approx(hit / total, abs=0)
    assert 0.64 < info["ideal_hit_ratio"] < 0.67  # published: about 66%


def _write_lines(path, objs):
    with open(path, "w") as fh:
        for o in objs:
            fh.write(o if isinstance(o, str) else json.dumps(o))
            fh.write("\n")
    return str(path)


def test_mooncake_bad_rows_name_file_line_and_field(tmp_path):
    good = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
    cases = [
        ("{not json", "not valid JSON"),
        ({"timestamp": 5, "output_length": 5, "hash_ids": [1]}, "field 'input_length'"),
        ({"timestamp": 5, "input_length": 10, "output_length": 0, "hash_ids": [1]}, "field 'output_length'"),
        ({"timestamp": "x", "input_length": 10, "output_length": 1, "hash_ids": [1]}, "field 'timestamp'"),
        ({"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [1]}, "field 'hash_ids'"),
        ({"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [-1]}, "field 'hash_ids'"),
        ({"input_length": 10, "output_length": 1, "hash_ids": [1]}, "field 'timestamp'"),
    ]
    for k, (bad, field) in enumerate(cases):
        p = _write_lines(tmp_path / f"t{k}.jsonl", [good, good, bad, good])
        with pytest.raises(TraceError) as exc:
            read_mooncake(p)
        assert f"{p}:3: " in str(exc.value) and field in str(exc.value), str(exc.value)
    p = _write_lines(tmp_path / "mixed.jsonl", [good] + [c for c, _ in cases] + [good])
    t = read_mooncake(p, skip_bad_rows=True)
    assert t.num_rows == 2 and bad_rows(t) == len(cases)
    assert t.schema.metadata[b"first_bad_row"].decode().startswith(f"{p}:2: not valid JSON")


def test_mooncake_skipped_turn_spoils_the_rest_of_its_session(tmp_path):
    rows = [
        {"session_id": "a", "timestamp": 0, "input_length": 10, "output_length": 2},
        {"session_id": "a", "timestamp": 1, "input_length": -1, "output_length": 2},
        {"session_id": "a", "timestamp": 2, "input_length": 10, "output_length": 2},
        {"session_id": "b", "timestamp": 3, "input_length": 10, "output_length": 2},
        {"session_id": "b", "delay": 500, "input_length": 10, "output_length": 2},
    ]
    p = _write_lines(tmp_path / "s.jsonl", rows)
    t = read_mooncake(p, delta=True, skip_bad_rows=True)
    assert bad_rows(t) == 2
    assert col(t, "session_id") == ["a", "b", "b"] and col(t, "turn") == [0, 0, 1]
    assert col(t, "arrival_s") == [0.0, 0.003, 0.503]


def test_mooncake_delta_turn_holds_the_previous_prompt_and_output(tmp_path):
    rows = [
        {"session_id": "s1", "timestamp": 1000, "input_length": 700, "output_length": 50, "hash_ids": [1, 2],
         "request_id": "q1", "model": "m"},
        {"timestamp": 1500, "input_length": 300, "output_length": 7, "hash_ids": [1]},
        {"session_id": "s1", "delay": 2000, "input_length": 100, "output_length": 20, "hash_ids": [9],
         "request_id": "q2"},
    ]
    p = _write_lines(tmp_path / "d.jsonl", rows)
    t = read_trace(p, "mooncake-delta", model="default")
    unit = lambda u: _splitmix(u, "")  # noqa: E731
    first = [(unit(1), 0, 512), (unit(2), 0, 188)]
    assert col(t, "request_id") == ["q1", "d:2", "q2"]
    assert col(t, "session_id") == ["s1", None, "s1"] and col(t, "turn") == [0, 0, 1]
    assert col(t, "model") == ["m", "default", "default"]
    assert col(t, "arrival_s") == [0.0, 0.5, 2.0]
    assert segs(t, 0) == first
    assert segs(t, 2) == first + [(output_stream("q1"), 0, 50), (unit(9), 0, 100)]
    assert col(t, "prompt_tokens") == [700, 300, 850]
    # The same file read as full Mooncake: every line describes its whole prompt.
    full = read_mooncake(p)
    assert col(full, "prompt_tokens") == [700, 300, 100] and segs(full, 2) == [(unit(9), 0, 100)]
    assert read_mooncake(p, namespace="x").column("segments")[0].as_py()[0]["stream"] == _splitmix(1, "=x")


def test_mooncake_wrong_unit_size_and_duplicate_ids(tmp_path):
    with pytest.raises(TraceError, match=r"synthetic_trace.jsonl:1: field 'hash_ids' .*wrong unit size"):
        read_mooncake(MOONCAKE, unit_tokens=256)
    p = _write_lines(tmp_path / "dup.jsonl", [{"request_id": "a", "timestamp": 0, "input_length": 1,
                                               "output_length": 1}] * 2)
    with pytest.raises(TraceError, match=r"dup.jsonl:2: field 'request_id': 'a' already used on line 1"):
        read_mooncake(p)


# ------------------------------------------------------------------------------------------ Azure

def test_azure_counts_match_the_raw_file():
    with open(AZURE, newline="") as fh:
        raw = list(csv.DictReader(fh))
    stamps = [datetime.fromisoformat(r["TIMESTAMP"][:26]) for r in raw]
    t = read_azure(AZURE, model="code")
    assert t.num_rows == len(raw) == 500
    assert sum(col(t, "prompt_tokens")) == sum(int(r["ContextTokens"]) for r in raw)
    assert sum(col(t, "output_tokens")) == sum(int(r["GeneratedTokens"]) for r in raw)
    arrival = col(t, "arrival_s")
    assert arrival[0] == 0.0
    assert arrival[-1] == pytest.approx((max(stamps) - min(stamps)).total_seconds(), abs=2e-6)
    assert set(col(t, "model")) == {"code"} and set(col(t, "session_id")) == {None}
    streams = [s for i in range(t.num_rows) for s, _, _ in segs(t, i)]
    assert len(streams) == len(set(streams)) == 500  # one private segment per request
    info = inspect_trace(t)
    assert info["ideal_hit_tokens"] == 0 and info["models"] == {"code": 500}
    prompts = [int(r["ContextTokens"]) for r in raw]
    assert info["prompt_tokens"]["p90"] == pytest.approx(float(np.percentile(prompts, 90)))
    assert info["prompt_tokens"]["mean"] == pytest.approx(sum(prompts) / len(prompts))
    assert guess_format(AZURE) == "azure"


def test_azure_bad_rows(tmp_path):
    head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    ok = "2023-11-16 18:17:03.9799600,10,2\n"
    p = tmp_path / "a.csv"
    p.write_text(head + ok + "2023-11-16 18:17:04.1,abc,2\n" + ok)
    with pytest.raises(TraceError, match=rf"{p}:3: field 'ContextTokens' must be an integer"):
        read_azure(p)
    p.write_text(head + ok + "yesterday,3,2\n" + "2023-11-16 18:17:05,3\n" + "2023-11-16 18:17:05,3,0\n" + ok)
    with pytest.raises(TraceError, match=rf"{p}:3: field 'TIMESTAMP'"):
        read_azure(p)
    t = read_azure(p, skip_bad_rows=True)
    assert t.num_rows == 2 and bad_rows(t) == 3
    q = tmp_path / "b.csv"
    q.write_text("TIMESTAMP,ContextTokens\n" + "2023-11-16 18:17:03,10\n")
    with pytest.raises(TraceError, match=rf"{q}:1: missing column 'GeneratedTokens'"):
        read_azure(q)


# ------------------------------------------------------------------------------------------ agentic

def _flatten(reqs, start, session, out, models):
    turn = 0
    for r in reqs:
        if r["type"] == "subagent":
            _flatten(r["requests"], start + r["t"], f"{session}/{r['agent_id']}", out, r.get("models"))
        else:
            out.append((session, turn, start + r["t"], r["in"], r["out"], r["model"]))
            turn += 1


def _weka_raw(files):
    out = []
    for f in files:
        with open(f) as fh:
            doc = json.load(fh)
        _flatten(doc["requests"], 0.0, doc["id"], out, doc["models"])
    return out


def test_agentic_counts_match_the_raw_files():
    raw = _weka_raw(WEKA_FILES)
    t = read_agentic(WEKA)
    assert t.num_rows == len(raw) == 92
    assert sum(col(t, "prompt_tokens")) == sum(r[3] for r in raw)
    assert sum(col(t, "output_tokens")) == sum(r[4] for r in raw)
    assert len(set(col(t, "session_id"))) == len({r[0] for r in raw}) == 9
    assert min(col(t, "arrival_s")) == min(r[2] for r in raw)
    assert max(col(t, "arrival_s")) == pytest.approx(max(r[2] for r in raw))
    assert Counter(col(t, "model")) == Counter(r[5] for r in raw)
    got = sorted(zip(col(t, "session_id"), col(t, "turn"), col(t, "arrival_s"), col(t, "prompt_tokens")))
    assert got == sorted((r[0], r[1], r[2], r[3]) for r in raw)
    # The files' own totals agree too.
    for f in WEKA_FILES:
        with open(f) as fh:
            doc = json.load(fh)
        mine = [p for rid, p in zip(col(t, "request_id"), col(t, "prompt_tokens"))
                if rid.startswith((doc["id"] + ":", doc["id"] + "/"))]
        assert sum(mine) == doc["totals"]["combined_tokens"]["input"]
    assert t.schema.metadata[b"unit_tokens"] == b"64" and guess_format(WEKA) == "agentic"


def test_agentic_glob_dir_and_file_agree():
    by_dir = read_agentic(WEKA)
    assert read_trace(os.path.join(WEKA, "trace_0*.json"), "agentic").equals(by_dir)
    one = read_trace(WEKA_FILES[0])
    assert one.num_rows == 7 and set(col(one, "session_id")) == {"trace_0165"}
    assert col(one, "request_id")[:2] == ["trace_0165:0", "trace_0165:1"]


def test_agentic_ids_are_private_to_a_file_but_shared_by_its_sub_agents():
    t = read_agentic(WEKA)
    streams = {}
    for i, sid in enumerate(col(t, "session_id")):
        streams.setdefault(sid.split("/")[0], set()).update(s for s, _, _ in segs(t, i))
    convs = sorted(streams)
    for a in convs:
        for b in convs:
            if a < b:
                assert not streams[a] & streams[b]
    # Sub-agents of trace_0277 share their common tool/system blocks (hash ids 1448, ...).
    ids = col(t, "request_id")
    sa1, sa2 = ids.index("trace_0277/agent_001:0"), ids.index("trace_0277/agent_002:0")
    assert _tokens(segs(t, sa1), 6400) == _tokens(segs(t, sa2), 6400)
    # Ids 1448..1629 of 64-token blocks (one run of the file's stream), then 11651 % 64 private tokens.
    units = stream_id("agentic-units", "local:trace_0277")
    assert segs(t, sa1) == [(units, 1448 * 64, 182 * 64),
                            (stream_id("prompt", "trace_0277/agent_001:0"), 182 * 64, 11651 - 182 * 64)]
    # And every request is a prefix-extension of the previous turn of its session up to the ids.
    info = inspect_trace(t)
    assert 0.8 < info["ideal_hit_ratio"] < 0.95


def test_agentic_sub_agent_timing_and_warm_prefix(tmp_path):
    t = read_agentic(WEKA, stagger_s=1000.0)
    ids, arrival = col(t, "request_id"), col(t, "arrival_s")
    assert arrival[ids.index("trace_0277/agent_001:2")] == pytest.approx(1000 + 79.224 + 13.0)
    assert arrival[ids.index("trace_0291:0")] == 2000.0
    warm = read_agentic(WEKA, warm_prefix_pct=1.0)
    wids = col(warm, "request_id")
    a, b = segs(warm, wids.index("trace_0165:0")), segs(warm, wids.index("trace_0277:0"))
    opus = stream_id("agentic-warm-prefix", "claude-opus-4-5-20251101")
    assert a[0] == (opus, 0, 11922 + 2729) and b[0] == (opus, 0, 12166 + 2875)
    assert inspect_trace(warm)["ideal_hit_tokens"] > inspect_trace(read_agentic(WEKA))["ideal_hit_tokens"]


def _conversation_file(path, reqs, **top):
    doc = {"id": top.pop("id", "c"), "block_size": 4, "hash_id_scope": "local", **top}
    with open(path, "w") as fh:
        fh.write(json.dumps(doc)[:-1] + ',\n"requests": [\n' + ",\n".join(json.dumps(r) for r in reqs) + "\n]}\n")
    return str(path)


def test_agentic_bad_requests_name_file_line_position_and_field(tmp_path):
    good = {"t": 0.0, "type": "n", "model": "m", "in": 9, "out": 2, "hash_ids": [1, 2]}
    sub = {"t": 5.0, "type": "subagent", "agent_id": "x", "requests": [good, dict(good, out="two")]}
    p = _conversation_file(tmp_path / "c.json", [good, dict(good, t=1.0, **{"in": -5}), good, sub])
    with pytest.raises(TraceError) as exc:
        read_agentic(p)
    assert str(exc.value).startswith(f"{p}:4: requests[1]: field 'in' must be at least 1")
    t = read_agentic(p, skip_bad_rows=True)
    assert bad_rows(t) == 2 and col(t, "request_id") == ["c:0", "c:2", "c/x:0"]
    assert t.schema.metadata[b"first_bad_row"].decode().startswith(f"{p}:4: requests[1]: field 'in'")
    q = _conversation_file(tmp_path / "d.json", [dict(good, hash_ids=[1, 2, 3, 4])], id="d")
    with pytest.raises(TraceError, match=rf"{q}:3: requests\[0\]: field 'hash_ids' has 4 ids"):
        read_agentic(q)
    # A broken file counts as one bad row; a duplicate conversation id is an error.
    (tmp_path / "e.json").write_text("{oops")
    t = read_agentic(str(tmp_path / "*.json"), skip_bad_rows=True)
    assert bad_rows(t) == 2 + 1 + 1  # two bad requests, d.json's ids, e.json
    with pytest.raises(TraceError, match=r"e.json:1: not valid JSON"):
        read_agentic(str(tmp_path / "e.json"))
    (tmp_path / "dup").mkdir()
    _conversation_file(tmp_path / "dup" / "a.json", [good])
    _conversation_file(tmp_path / "dup" / "b.json", [good])
    with pytest.raises(TraceError, match=r"b.json:1: field 'id': conversation 'c' was already read from .*a.json"):
        read_agentic(tmp_path / "dup")


# ------------------------------------------------------------------------------------------ Parquet

def test_a_parquet_file_under_another_name_is_read_as_parquet(tmp_path, mooncake_table):
    # The readers go by a file's first bytes (Parquet's magic "PAR1") where its name says nothing sure.
    p = tmp_path / "m.parquet"
    write_trace(mooncake_table, p)
    renamed = tmp_path / "m.jsonl"
    p.rename(renamed)
    assert guess_format(str(renamed)) == "parquet"
    assert read_trace(str(renamed)).equals(mooncake_table)


@pytest.mark.parametrize("name", ["t.jsonl", "t.JSON", "t.csv", "t.txt"])
def test_a_trace_is_not_written_under_a_text_format_s_name(tmp_path, mooncake_table, name):
    with pytest.raises(TraceError) as err:
        write_trace(mooncake_table, tmp_path / name)
    assert str(err.value) == f"--out {tmp_path / name}: aisim writes traces as Parquet; name the file .parquet"
    assert os.listdir(tmp_path) == []


def test_parquet_round_trip_keeps_rows_and_metadata(tmp_path, mooncake_table):
    p = tmp_path / "m.parquet"
    write_trace(mooncake_table, p)
    back = read_trace(str(p))
    assert back.equals(mooncake_table)
    assert back.schema.metadata[b"unit_tokens"] == b"512"
    assert back.schema.metadata[b"source_format"] == b"mooncake"
    assert inspect_trace(back)["ideal_hit_tokens"] == inspect_trace(mooncake_table)["ideal_hit_tokens"]


def _small_table():
    return synth_trace(6, seed=1, rate=1.0, prompt="fixed:40", output="fixed:3")


def test_parquet_schema_and_row_validation(tmp_path):
    t = _small_table()
    p = str(tmp_path / "t.parquet")
    pq.write_table(t.drop_columns(["output_tokens"]), p)
    with pytest.raises(TraceError, match=r"missing column 'output_tokens'"):
        read_parquet(p)
    pq.write_table(t.set_column(6, "prompt_tokens", pa.array([str(v) for v in col(t, "prompt_tokens")])), p)
    with pytest.raises(TraceError, match=r"column 'prompt_tokens' must be int32, got string"):
        read_parquet(p)
    # Wider integers are accepted when lossless; rows out of order are sorted.
    wide = t.set_column(6, "prompt_tokens", t.column("prompt_tokens").cast(pa.int64())).take([3, 0, 1, 2, 4, 5])
    pq.write_table(wide, p)
    assert read_parquet(p).equals(t)
    bad_prompt = col(t, "prompt_tokens")
    bad_prompt[2] = 0
    bad_out = col(t, "output_tokens")
    bad_out[4] = -1
    broken = t.set_column(6, "prompt_tokens", pa.array(bad_prompt, pa.int32())) \
              .set_column(7, "output_tokens", pa.array(bad_out, pa.int32()))
    pq.write_table(broken, p)
    with pytest.raises(TraceError, match=rf"{p}:3: field 'prompt_tokens' must be at least 1"):
        read_parquet(p)
    kept = read_parquet(p, skip_bad_rows=True)
    assert kept.num_rows == 4 and bad_rows(kept) == 2
    ids = col(t, "request_id")
    ids[5] = ids[0]
    pq.write_table(t.set_column(1, "request_id", pa.array(ids)), p)
    with pytest.raises(TraceError, match=rf"{p}:6: field 'request_id': 'r0' already used on row 1"):
        read_parquet(p)
    seg = t.column("segments").to_pylist()
    seg[1][0]["length"] -= 1
    pq.write_table(t.set_column(9, "segments", pa.array(seg, t.schema.field("segments").type)), p)
    with pytest.raises(TraceError, match=rf"{p}:2: field 'segments' must cover exactly prompt_tokens"):
        read_parquet(p)
    (tmp_path / "x.parquet").write_text("not parquet")
    with pytest.raises(TraceError, match="not a Parquet trace"):
        read_parquet(tmp_path / "x.parquet")


# ------------------------------------------------------------------------------------------ synth

def test_synth_is_deterministic_per_seed():
    kw = dict(rate=5.0, turns=3, think_time_s=2.0, prefix_groups=3, prefix_len=64, prefix_fraction=0.5)
    a, b = synth_trace(300, seed=7, **kw), synth_trace(300, seed=7, **kw)
    assert a.equals(b) and a.schema.metadata == b.schema.metadata
    c = synth_trace(300, seed=8, **kw)
    assert not c.equals(a)
    assert col(c, "arrival_s") != col(a, "arrival_s")


def test_synth_distributions_are_roughly_right():
    n = 4000
    t = synth_trace(n, seed=11, rate=10.0, prompt="lognormal:1000:0.5", output="uniform:5:50")
    gaps = np.diff(col(t, "arrival_s"))
    assert gaps.mean() == pytest.approx(0.1, rel=0.06)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.08)
    prompt = np.array(col(t, "prompt_tokens"))
    assert prompt.mean() == pytest.approx(1000, rel=0.04)
    assert np.log(prompt).std() == pytest.approx(0.5, rel=0.06)
    out = np.array(col(t, "output_tokens"))
    assert out.min() == 5 and out.max() == 50 and out.mean() == pytest.approx(27.5, rel=0.04)
    g = synth_trace(n, seed=12, rate=2.0, arrival="gamma", cv=3.0, prompt="fixed:100", output="fixed:7")
    gaps = np.diff(col(g, "arrival_s"))
    assert gaps.mean() == pytest.approx(0.5, rel=0.15)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.2)
    assert set(col(g, "prompt_tokens")) == {100} and set(col(g, "output_tokens")) == {7}


def test_synth_prefix_groups_and_sessions():
    t = synth_trace(3000, seed=3, rate=1.0, prompt="fixed:50", output="fixed:10", prefix_groups=4, prefix_len=200,
                    prefix_fraction=0.3, turns=3, think_time_s=20.0, followup="fixed:30")
    firsts = [segs(t, i)[0] for i in range(t.num_rows) if col(t, "turn")[i] == 0]
    groups = {stream_id("synth-prefix", str(g)) for g in range(4)}
    shared = [s for s in firsts if s[0] in groups]
    assert len(firsts) == 1000 and len(shared) / len(firsts) == pytest.approx(0.3, abs=0.05)
    assert {s[0] for s in shared} == groups and all(s[1:] == (0, 200) for s in shared)
    ids, by_id = col(t, "request_id"), {}
    for i, rid in enumerate(ids):
        by_id[rid] = i
    i0, i1 = by_id["s5.t0"], by_id["s5.t1"]
    assert col(t, "session_id")[i1] == "s5" and col(t, "turn")[i1] == 1
    assert segs(t, i1)[:-2] == segs(t, i0)
    assert segs(t, i1)[-2:] == [(output_stream("s5.t0"), 0, 10), (stream_id("synth-input", "s5.t1"), 0, 30)]
    assert col(t, "prompt_tokens")[i1] == col(t, "prompt_tokens")[i0] + 10 + 30
    think = [col(t, "arrival_s")[by_id[f"s{s}.t1"]] - col(t, "arrival_s")[by_id[f"s{s}.t0"]] for s in range(1000)]
    assert np.mean(think) == pytest.approx(20.0, rel=0.1)
    assert inspect_trace(t)["sessions"] == 1000


@pytest.mark.parametrize("kw", [dict(rate=0), dict(arrival="weibull"), dict(cv=2.0), dict(prompt="normal:5:1"),
                                dict(prompt="uniform:9:3"), dict(prefix_fraction=0.5), dict(turns=0)])
def test_synth_rejects_bad_parameters(kw):
    with pytest.raises(ConfigError):
        synth_trace(10, seed=0, **kw)


def test_ideal_hit_ratio_equals_the_replay_core_when_requests_never_overlap():
    """With one request at a time and a cache that never evicts, vLLM hits exactly the ideal."""
    t = synth_trace(150, seed=5, turns=3, prefix_groups=3, prefix_len=200, prefix_fraction=0.6,
                    prompt="uniform:20:400", output="uniform:2:60")
    t = t.set_column(5, "arrival_s", pa.array(np.arange(t.num_rows) * 1000.0))
    engine = engine_config_from_dict({
        "block_size": 16, "num_gpu_blocks": 100000, "max_model_len": 65536, "max_num_batched_tokens": 8192,
        "max_num_seqs": 64, "kv_cache_groups": [{"type": "full"}], "enable_prefix_caching": True})
    result = replay(t, engine)
    assert result.summary["finished"] == 150
    ideal = inspect_trace(t, 16)["ideal_hit_tokens"]
    assert ideal > 10000 and result.summary["prefix_hit_tokens_at_admission"] == ideal


# ------------------------------------------------------------------------------------------ CLI

def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_synth_writes_the_seeded_trace(tmp_path):
    out = tmp_path / "s.parquet"
    r = _cli("trace", "synth", "--out", out, "-n", 50, "--seed", 4, "--rate", 3, "--turns", 2,
             "--think-time", 1.5, "--prompt", "uniform:10:99", "--model", "llama")
    assert r.exit_code == 0, r.output
    assert "wrote 50 requests" in r.output
    expect = synth_trace(50, seed=4, rate=3.0, turns=2, think_time_s=1.5, prompt="uniform:10:99", model="llama")
    assert read_parquet(out).select(expect.column_names).equals(expect)


def test_cli_inspect_json_and_table():
    r = _cli("trace", "inspect", MOONCAKE, "--format", "json")
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["requests"] == 3993 and info["block_size"] == 512 and info["format"] == "mooncake"
    r = _cli("trace", "inspect", AZURE, "--block-size", 32, "-o", "model=code")
    assert r.exit_code == 0, r.output
    assert "500" in r.output and "code (500)" in r.output and "32-token" in r.output


def test_cli_convert_and_errors(tmp_path):
    out = tmp_path / "w.parquet"
    r = _cli("trace", "convert", WEKA, "--trace-format", "agentic", "--out", out)
    assert r.exit_code == 0, r.output
    assert read_parquet(out).num_rows == 92
    bad = _write_lines(tmp_path / "b.jsonl", [{"timestamp": 0, "input_length": 5, "output_length": 1},
                                               {"timestamp": 1, "input_length": 0, "output_length": 1}])
    r = _cli("trace", "convert", bad, "--trace-format", "mooncake", "--out", tmp_path / "b.parquet")
    assert r.exit_code == 2 and f"error: {bad}:2: field 'input_length'" in r.stderr
    r = _cli("trace", "convert", bad, "--trace-format", "mooncake", "--out", tmp_path / "b.parquet", "--skip-bad-rows")
    assert r.exit_code == 0 and "(1 bad rows skipped)" in r.output
    r = _cli("trace", "inspect", MOONCAKE, "-o", "unit=5")
    assert r.exit_code == 2 and "has no option 'unit'" in r.stderr
    r = _cli("trace", "inspect", MOONCAKE, "--trace-format", "nope")
    assert r.exit_code == 2 and "Invalid value for '--trace-format': 'nope' is not one of 'agentic'," in r.stderr


def test_every_format_is_registered():
    assert {"oracle", "mooncake", "mooncake-delta", "azure", "agentic", "parquet"} <= set(READERS)


def test_oracle_accept_lists_are_read_and_checked(tmp_path):
    from aisim.traces import read_oracle_trace

    path = tmp_path / "t.jsonl"
    path.write_text('{"request_id": "a", "prompt_len": 4, "max_tokens": 2, "arrival_step": 0, "accept": [3, 0]}\n'
                    '{"request_id": "b", "prompt_len": 4, "max_tokens": 2, "arrival_step": 1}\n')
    t = read_oracle_trace(path)
    assert t.column("accept").to_pylist() == [[3, 0], None]
    path.write_text('{"request_id": "a", "prompt_len": 4, "max_tokens": 2, "arrival_step": 0, "accept": [1, -1]}\n')
    with pytest.raises(TraceError) as exc:
        read_oracle_trace(path)
    assert str(exc.value) == (f"{path}:1: field 'accept' must be a non-empty list of non-negative integers, "
                              "got [1, -1]")


def test_parquet_keeps_accept_lists_and_reads_files_without_them(tmp_path):
    from aisim.traces import read_oracle_trace

    src = tmp_path / "t.jsonl"
    src.write_text('{"request_id": "a", "prompt_len": 4, "max_tokens": 2, "arrival_step": 0, "accept": [2]}\n'
                   '{"request_id": "b", "prompt_len": 4, "max_tokens": 2, "arrival_step": 1}\n')
    t = read_oracle_trace(src)
    write_trace(t, tmp_path / "t.parquet")
    assert read_parquet(tmp_path / "t.parquet").column("accept").to_pylist() == [[2], None]
    # An older trace file without the column: every request uses the configured rule.
    write_trace(t.drop(["accept"]), tmp_path / "old.parquet")
    assert read_parquet(tmp_path / "old.parquet").column("accept").to_pylist() == [None, None]
    bad = t.set_column(t.schema.get_field_index("accept"), "accept", pa.array([[-1], None], pa.list_(pa.int32())))
    write_trace(bad, tmp_path / "bad.parquet")
    with pytest.raises(TraceError, match=r"bad.parquet:1: field 'accept' must be null or a non-empty list"):
        read_parquet(tmp_path / "bad.parquet")
