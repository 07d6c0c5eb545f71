"""Text traces read in byte-range blocks: line numbers, block-size invariance, and the line-by-line path.

A block owns the lines that start in its byte range; its first line's number
is counted from the line breaks before it.  Whatever the block size, and
whether a block goes through Arrow or line by line, a reader gives the same
table and names the same ``file:line``.
"""

import os

import numpy as np
import pyarrow as pa
import pytest

from aisim.errors import TraceError
from aisim.traces import azure, mooncake, oracle
from aisim.traces.blockread import read_blocks
from aisim.traces.blocks import block_ranges, block_text, count_breaks, first_lines
from aisim.traces.common import bad_rows

from conftest import DATA


@pytest.fixture(autouse=True)
def _arrow_at_any_size(monkeypatch):
    """The samples here are small: let the Arrow path take blocks of any length."""
    from aisim.traces import blockread

    monkeypatch.setattr(blockread, "FAST_MIN_BYTES", 0)

MOONCAKE = os.path.join(DATA, "traces", "mooncake", "synthetic_trace.jsonl")
AZURE = os.path.join(DATA, "traces", "azure2023", "AzureLLMInferenceTrace_code_head500.csv")
ORACLE = os.path.join(os.path.dirname(DATA), "..", "examples", "trace.jsonl")


def _blocks(path, size):
    """Every block of ``path`` at ``size`` bytes: (first line, its text)."""
    ranges = block_ranges(os.path.getsize(path), size)
    before = first_lines([count_breaks(path, a, b) for a, b in ranges])
    return [block_text(path, a, b, n) for (a, b), n in zip(ranges, before)]


def test_blocks_own_the_lines_that_start_in_them(tmp_path):
    # Lines: 1 "aaaa", 2 "bb", 3 "" (CRLF), 4 "c" (lone CR), 5 "dddddd", 6 "e" (no break at the end).
    path = tmp_path / "t.txt"
    path.write_bytes(b"aaaa\nbb\n\r\nc\rdddddd\ne")
    assert count_breaks(str(path), 0, 20) == 5
    # 4-byte blocks: [0,4) "aaaa"; [4,8) "bb" starts at 5; [8,12) the CRLF line at 8, "c" at 10;
    # [12,16) "dddddd" starts at 12 and ends at 19; [16,20) "e" starts at 19.
    assert _blocks(str(path), 4) == [(b"aaaa\n", 1), (b"bb\n", 2), (b"\r\nc\r", 3), (b"dddddd\n", 5), (b"e", 6)]
    # 3-byte blocks: [3,6) holds the start of "bb" (5); [6,9) that of the CRLF line (8); [15,18) none.
    assert _blocks(str(path), 3)[5] == (b"", 5)
    # Whatever the block size, the blocks put together are the file, each starting on its own line.
    data = path.read_bytes()
    for size in range(1, 23):
        parts = _blocks(str(path), size)
        assert b"".join(p for p, _ in parts) == data
        for p, first in parts:
            if p:
                assert first == 1 + data[:data.index(p)].replace(b"\r\n", b"\n").replace(b"\r", b"\n").count(b"\n")


def test_a_crlf_split_by_a_block_boundary_is_one_break(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"ab\r\ncd\r\nef\r\n")
    # The boundary at 3 falls between "\r" and "\n": the line "cd" starts at 4, in the second block.
    assert count_breaks(str(path), 0, 3) == 0 and count_breaks(str(path), 3, 6) == 1
    assert count_breaks(str(path), 0, 3) + count_breaks(str(path), 3, 12) == 3
    assert [b for b in _blocks(str(path), 3) if b[0]] == [(b"ab\r\n", 1), (b"cd\r\n", 2), (b"ef\r\n", 3)]


def _oracle_lines(n, bad=()):
    out = []
    for i in range(n):
        line = f'{{"request_id": "r{i}", "prompt_len": {100 + i}, "max_tokens": 8, "arrival_step": {i // 3}}}'
        if i in bad:
            line = line.replace('"prompt_len": ', '"prompt_len": -')
        out.append(line)
    return out


