"""``aisim trace``: generate, inspect and convert request traces."""

from __future__ import annotations

import inspect as pyinspect
import json

import click

from aisim.cli_util import fail, fmt_num, guess_value, parse_pairs


def _parse_options(pairs, skip_bad_rows) -> dict:
    """``KEY=VALUE`` pairs as reader options (ints, floats, true/false and null are converted)."""
    out = {key.replace("-", "_"): guess_value(value) for key, value in parse_pairs(pairs, "--option").items()}
    if skip_bad_rows:
        out["skip_bad_rows"] = True
    return out


def _read(path, fmt, options):
    from aisim.errors import TraceError
    from aisim.traces import READERS, guess_format

    fmt = fmt or guess_format(path)
    if fmt not in READERS:
        raise TraceError(f"{path}: unknown trace format '{fmt}'; known: {', '.join(sorted(READERS))}")
    reader = READERS[fmt]
    if fmt == "mooncake-delta":  # forwards its options to read_mooncake
        from aisim.traces.mooncake import read_mooncake as reader
    params = {k: p for k, p in pyinspect.signature(reader).parameters.items() if k not in ("path", "delta")}
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        for key in options:
            if key not in params:
                raise TraceError(f"format '{fmt}' has no option '{key}'; options: {', '.join(sorted(params))}")
    return READERS[fmt](path, **options)


_FORMAT_HELP = "Trace format (oracle, mooncake, mooncake-delta, azure, agentic, parquet); guessed when omitted."


@click.group("trace")
def trace():
    """Generate, inspect and convert request traces."""


@trace.command()
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), help="Parquet file to write.")
@click.option("--requests", "-n", default=1000, show_default=True, type=int, help="Requests (turns included).")
@click.option("--seed", default=0, show_default=True, type=int, help="Random seed; same seed, same trace.")
@click.option("--rate", default=1.0, show_default=True, type=float, help="Arrivals per second (sessions with --turns).")
@click.option("--arrival", default="poisson", show_default=True, type=click.Choice(["poisson", "gamma"]))
@click.option("--cv", default=1.0, show_default=True, type=float, help="Coefficient of variation of gamma gaps.")
@click.option("--prompt", default="lognormal:1024:0.8", show_default=True,
              help="New input tokens: fixed:N, uniform:LOW:HIGH or lognormal:MEAN:SIGMA.")
@click.option("--output", default="lognormal:128:0.8", show_default=True, help="Output tokens (same forms).")
@click.option("--followup", default=None, help="New input of later turns (default: --prompt).")
@click.option("--prefix-groups", default=0, show_default=True, type=int, help="Shared-prefix groups.")
@click.option("--prefix-len", default=0, show_default=True, type=int, help="Tokens of a shared prefix.")
@click.option("--prefix-fraction", default=0.0, show_default=True, type=float,
              help="Fraction of sessions that start with a shared prefix.")
@click.option("--turns", default=1, show_default=True, type=int, help="Requests per session.")
@click.option("--think-time", default=0.0, show_default=True, type=float, help="Mean think time between turns (s).")
@click.option("--model", default=None, help="Model name of every request.")
@click.option("--unit-tokens", default=16, show_default=True, type=int, help="Block size recorded for inspect.")
def synth(out_path, requests, seed, rate, arrival, cv, prompt, output, followup, prefix_groups, prefix_len,
          prefix_fraction, turns, think_time, model, unit_tokens):
    """Generate a synthetic trace and write it as Parquet."""
    from aisim.errors import AisimError
    from aisim.traces.parquet import write_trace
    from aisim.traces.synth import synth_trace

    try:
        table = synth_trace(requests, seed=seed, rate=rate, arrival=arrival, cv=cv, prompt=prompt, output=output,
                            followup=followup, prefix_groups=prefix_groups, prefix_len=prefix_len,
                            prefix_fraction=prefix_fraction, turns=turns, think_time_s=think_time, model=model,
                            unit_tokens=unit_tokens)
        write_trace(table, out_path)
    except AisimError as exc:
        fail(exc)
    click.echo(f"wrote {table.num_rows:,} requests to {out_path}")


