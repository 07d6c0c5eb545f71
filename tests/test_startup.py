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

    paths = []
    for name, cmd in sorted(main.commands.items()):
        paths.append([name])
        if isinstance(cmd, click.Group):
            paths += [[name, sub] for sub in sorted(cmd.commands)]
    return paths


def test_aisim_help_imports_no_heavy_library():
    assert _heavy_after("--help") == []


def test_every_command_is_covered():
    names = {p[0] for p in _command_paths()}
    assert {"replay", "pipeline", "query", "report", "sweep", "plan", "config", "trace"} <= names


@pytest.mark.parametrize("path", _command_paths(), ids=" ".join)
def test_command_help_imports_no_heavy_library(path):
    assert _heavy_after(*path, "--help") == []