@pytest.mark.parametrize("size", [None, 999, 20000])
def test_oracle_reads_the_same_table_at_any_block_size(tmp_path, size):
    want = read_blocks(ORACLE, oracle.OracleFormat())
    got = read_blocks(ORACLE, oracle.OracleFormat(), size)
    assert got.equals(want) and got.schema.metadata == want.schema.metadata and got.num_rows == 2000


@pytest.mark.parametrize("size", [97, 1000])
def test_a_bad_line_is_named_at_any_block_size(tmp_path, size):
    path = tmp_path / "t.jsonl"
    lines = _oracle_lines(60, bad={41, 52})
    lines.insert(10, "")  # a blank line still counts: the bad lines are 43 and 54
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError) as err:
        read_blocks(str(path), oracle.OracleFormat(), size)
    assert str(err.value) == f"{path}:43: field 'prompt_len' must be at least 1, got -141"
    table = read_blocks(str(path), oracle.OracleFormat(skip_bad_rows=True), size)
    assert table.num_rows == 58 and bad_rows(table) == 2
    assert table.schema.metadata[b"first_bad_row"].decode() == f"{path}:43: field 'prompt_len' must be at least 1, " \
                                                               "got -141"


@pytest.mark.parametrize("size", [80, 500])
def test_ids_and_clocks_are_checked_across_blocks(tmp_path, size):
    path = tmp_path / "t.jsonl"
    lines = _oracle_lines(30)
    lines[20] = lines[20].replace('"r20"', '"r3"')  # line 21 repeats line 4's id
    lines[25] = lines[25].replace('"arrival_step": 8', '"arrival_time": 8.0')  # line 26 changes the clock
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError) as err:
        read_blocks(str(path), oracle.OracleFormat(), size)
    assert str(err.value) == f"{path}:21: request_id 'r3' already used on line 4"
    table = read_blocks(str(path), oracle.OracleFormat(skip_bad_rows=True), size)
    assert table.num_rows == 28 and bad_rows(table) == 2
    assert "r20" not in table.column("request_id").to_pylist()


@pytest.mark.parametrize("size", [None, 20000])
@pytest.mark.parametrize("delta", [False, True])
def test_mooncake_reads_the_same_table_at_any_block_size(size, delta):
    want = read_blocks(MOONCAKE, mooncake.MooncakeFormat(delta=delta))
    got = read_blocks(MOONCAKE, mooncake.MooncakeFormat(delta=delta), size)
    assert got.equals(want) and got.schema.metadata == want.schema.metadata


def test_mooncake_sessions_carry_across_blocks(tmp_path):
    path = tmp_path / "s.jsonl"
    rows = ['{"timestamp": 0, "input_length": 10, "output_length": 5, "session_id": "a"}',
            '{"timestamp": 5, "input_length": 4, "output_length": 1}',
            '{"delay": 100, "input_length": 3, "output_length": 2, "session_id": "a"}',
            '{"timestamp": 7, "input_length": 4, "output_length": 1, "session_id": "b"}',
            '{"delay": 50, "input_length": 6, "output_length": 2, "session_id": "a"}']
    path.write_text("\n".join(rows) + "\n")
    for size in (None, 30, 90):
        t = read_blocks(str(path), mooncake.MooncakeFormat(delta=True, unit_tokens=4), size)
        by = {r["request_id"]: r for r in t.to_pylist()}
        # Turns count a session's lines; a delay counts from the previous turn's arrival; a delta
        # turn's prompt is the previous prompt, its output, then the new input.
        assert [(by[f"s:{i}"]["turn"], by[f"s:{i}"]["arrival_s"], by[f"s:{i}"]["prompt_tokens"]) for i in (1, 3, 5)] \
            == [(0, 0.0, 10), (1, 0.1, 10 + 5 + 3), (2, 0.15, 18 + 2 + 6)]


@pytest.mark.parametrize("size", [None, 700, 3000])
def test_azure_reads_the_same_table_at_any_block_size(size):
    want = read_blocks(AZURE, azure.AzureFormat())
    got = read_blocks(AZURE, azure.AzureFormat(), size)
    assert got.equals(want) and got.num_rows == 500


