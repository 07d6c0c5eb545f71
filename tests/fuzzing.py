"""Fuzz targets: every trace reader, configuration loader and spec parser, with the inputs Hypothesis draws.

Each target reads what a strategy draws (raw bytes, or a value of a plausible but wrong shape:
a valid input with keys replaced, removed or added) and must either return a valid object or
raise :class:`aisim.errors.InputError` whose message names where (the file, or the spec's source).
Anything else is a bug.  ``tests/test_fuzz_readers.py`` runs a few examples of each in CI;
``benchmarks/fuzz_readers.py`` runs many.  (This module holds no tests.)
"""

from __future__ import annotations

import copy
import io
import json
import os

import pyarrow as pa
from hypothesis import strategies as st

from aisim.config.keys import ENGINE_KEYS as ENGINE_KEY_CATALOGUE
from aisim.errors import InputError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")
SOURCE = "fuzz-source.toml"  # the source name dict-level parsers are given: their messages must name it

# ---------------------------------------------------------------- values

_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
# Numbers where the bugs live: edges of 32 and 64 bits, zero, negatives, non-finite floats.
_INTS = st.one_of(st.integers(-3, 70000), st.sampled_from([0, -1, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1,
                                                              2**63, -(2**63), 2**64, 10**30]))
_FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 0.5, 1e308, 5e-324]))
SCALARS = st.one_of(st.none(), st.booleans(), _INTS, _FLOATS, _TEXT)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(_TEXT, inner, max_size=4)), max_leaves=8)


