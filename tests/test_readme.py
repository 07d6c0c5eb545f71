"""The README is a short guide whose commands run as written.

Every ``aisim`` command of a fenced ``bash`` block (a line starting with ``aisim``, or the
``aisim`` part of ``pip install ... && aisim ...``; a trailing backslash continues a line) runs,
in order, from a copy of the files the README names, and must exit 0.  Pipelines and sweeps run
on the in-process Dask scheduler so the test stays short.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil

from click.testing import CliRunner

from aisim.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
MAX_LINES = 260
MAX_WIDTH = 100


def _readme() -> str:
    with open(README, encoding="utf-8") as fh:
        return fh.read()


def readme_commands(text: str) -> list[str]:
    """The ``aisim`` commands of the fenced ``bash`` blocks of ``text``, continuation lines joined."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.M | re.S):
        joined = re.sub(r"\s*\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            if "&& aisim " in line:
                line = line[line.index("&& aisim ") + 3:]
            if line.startswith("aisim "):
                commands.append(line)
    return commands


def test_readme_is_a_short_guide():
    lines = _readme().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES})"
    wide = [i + 1 for i, line in enumerate(lines) if len(line) > MAX_WIDTH]
    assert wide == [], f"README.md lines over {MAX_WIDTH} characters: {wide}"


def test_readme_links_point_at_files():
    text = _readme()
    targets = {t for t, _ in re.findall(r"\]\(([^)#:]+)(#[^)]*)?\)", text)}
    assert {"docs/configuration.md", "docs/capacity.md", "docs/replay.md"} <= targets
    missing = [t for t in sorted(targets) if not os.path.exists(os.path.join(ROOT, t))]
    assert missing == []


def test_readme_commands_are_parsed():
    # The quick start's pipeline first (from `pip install . && aisim ...`), a continued line
    # joined whole, and no `pip` or `pytest` command.
    commands = readme_commands(_readme())
    assert commands[0] == "aisim pipeline run pipelines/demo.toml"
    assert ("aisim capacity --model llama-3.1-8b --gpu H100 --trace examples/trace.jsonl "
            "--slo ttft_p99_s=0.5 --rate") in commands
    assert not [c for c in commands if "pip " in c or "pytest" in c]
    assert len(commands) >= 12


def test_readme_commands_run_as_written(tmp_path, monkeypatch):
    for name in ("examples", "pipelines"):
        shutil.copytree(os.path.join(ROOT, name), tmp_path / name,
                        ignore=shutil.ignore_patterns("*.duckdb", "*-best*.toml", "__pycache__"))
    shutil.copytree(os.path.join(ROOT, "tests", "data", "benchserve"), tmp_path / "tests" / "data" / "benchserve")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for command in readme_commands(_readme()):
        args = shlex.split(command)[1:]
        if args[:2] == ["pipeline", "run"] or args[:1] == ["sweep"]:
            args += ["--scheduler", "sync"]
        result = runner.invoke(main, args)
        assert result.exit_code == 0, f"{command}\n{result.output}\n{result.exception!r}"
    # What the recipes say they leave behind.
    for path in ("pipelines/demo.duckdb", "report.html", "capacity.duckdb", "fleet.duckdb",
                 "runs/on/summary.json", "runs/off/summary.json", "ab.html", "calibrated.toml"):
        assert (tmp_path / path).exists(), path