@pytest.mark.parametrize("fmt,path", [(oracle.OracleFormat(), ORACLE), (mooncake.MooncakeFormat(), MOONCAKE),
                                      (mooncake.MooncakeFormat(delta=True), MOONCAKE),
                                      (azure.AzureFormat(), AZURE)])
def test_the_line_by_line_path_reads_what_arrow_reads(monkeypatch, fmt, path):
    """The Arrow path and the line-by-line path of every text format give the same table."""
    fast = read_blocks(path, fmt, 4096)
    monkeypatch.setattr(type(fmt), "_fast", lambda self, *a: None)
    slow = read_blocks(path, fmt, 4096)
    assert slow.equals(fast) and slow.schema.metadata == fast.schema.metadata


def test_the_arrow_path_reads_the_samples(monkeypatch):
    """Each sample goes through Arrow, not line by line (or the speed would be the line path's)."""
    calls = []
    for cls in (oracle.OracleFormat, mooncake.MooncakeFormat, azure.AzureFormat):
        real = cls._slow
        monkeypatch.setattr(cls, "_slow", lambda self, *a, real=real: calls.append(a) or real(self, *a))
    for fmt, path in ((oracle.OracleFormat(), ORACLE), (mooncake.MooncakeFormat(), MOONCAKE),
                      (azure.AzureFormat(), AZURE)):
        assert read_blocks(path, fmt, 8192).num_rows > 0
    assert calls == []


def test_a_short_block_is_read_line_by_line(monkeypatch):
    """Below FAST_MIN_BYTES the line path reads the block: a short trace never starts Arrow's readers."""
    from aisim.traces import blockread

    monkeypatch.setattr(blockread, "FAST_MIN_BYTES", 1 << 30)
    calls = []
    monkeypatch.setattr(oracle.OracleFormat, "_fast", lambda self, *a: calls.append(a))
    assert read_blocks(ORACLE, oracle.OracleFormat(), 8192).num_rows > 0
    assert calls == []


def test_a_block_arrow_refuses_is_read_line_by_line(tmp_path):
    path = tmp_path / "t.jsonl"
    lines = _oracle_lines(20)
    lines[7] = lines[7].replace('"max_tokens": 8', '"max_tokens": 8.0')  # fine for the line path, not for Arrow
    path.write_text("\n".join(lines) + "\n")
    t = read_blocks(str(path), oracle.OracleFormat(), 200)
    assert t.num_rows == 20 and t.column("output_tokens").to_pylist() == [8] * 20
    assert isinstance(t, pa.Table)


def test_ids_used_twice_are_found_exactly_when_hashes_meet(tmp_path, monkeypatch):
    """The check holds 64-bit hashes; ids whose hashes meet are compared for real."""

    from aisim.traces import schema
    from aisim.traces.blockread import Blocks, Parsed, ids_named_twice

    path = tmp_path / "t.jsonl"
    lines = _oracle_lines(40)
    lines[30] = lines[30].replace('"r30"', '"r12"')
    path.write_text("\n".join(lines) + "\n")
    want = read_blocks(str(path), oracle.OracleFormat(skip_bad_rows=True), 300)
    # Every id of the same length now has the same hash: many meet, two are the same id.
    monkeypatch.setattr(schema, "output_streams",
                        lambda ids: np.array([len(x) for x in ids.to_pylist()], dtype=np.uint64))
    rows = pa.table({"request_id": ["a1", "b2", "c3", "a1", "dd4"]})
    parsed = [Parsed(rows.slice(0, 3)), Parsed(rows.slice(3))]
    assert ids_named_twice(Blocks.of(parsed)) == {"a1"}
    got = read_blocks(str(path), oracle.OracleFormat(skip_bad_rows=True), 300)
    assert got.equals(want) and bad_rows(got) == 1 and got.num_rows == 39


