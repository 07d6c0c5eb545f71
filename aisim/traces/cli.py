"""``aisim trace``: generate, inspect and convert request traces."""

from __future__ import annotations

import glob
import inspect as pyinspect

import click

from aisim.cli_util import (CONTEXT_SETTINGS, Phases, console, echo_csv, echo_json, fail, flatten, fmt_num, fmt_pct,
                            format_option, guess_value, new_table, out_option, parse_pairs, progress_option)
from aisim.cli_util import trace_format_option as _trace_format_option


def trace_formats() -> list:
    """The trace formats aisim reads (:data:`aisim.traces.FORMATS`, the keys of ``READERS``)."""
    from aisim.traces import FORMATS

    return list(FORMATS)


# The --trace-format option of every command that reads a trace (replay, trace inspect, trace convert).
trace_format_option = _trace_format_option(trace_formats)


def _parse_options(pairs, skip_bad_rows) -> dict:
    """``KEY=VALUE`` pairs as reader options (ints, floats, true/false and null are converted)."""
    out = {key.replace("-", "_"): guess_value(value) for key, value in parse_pairs(pairs, "--option").items()}
    if skip_bad_rows:
        out["skip_bad_rows"] = True
    return out


def _read(path, fmt, options):
    from aisim.errors import TraceError
    from importlib import import_module

    from aisim.traces import FORMAT_BY_NAME, READERS, guess_format

    fmt = fmt or guess_format(path)
    if fmt not in READERS:
        raise TraceError(f"{path}: unknown trace format '{fmt}'; known: {', '.join(sorted(READERS))}")
    reader = READERS[fmt]
    row = FORMAT_BY_NAME.get(fmt)
    if row is not None and row.options_from and getattr(reader, "__module__", None) == row.module:
        # The reader forwards its options to another (TraceFormat.options_from).
        reader = getattr(import_module(row.module), row.options_from)
    params = {k: p for k, p in pyinspect.signature(reader).parameters.items() if k not in ("path", "delta")}
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        for key in options:
            if key not in params:
                raise TraceError(f"format '{fmt}' has no option '{key}'; options: {', '.join(sorted(params))}")
    return READERS[fmt](path, **options)


@click.group("trace", context_settings=CONTEXT_SETTINGS)
def trace():
    """Generate, inspect and convert request traces."""


@trace.command()
@out_option("--out", "out_path", required=True, help="Parquet file to write.")
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
@progress_option()
def synth(out_path, requests, seed, rate, arrival, cv, prompt, output, followup, prefix_groups, prefix_len,
          prefix_fraction, turns, think_time, model, unit_tokens, progress):
    """Generate a synthetic trace and write it as Parquet."""
    from aisim.errors import AisimError
    from aisim.traces.parquet import write_trace
    from aisim.traces.synth import synth_trace

    try:
        with Phases(progress) as phase:
            phase("generating")
            table = synth_trace(requests, seed=seed, rate=rate, arrival=arrival, cv=cv, prompt=prompt,
                                output=output, followup=followup, prefix_groups=prefix_groups,
                                prefix_len=prefix_len, prefix_fraction=prefix_fraction, turns=turns,
                                think_time_s=think_time, model=model, unit_tokens=unit_tokens)
            phase("writing", f"{table.num_rows:,} requests")
            write_trace(table, out_path)
    except AisimError as exc:
        fail(exc)
    click.echo(f"wrote {table.num_rows:,} requests to {out_path}", err=out_path in ("-", "/dev/stdout"))


@trace.command("inspect")
@click.argument("path")
@trace_format_option
@format_option()
@click.option("--json", "as_json", is_flag=True, hidden=True, help="Deprecated: --format json.")
@click.option("--block-size", default=None, type=click.IntRange(min=1),
              help="Block size of the ideal hit ratio (default: the trace's unit size, else 16).")
@click.option("--option", "-o", "options", multiple=True, metavar="KEY=VALUE",
              help="Reader option, e.g. -o unit_tokens=512 -o model=llama (repeatable).")
