"""``aisim --help`` and every command's help start without the heavy libraries.

Dask, DuckDB, pyarrow, numpy and rich are imported inside the commands that use them; a module
that imports one of them at module level on the start-up path fails this test.
"""

import json
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
