"""``aisim --help`` and every command's help start without the heavy libraries.

Dask, DuckDB, pyarrow, numpy and rich are imported inside the commands that use them; a module
that imports one of them at module level on the start-up path fails this test.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

HEAVY = ("dask", "distributed", "duckdb", "pyarrow", "numpy", "rich", "yaml", "tomli_w")

_PROBE = """
import json, sys
from aisim.cli import main
try:
    main(sys.argv[1:], prog_name="aisim")
except SystemExit:
    pass
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(%r))))
""" % (HEAVY,)


def _heavy_after(*args):
    res = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def _command_paths():
    import click

    from aisim.cli import main

    ctx = click.Context(main)
    paths = []
    for name in main.list_commands(ctx):
        cmd = main.get_command(ctx, name)
        paths.append([name])
        if isinstance(cmd, click.Group):
            paths += [[name, sub] for sub in cmd.list_commands(click.Context(cmd))]
    return paths


def test_aisim_help_imports_no_heavy_library():
    assert _heavy_after("--help") == []


def test_every_command_is_covered():
    names = {p[0] for p in _command_paths()}
    assert {"replay", "pipeline", "query", "report", "sweep", "plan", "config", "trace"} <= names


@pytest.mark.parametrize("path", _command_paths(), ids=" ".join)
def test_command_help_imports_no_heavy_library(path):
    assert _heavy_after(*path, "--help") == []


_REPLAY_PROBE = """
import json, sys
from aisim.cli import main
try:
    main(sys.argv[1:], prog_name="aisim")
except SystemExit as exc:
    assert not exc.code, exc.code
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in %r or m in %r)))
"""


def test_a_short_replay_imports_only_what_it_uses(tmp_path):
    # A one-request replay's start-up is most of its wall time: no Dask or DuckDB, and neither
    # numpy.ma (np.percentile's, aisim.stats replaces it) nor pyarrow.compute.
    trace = tmp_path / "one.jsonl"
    trace.write_text('{"request_id": "r0", "arrival_step": 0, "prompt_len": 40, "max_tokens": 3}\n')
    engine = tmp_path / "engine.json"
    engine.write_text('{"num_gpu_blocks": 64, "max_model_len": 1024}')
    unwanted = ("dask", "distributed", "duckdb")
    probe = _REPLAY_PROBE % (unwanted, ("numpy.ma", "pyarrow.compute"))
    for fmt in ("table", "json"):
        res = subprocess.run([sys.executable, "-c", probe, "replay", "--engine", str(engine), "--trace", str(trace),
                              "--format", fmt], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout.strip().splitlines()[-1]) == []


_OTHER_COMMANDS = ("aisim.calibrate", "aisim.capacity", "aisim.compare", "aisim.config.cli", "aisim.pipeline",
                   "aisim.plan", "aisim.query", "aisim.report", "aisim.sweep", "aisim.traces.cli")


def test_importing_the_cli_loads_no_command_module():
    # The group names its commands by module; a command's module loads when it runs or a help page lists it.
    code = ("import json, sys; import aisim.cli; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(%r))))" % (_OTHER_COMMANDS,))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) == []


MOONCAKE = pathlib.Path(__file__).parent / "data" / "traces" / "mooncake" / "synthetic_trace.jsonl"


def test_a_mooncake_replay_imports_only_what_it_uses(tmp_path):
    # 1,000 Mooncake requests (the reader's Arrow path), one prompt rejected as too long: no
    # pyarrow.compute, no numpy.ma, no other command's module; numpy's BLAS loads with one thread.
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text("".join(MOONCAKE.read_text().splitlines(keepends=True)[:1000]))
    engine = tmp_path / "engine.json"
    engine.write_text('{"num_gpu_blocks": 16384, "max_model_len": 131072, "max_num_seqs": 128}')
    probe = _REPLAY_PROBE.replace("print(json.dumps(", "import os; print(os.environ.get('OPENBLAS_NUM_THREADS'))\n"
                                  "print(json.dumps(", 1) % (("dask", "distributed", "duckdb"),
                                                            ("numpy.ma", "pyarrow.compute", *_OTHER_COMMANDS))
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    res = subprocess.run([sys.executable, "-c", probe, "replay", "--engine", str(engine), "--trace", str(trace),
                          "--reject-too-long", "--format", "json"], capture_output=True, text=True, timeout=120,
                         env=env)
    assert res.returncode == 0, res.stderr
    *_, blas, modules = res.stdout.strip().splitlines()
    assert json.loads(modules) == []
    assert blas == "1"
    record = json.loads("\n".join(res.stdout.strip().splitlines()[:-2]))
    assert (record["requests"], record["rejected"], record["finished"]) == (1000, 1, 999)


def test_rows_kept_as_filter_keeps_them():
    # replay's _kept drops rejected rows without pyarrow.compute: the same table as Table.filter.
    import numpy as np
    import pyarrow as pa

    from aisim.replay import _kept

    rng = np.random.default_rng(7)
    table = pa.table({"a": np.arange(50), "b": [str(i) for i in range(50)]},
                     metadata={b"clock": b"time"})
    table = pa.concat_tables([table.slice(0, 20), table.slice(20)])  # two chunks
    for keep in (np.ones(50, bool), np.zeros(50, bool), rng.random(50) < 0.5, rng.random(50) < 0.9):
        got = _kept(table, keep)
        assert got.equals(table.filter(pa.array(keep)))
        assert got.schema.metadata == table.schema.metadata
        assert all(c.num_chunks == 1 for c in got.columns)
