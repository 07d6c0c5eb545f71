"""What every ``aisim`` command shares: context settings, the failure exit,
``KEY=VALUE`` parsing, the output and trace-format options, the console and
tables, structured output, the number formats, phase progress and the
interrupt handling.

Commands live beside their features (``aisim/plan/cli.py``,
``aisim/sweep/cli.py``, ``aisim/query/cli.py``, ...) and import from here;
``aisim/cli.py`` is the group that registers them.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
import time

import click

# Shared by the group and every command: -h as well as --help, 100 columns of help text.
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

# Output formats every command that prints results offers (plus "toml" where TOML is an output).
OUTPUT_FORMATS = ("table", "csv", "json")


def fail(exc, code: int = 2):
    """Print ``error: EXC`` on stderr and exit with ``code`` (2: bad input; 130: interrupted; 143: terminated)."""
    click.echo(f"error: {exc}", err=True)
    sys.exit(code)


def one_blas_thread() -> None:
    """Load numpy's BLAS with one thread unless the environment says otherwise (``OPENBLAS_NUM_THREADS``).

    A replay multiplies no matrices, but OpenBLAS starts a thread per core as numpy loads, a
    visible part of a short replay's start-up on a busy machine.  Read once, when numpy first
    loads: nothing happens once it is loaded.
    """
    import os

    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


class Group(click.Group):
    """A command group whose commands stop on Ctrl-C with one line, ``error: interrupted``, and exit 130.

    Click's own handling prints ``Aborted!`` and exits 1; every aisim command
    writes its files all or nothing (:mod:`aisim.files`), so an interrupted
    command has written nothing and one line says so.  SIGTERM does the same
    with ``error: terminated`` and exit 143.  A file the system refuses
    (``OSError``) is one line naming it, exit 2, not a traceback.
    Sub-groups made with ``@group.group()`` are of this class too.
    """

    group_class = type  # sub-groups are Groups as well

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lazy = {}

    def add_lazy_command(self, name: str, module: str) -> None:
        """Register the command ``name`` of ``module`` (its attribute of that name), imported on first use.

        A command runs without importing the modules of the others; a help page that lists the
        commands imports them all.
        """
        self._lazy[name] = module

    def list_commands(self, ctx):
        return sorted({*self.commands, *self._lazy})

    def get_command(self, ctx, cmd_name):
        module = self._lazy.pop(cmd_name, None)
        if module is not None:
            import importlib

            self.add_command(getattr(importlib.import_module(module), cmd_name), cmd_name)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx):
        from aisim.files import install_signal_handlers, interrupt_status

        install_signal_handlers()
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            code, word = interrupt_status()
            # An interrupt that carries its own message (a landing's, saying how to land later) keeps it.
            fail(exc if str(exc) else word, code)
        except OSError as exc:
            fail(f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else exc)


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


# ---------------------------------------------------------------- options

def format_option(*extra: str, default: str = "table"):
    """The ``--format`` option of a command that prints results (parameter ``fmt``).

    Parameters
    ----------
    *extra : str
        Formats beyond table, csv and json (``"toml"`` where TOML is an output).
    default : str
        The format without the option.
    """
    choices = (*extra, *OUTPUT_FORMATS) if default in extra else (*OUTPUT_FORMATS, *extra)
    return click.option("--format", "fmt", type=click.Choice(choices), default=default, show_default=True,
                        help="Output: a table for people, csv or json for programs (json alone on stdout).")


class _LazyChoice(click.Choice):
    # The trace formats are the reader registry's keys; importing the readers
    # (Arrow) only when the option is used keeps ``aisim --help`` fast.
    def __init__(self, load):
        self._load = load
        self._names = None
        super().__init__((), case_sensitive=True)

    @property
    def choices(self):
        if self._names is None:
            self._names = tuple(self._load())
        return self._names

    @choices.setter
    def choices(self, value):
        pass


def trace_format_option(load_formats):
    """The ``--trace-format`` option of every command that reads a trace (parameter ``trace_format``).

    Parameters
    ----------
    load_formats : callable
        Returns the format names (the keys of ``aisim.traces.READERS``); called when the option is used.
    """
    return click.option("--trace-format", "trace_format", type=_LazyChoice(load_formats), default=None,
                        help="Trace format (default: guessed from the file name).")


def progress_option():
    """The ``--progress/--no-progress`` option of long single-process commands (parameter ``progress``)."""
    return click.option("--progress/--no-progress", "progress", default=None,
                        help="Phase progress on stderr (default: on a terminal only).")


def _check_out(kind):
    def check(ctx, param, value):
        import os

        if value is None:
            return value
        if kind == "dir" and value in ("-", "/dev/stdout", "/dev/stderr"):
            raise click.BadParameter(f"{value} is a stream; this output is a directory of files", ctx, param)
        if kind == "dir" and os.path.exists(value) and not os.path.isdir(value):
            raise click.BadParameter(f"{value} is a file, not a directory", ctx, param)
        if kind == "file" and os.path.isdir(value):
            raise click.BadParameter(f"{value} is a directory, not a file", ctx, param)
        parent = os.path.dirname(os.path.abspath(value))
        while parent and not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if parent and not os.path.isdir(parent):
            raise click.BadParameter(f"{parent} is a file, so {value} cannot be created", ctx, param)
        return value
    return check


def out_option(*names: str, kind: str = "file", **kwargs):
    """An output path option: ``kind`` ``"file"`` or ``"dir"``; missing parent directories are created
    when written (by :mod:`aisim.files`), a path of the other kind or below a file is a usage error."""
    return click.option(*names, type=click.Path(), callback=_check_out(kind), **kwargs)


# ---------------------------------------------------------------- human output

# Prose (descriptions, notes) wraps at this width off a terminal; tables of values do not wrap there.
PROSE_WIDTH = 100


def console(stderr: bool = False, prose: bool = False):
    """A rich console: colours and the terminal's width on a terminal; in logs and pipes no colour codes
    and no width limit, so tables print every value whole (``prose``: :data:`PROSE_WIDTH` columns, for
    text meant to be read, such as ``aisim query --list``)."""
    from rich.console import Console

    con = Console(stderr=stderr, highlight=False)
    if not con.is_terminal:
        con = Console(stderr=stderr, highlight=False, width=PROSE_WIDTH if prose else 100_000, no_color=True)
    return con


def new_table(*columns, **kwargs):
    """A rich table whose cells wrap (fold) when the terminal is narrow, never end in an ellipsis.

    Parameters
    ----------
    *columns : str or (str, dict)
        Column headers, or (header, keyword arguments of ``Table.add_column``).
    **kwargs
        Keyword arguments of ``rich.table.Table``.
    """
    from rich.table import Table
    from rich.text import Text

    if isinstance(kwargs.get("title"), str) and not console().is_terminal:
        # A title wraps at the table's width; off a terminal a long path or id in it stays on one
        # line instead (on a terminal it wraps, or the terminal's width would cut it).
        kwargs["title"] = Text(kwargs["title"], no_wrap=True, overflow="ignore")
    t = Table(**kwargs)
    for col in columns:
        name, kw = (col, {}) if isinstance(col, str) else col
        t.add_column(name, **{"overflow": "fold", **kw})
    return t


# A cell folds no narrower than this many characters (the whole cell when shorter: never a number).
MIN_CELL = 12
# The box's share of a table's width: a border before every column, one after the last, a space of
# padding either side of every cell.
def _box_width(n: int) -> int:
    return 3 * n + 1


def fit_table(columns, rows, *, keep=(), width: int | None = None, **kwargs):
    """A table of ``rows`` that leaves out empty columns and fits the terminal.

    A column whose every cell is ``-`` or empty is left out (unless named in ``keep``).  On a
    terminal (or given ``width``), columns wider than their share are narrowed, the widest first,
    but never below their widest cell (capped at :data:`MIN_CELL` characters) or their heading's
    longest word; when even that does not fit, the rightmost columns not in ``keep`` are left out and
    named in the returned note.  Off a terminal the table keeps its natural width.

    Parameters
    ----------
    columns : sequence of str or (str, dict)
        Headings, or (heading, keyword arguments of ``Table.add_column``).
    rows : sequence of sequence of str
        The cells, as text.
    keep : iterable of str
        Headings kept even when empty, and kept when columns are left out to fit.
    width : int, optional
        The width to fit (default: the terminal's; none off a terminal).
    **kwargs
        Keyword arguments of ``rich.table.Table`` (``title`` ...).

    Returns
    -------
    (rich.table.Table, str)
        The table and a note naming the columns left out to fit ("" when none).
    """
    from rich.cells import cell_len

    names = [c if isinstance(c, str) else c[0] for c in columns]
    opts = [{} if isinstance(c, str) else dict(c[1]) for c in columns]
    rows = [list(r) for r in rows]
    keep = set(keep)
    shown = [i for i, n in enumerate(names) if n in keep or not rows or any(r[i] not in ("", "-") for r in rows)]
    if width is None:
        con = console()
        width = con.width if con.is_terminal else None
    note = ""
    if width is not None:
        def longest_word(text: str) -> int:
            return max((cell_len(w) for w in str(text).split()), default=0)

        natural = {i: max([cell_len(names[i])] + [cell_len(line) for r in rows for line in str(r[i]).splitlines()])
                   for i in shown}
        cells = {i: max([cell_len(line) for r in rows for line in str(r[i]).splitlines()], default=0) for i in shown}
        low = {i: min(natural[i], max(longest_word(names[i]), min(MIN_CELL, cells[i]))) for i in shown}
        cut = []
        while sum(low[i] for i in shown) > width - _box_width(len(shown)):
            spare = [i for i in shown if names[i] not in keep]
            if not spare:
                break
            shown.remove(spare[-1])
            cut.append(names[spare[-1]])
        budget = width - _box_width(len(shown))
        if sum(natural[i] for i in shown) > budget:
            # The largest cap c with sum(max(low, min(natural, c))) within the budget: the widest narrow first.
            lo_c, hi_c = 1, max(natural.values())
            while lo_c < hi_c:
                mid = (lo_c + hi_c + 1) // 2
                if sum(max(low[i], min(natural[i], mid)) for i in shown) <= budget:
                    lo_c = mid
                else:
                    hi_c = mid - 1
            for i in shown:
                opts[i]["width"] = max(low[i], min(natural[i], lo_c))
        if cut:
            note = (f"left out to fit {width} columns: {', '.join(reversed(cut))} (a wider terminal, or "
                    "--format csv, shows them)")
    t = new_table(*[(names[i], opts[i]) for i in shown], **kwargs)
    for r in rows:
        t.add_row(*[r[i] for i in shown])
    return t, note


def flatten(d: dict, prefix: str = "") -> list:
    """``[(dotted.key, value), ...]`` of a nested dict (lists are kept as values)."""
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.extend(flatten(v, key + "."))
        else:
            out.append((key, v))
    return out


def echo_json(obj, sort_keys: bool = False) -> None:
    """``obj`` as JSON on stdout (NaN as null), alone."""
    def clean(v):
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v
    click.echo(json.dumps(clean(obj), indent=2, sort_keys=sort_keys, default=str))


def echo_csv(columns, rows) -> None:
    """RFC 4180 CSV on stdout: a header line, then ``rows``; None is an empty field."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow(["" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else v for v in r])
    click.echo(buf.getvalue(), nl=False)


# ---------------------------------------------------------------- numbers

def fmt_num(v, digits: int = 3) -> str:
    """A count with thousands separators (``1,234,567``), a float with ``digits`` decimals, ``-`` for None."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.{digits}f}" if isinstance(v, float) else f"{v:,}"


def fmt_pct(fraction, digits: int = 1) -> str:
    """A fraction as a percentage (``0.1234`` -> ``12.3%``), ``-`` for None."""
    if fraction is None or (isinstance(fraction, float) and math.isnan(fraction)):
        return "-"
    return f"{100 * fraction:.{digits}f}%"


_UNITS = ((1e-6, "µs"), (1e-3, "ms"), (1.0, "s"))


def fmt_seconds(v) -> str:
    """Seconds as people read latencies, 3 significant digits: ``456 µs``, ``12.3 ms``, ``1.23 s``,
    ``1,234 s``; ``0 s`` for zero, ``-`` for None."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if v == 0:
        return "0 s"
    for i, (scale, unit) in enumerate(_UNITS):
        x = abs(v) / scale
        if i < len(_UNITS) - 1 or x < 1000:
            x = float(f"{x:.3g}")  # rounded first: 999.7 ms is 1.00 s
        if x < 1000 or i == len(_UNITS) - 1:
            sign = "-" if v < 0 else ""
            text = f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"
            return f"{sign}{text} {unit}"
    raise AssertionError  # pragma: no cover


# ---------------------------------------------------------------- progress

class Phases:
    """Progress of a long single-process command, a phase at a time, on stderr.

    ``phase("reading trace")`` ends the previous phase (one line with its
    time) and starts the next; a terminal shows a spinner while a phase runs.
    Disabled, it prints nothing.  Use as a context manager.

    Parameters
    ----------
    enabled : bool or None
        True or False as asked (``--progress``/``--no-progress``); None: on when stderr is a terminal.
    """

    def __init__(self, enabled=None):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._con = None  # made at the first line: a disabled progress costs no console
        self.name = None
        self.status = None

    @property
    def con(self):
        if self._con is None:
            self._con = console(stderr=True)
        return self._con

    def __enter__(self):
        return self

    def __call__(self, name: str, note: str = "") -> None:
        """End the running phase (``note``: what it did, e.g. ``1,000 requests``) and start ``name``."""
        self.end(note)
        if not self.enabled:
            return
        self.name, self.t0 = name, time.perf_counter()
        if self.con.is_terminal:
            self.status = self.con.status(f"{name} ...")
            self.status.start()

    def quiet(self) -> None:
        """Stop showing anything (the running phase ends without a line)."""
        if self.status is not None:
            self.status.stop()
            self.status = None
        self.name, self.enabled = None, False

    def end(self, note: str = "") -> None:
        """End the running phase, if any, with one line."""
        if self.name is None:
            return
        if self.status is not None:
            self.status.stop()
            self.status = None
        self.con.print(f"{self.name}: {note + ', ' if note else ''}{fmt_seconds(time.perf_counter() - self.t0)}")
        self.name = None

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.end()
        elif self.status is not None:
            self.status.stop()
        return False
