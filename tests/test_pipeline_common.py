"""Builders shared by the pipeline and SQL tests (this module holds no tests).

Specs are built with :func:`aisim.pipeline.spec_from_dict` against the
repository's bundled samples (``examples/``), with the database in a
temporary directory.
"""

import os

import duckdb
import pyarrow as pa

from aisim.pipeline import spec_from_dict
from aisim.pipeline.landing import TABLES
from aisim.pipeline.run import BOOKKEEPING
from aisim.traces import read_oracle_trace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")
PIPELINES = os.path.join(REPO, "pipelines")
DEMO = os.path.join(PIPELINES, "demo.toml")
TIMED = os.path.join(REPO, "tests", "data", "oracle", "scenarios", "timed")


def demo_dict(database, **extra):
    """The demo spec as a dictionary (paths absolute), landing in ``database``."""
    raw = {
        "name": "demo",
        "database": str(database),
        "sources": [
            {"name": "llama-chat", "paths": [os.path.join(EXAMPLES, "trace.jsonl")], "format": "oracle",
             "model": "llama-3.1-8b"},
            {"name": "qwen-chat", "paths": [os.path.join(EXAMPLES, "qwen3-next-trace.jsonl")], "format": "oracle",
             "model": "qwen3-next-80b"},
        ],
        "deployments": [
            {"model": "llama-3.1-8b", "engines": {"base": os.path.join(EXAMPLES, "engine.json"),
                                                  "nocache": os.path.join(EXAMPLES, "engine-nocache.json")}},
            {"model": "qwen3-next-80b", "engines": {"align": os.path.join(EXAMPLES, "qwen3-next-80b.json")}},
        ],
    }
    raw.update(extra)
    return raw


def demo_spec(database, **extra):
    return spec_from_dict(demo_dict(database, **extra), source="test-spec.toml", base_dir=PIPELINES)


def dump(db, bookkeeping=False) -> dict:
    """Every landed table's rows in physical order (the order a plain SELECT returns).

    Bookkeeping columns (wall-clock times, scheduler, workers) are left out unless asked for.
    """
    con = duckdb.connect(str(db), read_only=True) if not isinstance(db, duckdb.DuckDBPyConnection) else db
    try:
        out = {}
        for t in TABLES:
            skip = () if bookkeeping else BOOKKEEPING.get(t, ())
            cols = [r[0] for r in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                "ORDER BY ordinal_position", [t]).fetchall() if r[0] not in skip]
            out[t] = con.execute(f"SELECT {', '.join(cols)} FROM {t}").fetchall()
        return out
    finally:
        if not isinstance(db, duckdb.DuckDBPyConnection):
            con.close()


def multi_model_reader(path, **options):
    """A test trace format: an oracle trace whose ``model`` column is filled in.

    Rows alternate between ``src-a`` and ``src-b``; every tenth row has no model.
    """
    t = read_oracle_trace(path, **options)
    models = [None if i % 10 == 9 else ("src-a" if i % 2 == 0 else "src-b") for i in range(t.num_rows)]
    return t.set_column(t.schema.get_field_index("model"), "model", pa.array(models, pa.string()))