_UNIFORM = [
    # Every type null somewhere, empty and absent lists, non-ASCII strings, the last line without a break.
    b'{"timestamp":1.5,"input_length":3,"hash_ids":[7,0,12],"session_id":"s\xc3\xa9","model":"m/1"}\n'
    b'{"timestamp":null,"input_length":null,"hash_ids":[],"session_id":null,"model":"n"}\n'
    b'{"timestamp":-2e3,"input_length":-4,"hash_ids":null,"session_id":"ul","model":""}',
    # Spaces after the separators, CRLF line breaks.
    b'{"input_length": 0, "model": "x", "hash_ids": [1, 2]}\r\n{"input_length": 9, "model": null, "hash_ids": [3]}\r\n',
    # Strings that look like separators, numbers at the edges of the exact conversion.
    b'{"model":"a:b","session_id":"{","timestamp":9007199254740992,"delay":0.000123}\n'
    b'{"model":":x:","session_id":"}","timestamp":-0,"delay":1e22}\n'
    b'{"model":",","session_id":"[1]","timestamp":-0.5E-3,"delay":1234567890123456e-22}\n',
    # Lists denser than one item per 8 bytes: scanned again with room for more items.
    (b'{"hash_ids":[' + b",".join([b"1", b"0"] * 40) + b'],"input_length":5}\n') * 3,
    # Numbers beyond the exact conversion (more digits than 2**53, exponents beyond 22): the slower readers.
    b'{"timestamp":12345678901234567.0,"delay":1.7976931348623157e308,"input_length":-9223372036854775808}\n'
    b'{"timestamp":9007199254740993,"delay":1e-23,"input_length":9223372036854775807}\n',
]


@pytest.mark.parametrize("data", _UNIFORM)
def test_uniform_lines_read_as_the_json_reader_reads_them(data):
    from aisim.traces.jsonlines import read_uniform
    from aisim.traces.oracle import _read_json

    got = read_uniform(data, mooncake._JSON_SCHEMA)
    assert got is not None and got.equals(_read_json(data, mooncake._JSON_SCHEMA, "ignore"))


def test_uniform_lines_scanned_values():
    """What the typed scan reads, exactly (Python's float() is correctly rounded, as the scan must be)."""
    from aisim.traces.jsonlines import _scanned

    got = _scanned(_UNIFORM[2], ["model", "session_id", "timestamp", "delay"], ",", ":", mooncake._JSON_SCHEMA)
    assert got is not None
    got = got.to_pydict()
    assert got["model"] == ["a:b", ":x:", ","] and got["session_id"] == ["{", "}", "[1]"]
    assert got["timestamp"] == [9007199254740992.0, 0.0, -0.0005]
    assert got["delay"] == [float("0.000123"), 1e22, float("1234567890123456e-22")]
    assert str(got["timestamp"][1]) == "-0.0"
    dense = _scanned(_UNIFORM[3], ["hash_ids", "input_length"], ",", ":", mooncake._JSON_SCHEMA)
    assert dense.column("hash_ids").to_pylist() == [[1, 0] * 40] * 3
    # 2**53 + 1 has no exact double, an exponent beyond 22 needs more than one rounding: not scanned.
    assert _scanned(_UNIFORM[4], ["timestamp", "delay", "input_length"], ",", ":", mooncake._JSON_SCHEMA) is None


def test_uniform_lines_values():
    from aisim.traces.jsonlines import read_uniform

    got = read_uniform(_UNIFORM[0], mooncake._JSON_SCHEMA).to_pydict()
    assert got["timestamp"] == [1.5, None, -2000.0] and got["input_length"] == [3, None, -4]
    assert got["hash_ids"] == [[7, 0, 12], [], None] and got["session_id"] == ["s\u00e9", None, "ul"]
    assert got["model"] == ["m/1", "n", ""] and got["delay"] == [None] * 3


