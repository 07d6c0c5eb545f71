"""Tables that fit: empty columns left out, narrowed to the terminal without folding a cell below its width
(up to MIN_CELL characters), columns left out (and named) when even that is too wide; prose wrapped off a
terminal."""

from __future__ import annotations

import io

from click.testing import CliRunner
from rich.console import Console

from aisim.cli import main
from aisim.cli_util import MIN_CELL, PROSE_WIDTH, fit_table


def _render(table, width: int) -> list:
    con = Console(file=io.StringIO(), width=width, no_color=True, highlight=False)
    con.print(table)
    return con.file.getvalue().splitlines()


COLS = ["point", "phase", "candidate", "knobs", "rate_req_s", "verdict", "TTFT p99", "answer"]
ROWS = [["0", "bracket", "-", "-", "1.0000", "meets", "30.0 ms", ""],
        ["1", "bisect", "-", "-", "2.0000", "fails", "1,234 ms", "yes"]]


def test_empty_columns_are_left_out_unless_kept():
    t, note = fit_table(COLS, ROWS, width=None)
    assert [c.header for c in t.columns] == ["point", "phase", "rate_req_s", "verdict", "TTFT p99", "answer"]
    assert note == ""
    t, _ = fit_table(COLS, ROWS, keep=("knobs",), width=None)
    assert "knobs" in [c.header for c in t.columns]
    t, _ = fit_table(COLS, [], width=None)  # no rows: every heading stays
    assert len(t.columns) == len(COLS)


def test_a_narrow_terminal_narrows_the_widest_first_never_folding_a_short_cell():
    long = "x" * 40
    rows = [r + [long + " " + long] for r in ROWS]
    t, note = fit_table(COLS + ["reason"], rows, width=100)
    lines = _render(t, 100)
    assert note == "" and max(len(line) for line in lines) <= 100
    # Every short cell is whole on its line; only the long reason folds.
    assert any("1,234 ms" in line for line in lines) and any("30.0 ms" in line for line in lines)
    widths = {c.header: c.width for c in t.columns}
    assert widths["point"] == 5 and widths["TTFT p99"] == 8 and widths["reason"] >= MIN_CELL


def test_columns_that_cannot_fit_are_left_out_and_named():
    t, note = fit_table(COLS, ROWS, keep=("point", "answer"), width=40)
    shown = [c.header for c in t.columns]
    assert shown[0] == "point" and shown[-1] == "answer"
    assert note.startswith("left out to fit 40 columns: ") and "TTFT p99" in note
    assert max(len(line) for line in _render(t, 40)) <= 40


def test_capacity_table_leaves_out_a_rate_search_empty_columns(tmp_path):
    from test_capacity import _spec

    path = _spec(tmp_path, "[rate]\nby = 'rate_scale'\nrel_tol = 0.05")
    r = CliRunner().invoke(main, ["capacity", path])
    assert r.exit_code == 0, r.output
    head = next(line for line in r.stdout.splitlines() if "point" in line)
    assert "candidate" not in head and "knobs" not in head and "per M tokens" not in head
    assert "rate req/s" in head and "answer" in head


def test_query_list_wraps_its_descriptions_when_piped():
    r = CliRunner().invoke(main, ["query", "--list"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= PROSE_WIDTH
    assert any(line.startswith("│ slo ") for line in lines)