@trace.command("inspect")
@click.argument("path")
@click.option("--format", "fmt", default=None, help=_FORMAT_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--block-size", default=None, type=click.IntRange(min=1),
              help="Block size of the ideal hit ratio (default: the trace's unit size, else 16).")
@click.option("--option", "-o", "options", multiple=True, metavar="KEY=VALUE",
              help="Reader option, e.g. -o unit_tokens=512 -o model=llama (repeatable).")
@click.option("--skip-bad-rows", is_flag=True, help="Skip and count bad rows instead of failing.")
def inspect_cmd(path, fmt, as_json, block_size, options, skip_bad_rows):
    """Summarise the trace at PATH: requests, lengths, models, sessions, ideal prefix-cache hit ratio."""
    from aisim.errors import AisimError
    from aisim.traces.inspect import inspect_trace

    opts = _parse_options(options, skip_bad_rows)
    try:
        info = inspect_trace(_read(path, fmt, opts), unit_tokens=block_size)
    except AisimError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        _print_info(path, info)


@trace.command()
@click.argument("path")
@click.option("--format", "fmt", default=None, help=_FORMAT_HELP)
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), help="Parquet file to write.")
@click.option("--option", "-o", "options", multiple=True, metavar="KEY=VALUE", help="Reader option (repeatable).")
@click.option("--skip-bad-rows", is_flag=True, help="Skip and count bad rows instead of failing.")
def convert(path, fmt, out_path, options, skip_bad_rows):
    """Read the trace at PATH and write it as an aisim Parquet trace."""
    from aisim.errors import AisimError
    from aisim.traces.common import bad_rows
    from aisim.traces.parquet import write_trace

    opts = _parse_options(options, skip_bad_rows)
    try:
        table = _read(path, fmt, opts)
        write_trace(table, out_path)
    except AisimError as exc:
        fail(exc)
    skipped = bad_rows(table)
    click.echo(f"wrote {table.num_rows:,} requests to {out_path}" + (f" ({skipped:,} bad rows skipped)"
                                                                    if skipped else ""))


def _print_info(path, info):
    from rich.console import Console
    from rich.table import Table

    def num(v, digits=1):
        return fmt_num(v, digits)

    fmt = info["format"] or "unknown format"
    if info.get("source_format"):
        fmt += f" from {info['source_format']}"
    t = Table(title=f"trace {path} ({fmt})", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    t.add_row("requests", num(info["requests"]))
    unit = "s" if info["clock"] == "time" else "steps"
    t.add_row("arrivals", f"{num(info['first_arrival'], 3)} .. {num(info['last_arrival'], 3)} {unit}")
    if info["duration_s"] is not None and info["duration_s"] > 0:
        t.add_row("rate", f"{info['requests'] / info['duration_s']:,.3f} req/s")
    t.add_row("models", ", ".join(f"{m} ({c:,})" for m, c in info["models"].items()))
    t.add_row("sessions", num(info["sessions"]))
    for key, label in (("prompt_tokens", "prompt tokens"), ("output_tokens", "output tokens")):
        s = info[key]
        t.add_row(f"{label} mean / p50 / p90 / p99",
                  " / ".join(num(s[k], 0) for k in ("mean", "p50", "p90", "p99")))
        t.add_row(f"{label} total / max", f"{num(s['total'])} / {num(s['max'])}")
    t.add_row(f"ideal prefix hit ratio ({info['block_size']}-token blocks)",
              f"{100 * info['ideal_hit_ratio']:.1f}% ({num(info['ideal_hit_tokens'])} tokens)")
    if info["bad_rows"]:
        t.add_row("bad rows skipped", num(info["bad_rows"]))
    Console(highlight=False).print(t)
