"""aisim.plaintable: the replay summary's table off a terminal, the same bytes as rich prints."""

import io
import random

import pytest

from aisim.plaintable import off_terminal, plain_ok, render


def _rich(title, rows, caption):
    from rich.console import Console

    from aisim.cli_util import new_table

    t = new_table("what", ("value", {"justify": "right"}), title=title, show_header=False, caption=caption)
    t.columns[0].style = "bold"
    for r in rows:
        t.add_row(*r)
    buf = io.StringIO()
    Console(file=buf, highlight=False, width=100_000, no_color=True).print(t)
    return buf.getvalue()


def test_a_small_table_by_hand():
    # Title as it is; a box of light lines, one space either side of a cell; the caption centred
    # at the table's width (11), wrapped between words.
    got = render("short", [("a", "1"), ("bb", "22")], ("left", "right"), "cap tion here")
    assert got == ("short\n"
                   "┌────┬────┐\n"
                   "│ a  │  1 │\n"
                   "│ bb │ 22 │\n"
                   "└────┴────┘\n"
                   " cap tion  \n"
                   "   here    \n")


def test_the_summary_as_rich_prints_it():
    rows = [("requests finished", "999 / 1,000"), ("engine steps", "27,483 (2 empty)"),
            ("TTFT mean / median / P99", "27.5 ms / 19.0 ms / 80.0 ms"), ("preemptions", "0")]
    title = "aisim replay of /tmp/t.jsonl (vLLM 0.34.0 rules)"
    for caption in (None, "ITL is the gap between two streamed outputs of one request, over every request's gaps."):
        assert plain_ok(title, rows, caption)
        assert render(title, rows, ("left", "right"), caption) == _rich(title, rows, caption)


@pytest.mark.parametrize("seed", range(40))
def test_random_tables_as_rich_prints_them(seed):
    rng = random.Random(seed)
    alphabet = "abcdefghij XYZ0123456789/.,%()-"

    def text(lo, hi):
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi))).strip() or "x"

    rows = [(text(1, 30), text(0, 40)) for _ in range(rng.randint(1, 8))]
    title = text(1, 120)
    caption = " ".join(text(1, 12).replace(" ", "") for _ in range(rng.randint(1, 40))) if seed % 3 else None
    if plain_ok(title, rows, caption):
        assert render(title, rows, ("left", "right"), caption) == _rich(title, rows, caption)


def test_what_rich_would_read_otherwise_is_left_to_rich():
    rows = [("a", "1")]
    assert not plain_ok("t", [("[bold]a", "1")], None)  # markup
    assert not plain_ok("t", [("a", ":smile:")], None)  # an emoji code
    assert not plain_ok("t", [("é", "1")], None)  # not one column per character for certain
    assert not plain_ok("t", rows, "averyveryverylongword")  # a caption word wider than the table: folded
    assert not plain_ok("t", rows, "two  spaces")
    assert plain_ok("a [title] as it is", rows, "ok")  # the title is text, not markup


def test_off_terminal(monkeypatch):
    class Stream(io.StringIO):
        encoding = "utf-8"

        def __init__(self, tty):
            super().__init__()
            self.tty = tty

        def isatty(self):
            return self.tty

    for k in ("FORCE_COLOR", "TTY_COMPATIBLE", "JUPYTER_COLUMNS"):
        monkeypatch.delenv(k, raising=False)
    assert off_terminal(Stream(False))
    assert not off_terminal(Stream(True))
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert not off_terminal(Stream(False))
