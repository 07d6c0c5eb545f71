"""What every ``aisim`` command shares: context settings, the failure exit,
``KEY=VALUE`` parsing, the console and the number formats.

Commands live beside their features (``aisim/plan/cli.py``,
``aisim/sweep/cli.py``, ``aisim/query/cli.py``, ...) and import from here;
``aisim/cli.py`` is the group that registers them.
"""

from __future__ import annotations

import sys

import click

# Shared by the group and every command: -h as well as --help, 100 columns of help text.
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def fail(exc, code: int = 2):
    """Print ``error: EXC`` on stderr and exit with ``code`` (2: bad input; 130: interrupted)."""
    click.echo(f"error: {exc}", err=True)
    sys.exit(code)


def parse_pairs(pairs, option: str) -> dict:
    """``["key=value", ...]`` as ``{key: "value"}``; a malformed or repeated key is a ``click.BadParameter``.

    Parameters
    ----------
    pairs : iterable of str
        The values of a repeatable ``KEY=VALUE`` option.
    option : str
        The option's name, for messages (e.g. ``"--param"``).
    """
    out = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint=option)
        if key in out:
            raise click.BadParameter(f"{key} is given twice", param_hint=option)
        out[key] = value
    return out


def guess_value(text: str):
    """A command-line value as the type it looks like: integer, number, boolean, null, else the string."""
    low = text.strip().lower()
    if low in ("null", "none"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def console(stderr: bool = False, width: int = 120):
    """A rich console: colours on a terminal; in logs and pipes wide enough for a table, no colour codes."""
    from rich.console import Console

    con = Console(stderr=stderr, highlight=False)
    if not con.is_terminal:
        con = Console(stderr=stderr, highlight=False, width=max(con.width, width), no_color=True)
    return con


def fmt_num(v, digits: int = 3) -> str:
    """A count with thousands separators, a float with ``digits`` decimals, ``-`` for None."""
    if v is None:
        return "-"
    return f"{v:,.{digits}f}" if isinstance(v, float) else f"{v:,}"


def fmt_seconds(v) -> str:
    """Seconds as people read latencies: ``12.3 ms`` below a second, ``1.234 s`` above, ``-`` for None."""
    if v is None:
        return "-"
    return f"{v * 1000:.1f} ms" if v < 1 else f"{v:.3f} s"