@pytest.mark.parametrize("first,line", [
    (b'{"input_length":1}', b'{"input_length":007}'), (b'{"input_length":1}', b'{"input_length":+5}'),
    (b'{"input_length":1}', b'{"input_length":1.0}'), (b'{"hash_ids":[1]}', b'{"hash_ids":[1,-2]}'),
    (b'{"model":"a"}', b'{"model":"a\\"b"}'),
    (b'{"model":"a"}', b'{"model":1}'), (b'{"model":"a"}', b'{"model":"\xff"}'),
    (b'{"model":"a"}', b'{"model":"a","input_length":1}'), (b'{"model":"a"}', b'{"model": "a"}'),
    (b'{"input_length":1}', b'{"input_length":9223372036854775808}'),
    (b'{"hash_ids":[1]}', b'{"hash_ids":[1,9223372036854775808]}'),
    (b'{"model":"a"}', b'{"model":"a"b"}'), (b'{"model":"a"}', b'{"model":"a\x01"}'),
    (b'{"model":"a"}', b'{"model":"a"} '), (b'{"model":"a"}', b' {"model":"a"}'),
    (b'{"hash_ids":[1]}', b'{"hash_ids":[1,,2]}'), (b'{"hash_ids":[1]}', b'{"hash_ids":[01]}'),
    (b'{"hash_ids":[1]}', b'{"hash_ids":[1,2,]}'), (b'{"hash_ids":[1]}', b'{"hash_ids":[[1]]}'),
    (b'{"input_length":1}', b'{"input_length":-}'), (b'{"input_length":1}', b'{"input_length":nul}'),
    (b'{"input_length":1}', b'{"input_length":nulll}'), (b'{"input_length":1}', b'{"input_length":1-2}'),
    (b'{"input_length":1}', b'{"input_length":-01}'), (b'{"timestamp":1}', b'{"timestamp":1.}')])
def test_uniform_lines_leave_other_lines_to_other_readers(first, line):
    """A line unlike the first, or with what this reader does not convert exactly, leaves the block to others.

    Leading zeros, a plus sign, a float for an int, a negative id, an escape, a number
    for a string, bytes that are not UTF-8, another key, other spacing, an integer beyond int64, a quote or a
    control character in a string, text around the object, empty or nested items, a lone minus, a misspelt
    null, a float with no digit after its point.
    """
    from aisim.traces.jsonlines import read_uniform

    assert read_uniform(first + b"\n" + first + b"\n", mooncake._JSON_SCHEMA) is not None
    assert read_uniform(first + b"\n" + line + b"\n", mooncake._JSON_SCHEMA) is None


def test_a_hash_id_beyond_int64_is_read_line_by_line(tmp_path):
    path = tmp_path / "big.jsonl"
    ids = ["5", "5", str(2**64 + 3), "5"]
    path.write_text("".join(f'{{"timestamp":{i},"input_length":600,"output_length":3,"hash_ids":[1,{x}]}}\n'
                            for i, x in enumerate(ids)))
    t = read_blocks(str(path), mooncake.MooncakeFormat())
    streams = [[s["stream"] for s in segs] for segs in t.column("segments").to_pylist()]
    assert streams[2] == [mooncake.unit_stream(1), mooncake.unit_stream(2**64 + 3)] and streams[0] == streams[1]
    assert t.column("prompt_tokens").to_pylist() == [600] * 4


def test_line_breaks_of_a_long_block_are_counted_exactly():
    from aisim.traces.blocks import _breaks, _count_newlines

    data = bytearray(b"x" * (3 << 20) + b"\r")
    for at in (0, (1 << 18) - 1, 1 << 18, (1 << 18) + 1, 5 * (1 << 18), len(data) - 2):
        data[at] = 10
    data[7] = 13  # a lone "\r" counts, as the line readers see it
    assert _count_newlines(bytes(data)) == 6 and _breaks(bytes(data), b"") == 8 and _breaks(bytes(data), b"\n") == 7


def test_uniform_lines_never_read_what_the_json_reader_reads_otherwise():
    """Lines one byte away from uniform ones: read as ``pyarrow.json`` reads them, or left to other readers."""
    import json
    import random

    from aisim.traces.jsonlines import read_uniform
    from aisim.traces.oracle import _read_json

    base = [b'{"timestamp":10,"input_length":300,"output_length":7,"hash_ids":[0,12,3],"session_id":"s1","model":"m"}',
            b'{"timestamp":20,"input_length":-1,"output_length":null,"hash_ids":[],"session_id":null,"model":"m/2"}',
            b'{"timestamp":2.5e1,"input_length":0,"output_length":9,"hash_ids":null,"session_id":"x","model":""}']
    alphabet = b'0123456789-+.eEnul"[],: {}\\\x01xz'
    rng = random.Random(7)
    read = 0
    for _ in range(1500):
        lines = [bytearray(x) for x in base[:rng.choice((2, 3))]]  # with or without the float line
        line = rng.choice(lines[1:])
        k = rng.randrange(len(line))
        op = rng.randrange(3)
        if op == 0:
            line[k:k + 1] = b""
        else:
            line[k:k + op - 1] = bytes([rng.choice(alphabet)])
        data = b"\n".join(bytes(x) for x in lines) + b"\n"
        got = read_uniform(data, mooncake._JSON_SCHEMA)
        if got is None:
            continue
        read += 1
        for x in lines:
            json.loads(x)  # every line read is JSON
        assert got.equals(_read_json(data, mooncake._JSON_SCHEMA, "ignore")), data
    assert 50 < read < 1500  # some mutations still make uniform lines (a digit for a digit), most do not