@click.option("--skip-bad-rows", is_flag=True, help="Skip and count bad rows instead of failing.")
@progress_option()
def inspect_cmd(path, trace_format, fmt, as_json, block_size, options, skip_bad_rows, progress):
    """Summarise the trace at PATH: requests, lengths, models, sessions, ideal prefix-cache hit ratio."""
    from aisim.errors import AisimError
    from aisim.traces.inspect import inspect_trace

    opts = _parse_options(options, skip_bad_rows)
    try:
        with Phases(progress) as phase:
            phase("reading")
            table = _read(path, trace_format, opts)
            phase("summarising", f"{table.num_rows:,} requests")
            info = inspect_trace(table, unit_tokens=block_size)
    except AisimError as exc:
        fail(exc)
    if as_json or fmt == "json":
        echo_json(info)
    elif fmt == "csv":
        echo_csv(["key", "value"], flatten(info))
    else:
        _print_info(path, info)


@trace.command()
@click.argument("path")
@trace_format_option
@out_option("--out", "out_path", required=True, help="Parquet file to write.")
@click.option("--option", "-o", "options", multiple=True, metavar="KEY=VALUE", help="Reader option (repeatable).")
@click.option("--skip-bad-rows", is_flag=True, help="Skip and count bad rows instead of failing.")
def convert(path, trace_format, out_path, options, skip_bad_rows):
    """Read the trace at PATH and write it as an aisim Parquet trace."""
    from aisim.errors import AisimError
    from aisim.traces.common import bad_rows
    from aisim.traces.parquet import write_trace

    from aisim.files import check_outputs

    opts = _parse_options(options, skip_bad_rows)
    inputs = {"PATH": sorted(glob.glob(path)) or [path]}
    try:
        check_outputs({"--out": out_path}, inputs)
        table = _read(path, trace_format, opts)
        write_trace(table, out_path, inputs)
    except AisimError as exc:
        fail(exc)
    skipped = bad_rows(table)
    click.echo(f"wrote {table.num_rows:,} requests to {out_path}" + (f" ({skipped:,} bad rows skipped)"
                                                                    if skipped else ""),
               err=out_path in ("-", "/dev/stdout"))


def _print_info(path, info):
    fmt = info["format"] or "unknown format"
    if info.get("source_format"):
        fmt += f" from {info['source_format']}"
    t = new_table("what", ("value", {"justify": "right"}), title=f"trace {path} ({fmt})", show_header=False)
    t.columns[0].style = "bold"
    t.add_row("requests", fmt_num(info["requests"]))
    unit = "s" if info["clock"] == "time" else "steps"
    t.add_row("arrivals", f"{fmt_num(info['first_arrival'])} .. {fmt_num(info['last_arrival'])} {unit}")
    if info["duration_s"] is not None and info["duration_s"] > 0:
        t.add_row("rate", f"{fmt_num(info['requests'] / info['duration_s'])} req/s")
    t.add_row("models", ", ".join(f"{m} ({fmt_num(c)})" for m, c in info["models"].items()))
    t.add_row("sessions", fmt_num(info["sessions"]))
    for key, label in (("prompt_tokens", "prompt tokens"), ("output_tokens", "output tokens")):
        s = info[key]
        t.add_row(f"{label} mean / p50 / p90 / p99",
                  " / ".join(fmt_num(s[k], 0) for k in ("mean", "p50", "p90", "p99")))
        t.add_row(f"{label} total / max", f"{fmt_num(s['total'], 1)} / {fmt_num(s['max'], 1)}")
    t.add_row(f"ideal prefix hit ratio ({info['block_size']}-token blocks)",
              f"{fmt_pct(info['ideal_hit_ratio'])} ({fmt_num(info['ideal_hit_tokens'], 1)} tokens)")
    if info["bad_rows"]:
        t.add_row("bad rows skipped", fmt_num(info["bad_rows"]))
    console().print(t)