def _paths(obj, prefix=()):
    """Every place in a nested value: tuples of keys and indices."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated(draw, base, keys=()):
    """``base`` (a valid value) with one to three places replaced, removed, or given a new key."""
    obj = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        places = [p for p in _paths(obj) if p]
        if not places:
            break
        place = draw(st.sampled_from(places))
        parent = obj
        for k in place[:-1]:
            parent = parent[k]
        op = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
        if op == "replace":
            parent[place[-1]] = draw(VALUES)
        elif op == "remove" and isinstance(parent, dict):
            del parent[place[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(list(keys)) if keys else _TEXT)] = draw(VALUES)
    return obj


def _json_bytes(obj) -> bytes:
    return json.dumps(obj, allow_nan=True).encode()


# ---------------------------------------------------------------- the targets


class Target:
    """One reader: ``strategy`` draws its input, ``read(value, workdir)`` reads it (raising as the reader does)."""

    def __init__(self, name, strategy, read):
        self.name, self.strategy, self.read = name, strategy, read

    def check(self, value, workdir) -> None:
        """Read ``value``: a valid result, or an InputError naming where; anything else is raised."""
        try:
            self.read(value, workdir)
        except InputError as exc:
            msg = str(exc)
            if workdir not in msg and SOURCE not in msg:
                raise AssertionError(f"{self.name}: the error names no file: {msg!r}") from None


def _file(workdir, name, data: bytes) -> str:
    path = os.path.join(workdir, name)
    with open(path, "wb") as fh:
        fh.write(data)
    return path


def _lines(objs) -> bytes:
    return b"".join(_json_bytes(o) + b"\n" if not isinstance(o, bytes) else o + b"\n" for o in objs)


def _rows(keys, valid):
    """JSON lines: rows near ``valid`` (keys replaced, removed or added), or raw bytes."""
    row = st.one_of(mutated(valid, keys), st.dictionaries(st.sampled_from(keys), VALUES, max_size=len(keys)), VALUES)
    return st.one_of(st.binary(max_size=200), st.lists(row, min_size=1, max_size=5).map(_lines))


def _trace_reader(fmt, name):
    def read(data, workdir):
        from aisim.traces import read_trace

        table = read_trace(_file(workdir, name, data), fmt)
        assert isinstance(table, pa.Table)
    return read


_ORACLE_ROW = {"request_id": "r0", "prompt_len": 100, "max_tokens": 10, "arrival_step": 0, "prefix_group": 1,
               "prefix_len": 16}
_ORACLE_KEYS = ["request_id", "prompt_len", "max_tokens", "arrival_step", "arrival_time", "prefix_group",
                "prefix_len", "priority", "accept"]
_MOONCAKE_ROW = {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [0, 1]}
_MOONCAKE_KEYS = ["timestamp", "input_length", "output_length", "hash_ids", "request_id", "session_id", "model"]
_AGENTIC = {"id": "c0", "models": ["m"], "block_size": 64, "hash_id_scope": "local", "tool_tokens": 10,
            "system_tokens": 5, "requests": [
                {"t": 0.0, "type": "n", "model": "m", "in": 130, "out": 10, "hash_ids": [1, 2]},
                {"t": 1.0, "type": "subagent", "agent_id": "a1", "models": ["m"], "tool_tokens": 1,
                 "system_tokens": 1, "requests": [{"t": 0.0, "in": 64, "out": 1, "hash_ids": [3]}]}]}
_AGENTIC_KEYS = ["id", "models", "block_size", "hash_id_scope", "tool_tokens", "system_tokens", "requests", "t",
                 "type", "model", "in", "out", "hash_ids", "agent_id"]

_CELL = st.one_of(st.text(alphabet="0123456789-:.TZ+ ,\"e", max_size=30), _TEXT,
                  st.sampled_from(["2023-11-16 18:15:46.6805900", "2023-11-16T18:15:46Z", "4808", "10", "-1", "nan"]))


@st.composite
def _azure_csv(draw) -> bytes:
    header = draw(st.one_of(st.just(["TIMESTAMP", "ContextTokens", "GeneratedTokens"]),
                            st.permutations(["TIMESTAMP", "ContextTokens", "GeneratedTokens"]),
                            st.lists(st.sampled_from(["TIMESTAMP", "ContextTokens", "GeneratedTokens", "x", ""]),
                                     max_size=4)))
    rows = draw(st.lists(st.lists(_CELL, min_size=0, max_size=4), max_size=5))
    buf = io.StringIO()
    buf.write(",".join(header) + "\n")
    for r in rows:
        buf.write(",".join(r) + "\n")
    return buf.getvalue().encode("utf-8", "surrogatepass")


_ARROW_TYPES = [pa.int64(), pa.int32(), pa.float64(), pa.string(), pa.bool_(), pa.list_(pa.int64()), pa.null()]


@st.composite
def _parquet(draw) -> bytes:
    import pyarrow.parquet as pq

    from aisim.traces.schema import TRACE_SCHEMA

    names = draw(st.lists(st.sampled_from(TRACE_SCHEMA.names + ["extra"]), unique=True, max_size=8))
    n = draw(st.integers(0, 4))
    cols = {}
    for name in names:
        if draw(st.booleans()) and name in TRACE_SCHEMA.names and _handled(TRACE_SCHEMA.field(name).type):
            typ = TRACE_SCHEMA.field(name).type
        else:
            typ = draw(st.sampled_from(_ARROW_TYPES))
        cols[name] = pa.array([_value_of(draw, typ) for _ in range(n)], type=typ)
    table = pa.table(cols) if cols else pa.table({"x": pa.array([], pa.int64())})
    if draw(st.booleans()):  # the schema metadata aisim writes, or a wrong one
        meta = draw(st.one_of(st.just(TRACE_SCHEMA.metadata or {}),
                              st.dictionaries(st.sampled_from([b"clock", b"aisim", b"format", b"unit_tokens"]),
                                              st.binary(max_size=10), max_size=3)))
        table = table.replace_schema_metadata(meta)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def _handled(typ) -> bool:
    return (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_string(typ)
            or pa.types.is_boolean(typ) or pa.types.is_null(typ)
            or (pa.types.is_list(typ) and typ.value_type == pa.int64()))


def _value_of(draw, typ):
    if draw(st.integers(0, 5)) == 0:
        return None
    if pa.types.is_integer(typ):
        bits = typ.bit_width
        if pa.types.is_unsigned_integer(typ):
            return draw(st.integers(0, 2 ** bits - 1) | st.sampled_from([0, 1, 16]))
        return draw(st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) | st.sampled_from([0, 1, 16, -1]))
    if pa.types.is_floating(typ):
        return draw(_FLOATS)
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return draw(_TEXT)
    if pa.types.is_boolean(typ):
        return draw(st.booleans())
    if pa.types.is_list(typ):
        return draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4))
    return None


# Configurations and specs: valid values to mutate.
with open(os.path.join(EXAMPLES, "engine.json"), encoding="utf-8") as _fh:
    ENGINE = json.load(_fh)
# Every key of the catalogue (so a new key is fuzzed too) and a few that vLLM has and aisim refuses.
_ENGINE_KEYS = sorted(set(ENGINE) | {k.name for k in ENGINE_KEY_CATALOGUE}
                      | {"speculative_config", "max_num_partial_prefills", "scheduling_policy"})
_DEPLOYMENT = {"deployment": {"replicas": 2, "router": {"kind": "kv_aware", "overlap_weight": 1.0,
                                                        "view_delay_s": 0.0}}}
_PROBE = {"vllm_version": "0.31.0", "max_model_len": 4096, "num_gpu_blocks": 1000,
          "kv_cache_groups": [{"type": "full", "block_size": 16}]}
ENGINE_PATH = os.path.join(EXAMPLES, "engine.json")
TRACE_PATH = os.path.join(EXAMPLES, "trace.jsonl")
_PIPELINE = {"name": "p", "database": "p.duckdb",
             "sources": [{"name": "s", "paths": [TRACE_PATH], "format": "oracle", "model": "m"}],
             "deployments": [{"model": "m", "engines": {"e": ENGINE_PATH,
                                                        "r": {"engine": ENGINE_PATH,
                                                              "deployment": {"replicas": 2}}}}],
             "window": {"start_s": 0.0}, "replay": {"closed_loop": False},
             "landing": {"keep_parquet": False}}
_SWEEP = {"name": "s", "database": "s.duckdb", "model": "m", "base": ENGINE_PATH, "best": "best.toml",
          "trace": {"paths": [TRACE_PATH], "format": "oracle"},
          "grid": {"max_num_seqs": [1, 8], "num_gpu_blocks": [1024]}, "load": {"rate_scale": [1.0]},
          "slo": {"ttft_s": 0.5}}
_CAPACITY = {"name": "c", "database": "c.duckdb", "engine": ENGINE_PATH,
             "trace": {"path": TRACE_PATH, "format": "oracle"},
             "slo": {"ttft_s": 0.5, "attainment": 0.9}, "rate": {"by": "rate_scale", "max_points": 4}}
_SPEC_KEYS = ["name", "database", "sources", "deployments", "window", "replay", "landing", "capacity", "model",
              "base", "best", "trace", "grid", "slo", "load", "engine", "rate", "fleet", "deployment", "paths",
              "format", "options", "engines", "replicas", "router", "by", "max_points"]


def _json_file(name, loader):
    def read(obj, workdir):
        data = obj if isinstance(obj, bytes) else _json_bytes(obj)
        loader(_file(workdir, name, data))
    return read


def _toml_file(name, loader):
    def read(data, workdir):
        loader(_file(workdir, name, data))
    return read


def _from_dict(parse):
    def read(obj, workdir):
        parse(obj, source=SOURCE, base_dir=workdir)
    return read


def _deployment_from(obj, workdir):
    from aisim.config.deployment import parse_deployment

    parse_deployment(obj.get("deployment"), source=SOURCE)


_TOML_TEXT = st.one_of(st.binary(max_size=200),
                       st.lists(st.tuples(st.sampled_from(_SPEC_KEYS), st.sampled_from(
                           ['"x"', "1", "-1", "nan", "inf", "[]", "[1, 2]", "{}", '{ a = 1 }', "true", '"../x"'])),
                           max_size=6).map(lambda kv: "".join(f"{k} = {v}\n" for k, v in kv).encode()))


def targets() -> list:
    """Every fuzz target, by name."""
    from aisim.capacity.spec import capacity_from_dict, load_capacity
    from aisim.config.deployment import load_deployment_config
    from aisim.config.engine import engine_config_from_dict, load_engine_config
    from aisim.config.hfconfig import load_hf_config
    from aisim.pipeline.spec import load_spec, spec_from_dict
    from aisim.plan import load_probe
    from aisim.sweep import load_sweep
    from aisim.sweep.runner import sweep_from_dict

    with open(os.path.join(REPO, "tests", "data", "hf", "llama-3.1-8b.json"), encoding="utf-8") as fh:
        hf = json.load(fh)
    return [
        Target("oracle", _rows(_ORACLE_KEYS, _ORACLE_ROW), _trace_reader("oracle", "t.jsonl")),
        Target("mooncake", _rows(_MOONCAKE_KEYS, _MOONCAKE_ROW), _trace_reader("mooncake", "t.jsonl")),
        Target("mooncake-delta", _rows(_MOONCAKE_KEYS, _MOONCAKE_ROW), _trace_reader("mooncake-delta", "t.jsonl")),
        Target("azure", st.one_of(st.binary(max_size=200), _azure_csv()), _trace_reader("azure", "t.csv")),
        Target("agentic", st.one_of(st.binary(max_size=200), mutated(_AGENTIC, _AGENTIC_KEYS).map(_json_bytes),
                                    VALUES.map(_json_bytes)), _trace_reader("agentic", "t.json")),
        Target("parquet", st.one_of(st.binary(max_size=200), _parquet()), _trace_reader("parquet", "t.parquet")),
        Target("engine", st.one_of(st.binary(max_size=200), mutated(ENGINE, _ENGINE_KEYS), VALUES),
               _json_file("engine.json", load_engine_config)),
        Target("engine-dict", mutated(ENGINE, _ENGINE_KEYS),
               lambda obj, workdir: engine_config_from_dict(obj, source=SOURCE)),
        Target("engine-toml", _TOML_TEXT, _toml_file("engine.toml", load_engine_config)),
        Target("deployment", st.one_of(st.binary(max_size=200), _TOML_TEXT), _toml_file("d.toml",
                                                                                         load_deployment_config)),
        Target("deployment-dict", mutated(_DEPLOYMENT, ["replicas", "router", "kind", "prefill", "decode",
                                                        "overlap_weight", "seed", "link"]),
               _deployment_from),
        Target("probe", st.one_of(st.binary(max_size=200), mutated(_PROBE, list(_PROBE) + ["model", "block_size"]),
                                  VALUES), _json_file("probe.json", load_probe)),
        Target("hf-config", st.one_of(st.binary(max_size=200), mutated(hf)), _json_file("config.json",
                                                                                       load_hf_config)),
        Target("pipeline-spec", _TOML_TEXT, _toml_file("p.toml", load_spec)),
        Target("pipeline-dict", mutated(_PIPELINE, _SPEC_KEYS), _from_dict(spec_from_dict)),
        Target("sweep-spec", _TOML_TEXT, _toml_file("s.toml", load_sweep)),
        Target("sweep-dict", mutated(_SWEEP, _SPEC_KEYS), _from_dict(sweep_from_dict)),
        Target("capacity-spec", _TOML_TEXT, _toml_file("c.toml", load_capacity)),
        Target("capacity-dict", mutated(_CAPACITY, _SPEC_KEYS), _from_dict(capacity_from_dict)),
    ]
