"""A table of text cells as rich prints it off a terminal, written without importing rich.

``aisim replay`` prints its summary with rich (:func:`aisim.cli_util.new_table`); off a terminal
rich's console prints no colour and never wraps a cell (:func:`aisim.cli_util.console`), so the
table is plain text: the title as it is, a box of light lines around the cells (one space of
padding either side), the caption wrapped at the table's width and centred.  Importing rich costs
a short replay a tenth of its start-up; :func:`render` writes the same bytes for the tables it
accepts (:func:`plain_ok`), and the caller prints with rich otherwise.
"""

from __future__ import annotations

import os
import re
import sys

# What rich would read as markup or an emoji code in a cell (rich.markup's tag, rich's ":name:"), or a
# character whose width on a terminal is not one column: those tables are printed by rich.
_RICH_SYNTAX = re.compile(r"\[|:\S*?:")
_ONE_COLUMN = re.compile(r"[ -~]*")


def off_terminal(stream) -> bool:
    """Whether rich's console on ``stream`` would be off a terminal and write UTF-8, with nothing in the
    environment that changes how it prints (``FORCE_COLOR``, ``TTY_COMPATIBLE``, a notebook)."""
    if any(k in os.environ for k in ("FORCE_COLOR", "TTY_COMPATIBLE", "JUPYTER_COLUMNS")):
        return False
    if not (getattr(stream, "encoding", None) or "").lower().replace("-", "").startswith("utf"):
        return False
    import builtins

    if hasattr(builtins, "get_ipython") or getattr(sys.stdin, "__module__", "").startswith("idlelib"):
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return isatty is not None and not isatty()
    except ValueError:
        return False


def plain_ok(title: str, rows, caption: str | None = None) -> bool:
    """Whether :func:`render` prints these cells as rich would: printable ASCII, no markup, every
    caption word narrower than the table."""
    texts = [title, *(c for r in rows for c in r), *([caption] if caption else [])]
    if not all(_ONE_COLUMN.fullmatch(t) for t in texts) or any(_RICH_SYNTAX.search(t) for t in texts[1:]):
        return False
    if caption:
        if "  " in caption or caption != caption.strip():
            return False
        width = _width(rows)
        if any(len(w) > width for w in caption.split(" ")):
            return False
    return True


def _width(rows) -> int:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return sum(widths) + 3 * len(widths) + 1


def render(title: str, rows, justify, caption: str | None = None) -> str:
    """The table's text, each line ended by a newline.

    Parameters
    ----------
    title : str
        Printed as it is on the first line.
    rows : list of tuple of str
        The cells, no header row; at least one row.
    justify : tuple of str
        ``"left"`` or ``"right"`` per column.
    caption : str, optional
        Wrapped at the table's width, each line centred.
    """
    widths = [max(len(r[i]) for r in rows) for i in range(len(justify))]
    out = [title]
    out.append("┌" + "┬".join("─" * (w + 2) for w in widths) + "┐")
    for r in rows:
        cells = (c.rjust(w) if j == "right" else c.ljust(w) for c, w, j in zip(r, widths, justify))
        out.append("│ " + " │ ".join(cells) + " │")
    out.append("└" + "┴".join("─" * (w + 2) for w in widths) + "┘")
    if caption:
        width = sum(widths) + 3 * len(widths) + 1
        for line in _wrap(caption, width):
            left = (width - len(line)) // 2
            out.append(" " * left + line + " " * (width - len(line) - left))
    return "\n".join(out) + "\n"


def _wrap(text: str, width: int) -> list:
    """Words (single spaces between) into lines of at most ``width`` characters, greedily."""
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return lines