def test_request_ids_made_of_line_numbers():
    got = mooncake._line_id_column("tr\u00e9", np.array([1, 9, 10, 99, 100, 1234567890123], np.int64))
    assert got.to_pylist() == ["tr\u00e9:1", "tr\u00e9:9", "tr\u00e9:10", "tr\u00e9:99", "tr\u00e9:100",
                               "tr\u00e9:1234567890123"]
    got.validate(full=True)
    assert mooncake._line_id_column("x", np.array([], np.int64)).to_pylist() == []


def test_scanned_numbers_are_the_correctly_rounded_ones():
    """Random JSON numbers: what the scan reads is Python's (correctly rounded) value, or it leaves the block."""
    import json
    import random

    from aisim.traces.jsonlines import _scanned
    from aisim.traces.oracle import _read_json

    rng = random.Random(11)

    def number():
        whole = rng.choice(["0", str(rng.randrange(1, 10)), str(rng.randrange(10**rng.randrange(1, 20)))])
        frac = rng.choice(["", "", "." + "".join(rng.choice("0123456789") for _ in range(rng.randrange(1, 8)))])
        exp = rng.choice(["", "", f"e{rng.randrange(-25, 26)}", f"E+{rng.randrange(0, 24)}", f"e-0{rng.randrange(9)}"])
        return rng.choice(["", "-"]) + whole + frac + exp

    scanned = refused = 0
    for _ in range(600):
        toks = [number() for _ in range(3)]
        ints = [str(rng.randrange(-2**63, 2**63)) for _ in toks]
        ids = [",".join(str(rng.randrange(2**rng.randrange(1, 64))) for _ in range(rng.randrange(0, 4))) for _ in toks]
        data = "".join(f'{{"timestamp":{t},"input_length":{i},"hash_ids":[{h}]}}\n'
                       for t, i, h in zip(toks, ints, ids)).encode()
        got = _scanned(data, ["timestamp", "input_length", "hash_ids"], ",", ":", mooncake._JSON_SCHEMA)
        if got is None:
            refused += 1
            continue
        scanned += 1
        assert got.column("timestamp").to_pylist() == [float(t) for t in toks]
        assert [str(v) for v in got.column("timestamp").to_pylist()] == [str(float(t)) for t in toks]  # -0.0 too
        assert got.column("input_length").to_pylist() == [int(i) for i in ints]
        assert got.column("hash_ids").to_pylist() == [json.loads(f"[{h}]") for h in ids]
        assert got.equals(_read_json(data, mooncake._JSON_SCHEMA, "ignore"))
    assert scanned > 20 and refused > 20


def test_trace_formats_are_one_table():
    # aisim/traces TRACE_FORMATS: the format names, READERS, the block readers and the text
    # formats are all read from its rows.
    from aisim.traces import FORMATS, READERS, TRACE_FORMATS
    from aisim.traces.blockread import TEXT_FORMATS, block_format

    assert FORMATS == tuple(sorted(f.name for f in TRACE_FORMATS)) == tuple(sorted(READERS))
    assert TEXT_FORMATS == ("oracle", "mooncake", "mooncake-delta", "azure")
    for f in TRACE_FORMATS:
        assert READERS[f.name].__module__ == f.module
        fmt = block_format(f.name, {})
        assert (fmt is None) == (f.block_reader is None)
        if fmt is not None:
            assert type(fmt).__name__ == f.block_reader and fmt.name == f.name
