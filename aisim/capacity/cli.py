"""``aisim capacity``: the highest rate within an SLO, or the smallest deployment that serves a trace."""

from __future__ import annotations

import json

import click

from aisim.bench_cli import model_options
from aisim.cli_util import (CONTEXT_SETTINGS, Phases, console, echo_csv, echo_json, fail, fmt_num, fmt_pct,
                            fmt_seconds, fit_table, format_option, out_option, progress_option)
from aisim.config.overrides import set_option

# The columns printed as a table (every column is in csv, json and the database).
_SHOWN = ("point", "phase", "candidate", "knobs", "replicas", "rate_req_s", "verdict", "attainment", "ttft_p99_s",
          "tpot_p99_s", "e2e_p99_s", "throughput_req_s", "gpus", "gpu_hours", "cost_per_mtok")


# Table headings (the csv and json keep the column names): words, so a narrow terminal wraps them.
_HEADINGS = {"rate_req_s": "rate req/s", "attainment": "SLO met", "ttft_p99_s": "TTFT p99", "tpot_p99_s": "TPOT p99",
             "e2e_p99_s": "E2E p99", "throughput_req_s": "done req/s", "gpu_hours": "GPU-hours",
             "cost_per_mtok": "per M tokens"}


def _cell(name: str, v) -> str:
    if v is None or (name == "knobs" and v == "{}"):
        return "-"
    if name == "attainment":
        return fmt_pct(v)
    if name.endswith("_s") and name not in ("rate_req_s", "throughput_req_s"):
        return fmt_seconds(v)
    if name == "answer":
        return "yes" if v else ""
    if isinstance(v, float):
        return fmt_num(v, 4)
    return str(v)


def _title(name: str) -> str:
    """``capacity NAME``; the flags' default name (``capacity``) once."""
    return "capacity" if name == "capacity" else f"capacity {name}"


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _answer_line(result) -> str:
    a = result.answer
    if a is None:
        return result.floor or "no evaluated point meets the SLO"
    if result.question == "rate":
        load = json.loads(a["load"])
        rate = f"{fmt_num(a['rate_req_s'], 4)} requests/s" if a["rate_req_s"] is not None else "-"
        how = f"rate x{fmt_num(load['rate_scale'], 4)}" if "rate_scale" in load else "Poisson"
        return (f"highest rate within the SLO: {rate}{_band_text(result.band)} ({how}, point {a['point']}) on "
                f"{_gpus(a['gpus'])}")
    split = (f"{a['prefill_replicas']} prefill + {a['decode_replicas']} decode replicas"
             if a["prefill_replicas"] is not None else f"{a['replicas']} replica{'s' if a['replicas'] != 1 else ''}")
    cost = f", {fmt_num(a['cost_per_mtok'], 4)} per million output tokens" if a["cost_per_mtok"] is not None else ""
    return (f"smallest deployment: {a['candidate']} {a['knobs']}, {split}, {_gpus(a['gpus'])}"
            f"{_band_text(result.band)}, {fmt_num(a['gpu_hours'], 4)} GPU-hours{cost} (point {a['point']})")


def _band_text(band) -> str:
    """``, 12.8-15.1`` (rates, or GPUs) and the calibration that gave the band (empty without one)."""
    if band is None:
        return ""
    keys = ("low_req_s", "high_req_s") if "low_req_s" in band else ("low_gpus", "high_gpus")
    ends = [fmt_num(band[k], 4) if band[k] is not None else "none" for k in keys]
    lo, hi = band["scale"]
    return (f", {ends[0]}-{ends[1]} (step times x{lo:.3g}-x{hi:.3g}, the held-out errors of calibration "
            f"'{band['calibration']}')")


def _spec_from_flags(flags: dict, slo, rate, fleet, write_spec_path):
    """The spec the flags give (:mod:`aisim.capacity.flags`), validated as a file's; written when asked."""
    from aisim.capacity.flags import spec_dict, spec_from_flags, write_spec

    if flags["engine"] is not None and flags["model"] is not None:
        raise click.UsageError("give the engine once: --engine FILE, or --model and --gpu to plan one")
    if flags["model"] is not None:
        return _planned(flags, slo, rate, fleet, write_spec_path)
    if flags["gpu"] is not None or flags["tp"] is not None:
        raise click.UsageError("--gpu and --tp plan an engine with --model")
    missing = [o for o, v in (("--engine", flags["engine"]), ("--trace", flags["trace"]), ("--slo", slo)) if not v]
    if missing:
        raise click.UsageError(f"give a spec file, or the question as flags: {', '.join(missing)} missing")
    if bool(rate) == bool(fleet):
        raise click.UsageError("ask one question: --rate (the highest rate within the SLO) or --fleet KEY=VALUE "
                               "(the smallest deployment)")
    raw = spec_dict(name=flags["name"] or "capacity", database=flags["database"] or "capacity.duckdb",
                    engine=flags["engine"], deployment=flags["deployment"], trace=flags["trace"],
                    trace_format=flags["trace_format"], slo=slo, rate=[r for r in rate if r] if rate else None,
                    fleet=fleet, price=flags["price"])
    spec = spec_from_flags(raw)
    if write_spec_path:
        write_spec(write_spec_path, raw)
    return spec


def _planned(flags: dict, slo, rate, fleet, write_spec_path):
    """The spec of flags whose engine ``--model``/``--gpu``/``--tp`` plans: the plan is written as ``aisim plan
    --out`` writes it and read back as the spec's engine file (beside ``--write-spec``'s spec, as
    ``NAME.engine.toml``; else in a temporary folder), so the flags and the written files give one search."""
    import os
    import shutil
    import tempfile

    from aisim.bench_cli import plan_engine, show_plan
    from aisim.files import write_text
    from aisim.plan import engine_toml

    cfg, notes = plan_engine(flags["model"], flags["gpu"], flags["tp"])
    show_plan(flags["model"], flags["gpu"], flags["tp"], notes)
    planned = dict(flags, model=None, gpu=None, tp=None)
    # A path the plan names (a config.json) is written relative to the file that holds it.
    if write_spec_path:
        engine_file = os.path.splitext(write_spec_path)[0] + ".engine.toml"
        with tempfile.TemporaryDirectory(prefix=".aisim-") as tmp:  # validated before anything is written
            trial = os.path.join(tmp, "engine.toml")
            write_text(trial, engine_toml(cfg, notes, tmp))
            _spec_from_flags(dict(planned, engine=trial), slo, rate, fleet, None)
        write_text(engine_file, engine_toml(cfg, notes, os.path.dirname(os.path.abspath(engine_file))))
        return _spec_from_flags(dict(planned, engine=engine_file), slo, rate, fleet, write_spec_path)
    # The engine file lives until the command ends: the search reads the plan's paths relative to it.
    tmp = tempfile.mkdtemp(prefix=".aisim-")
    click.get_current_context().call_on_close(lambda: shutil.rmtree(tmp, ignore_errors=True))
    engine_file = os.path.join(tmp, "engine.toml")
    write_text(engine_file, engine_toml(cfg, notes, tmp))
    return _spec_from_flags(dict(planned, engine=engine_file), slo, rate, fleet, None)


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("spec_path", metavar="[SPEC.toml]", required=False, type=click.Path(dir_okay=False))
@click.option("--name", help="Flags instead of a file: the search's name (the spec's 'name'; default capacity).")
@click.option("--db", "database", type=click.Path(dir_okay=False),
              help="Flags: the database (the spec's 'database'; default capacity.duckdb).")
@click.option("--engine", "engine_path", type=click.Path(dir_okay=False),
              help="Flags: the engine file (the spec's 'engine'); or --model and --gpu.")
@model_options
@click.option("--deployment", "deployment_path", type=click.Path(dir_okay=False),
              help="Flags: a deployment file (the spec's 'deployment').")
@click.option("--trace", "trace_path", type=click.Path(), help="Flags: the trace ([trace] path).")
@click.option("--trace-format", help="Flags: its format ([trace] format; default: guessed from the name).")
@click.option("--slo", "slo", multiple=True, metavar="KEY=VALUE",
              help="Flags: an [slo] key, e.g. ttft_p99_s=0.5 or ttft_s=2 attainment=0.95 (repeatable).")
@click.option("--rate", "rate", multiple=True, metavar="KEY=VALUE", is_flag=False, flag_value="",
              help="Flags: ask for the highest rate within the SLO; --rate alone, or [rate] keys, e.g. "
                   "--rate by=poisson_rate --rate start=4 (repeatable).")
@click.option("--fleet", "fleet", multiple=True, metavar="KEY=VALUE",
              help="Flags: ask for the smallest deployment: [fleet] keys, e.g. max_replicas=8, "
                   "grid='{\"max_num_seqs\": [64, 128]}' (repeatable).")
@click.option("--price-per-gpu-hour", "price", type=float, help="Flags: the spec's price_per_gpu_hour.")
@out_option("--write-spec", "write_spec_path", help="Write the spec the flags make (TOML), to run it again from a file.")
@set_option()
@format_option()
@progress_option()
def capacity(spec_path, name, database, engine_path, model, gpu, tp, deployment_path, trace_path, trace_format, slo,
             rate, fleet, price, write_spec_path, sets, fmt, progress):
    """Answer a capacity question: the highest rate within an SLO ([rate]), or the smallest
    deployment that serves a trace ([fleet]); every evaluated point lands in capacity_points.

    The question is SPEC.toml, or the same keys as flags (each flag is a key of the file):

    \b
      aisim capacity --model llama-3.1-8b --gpu H100 --trace trace.jsonl \\
        --slo ttft_s=0.5 --slo attainment=0.99 --rate
    """
    from aisim.capacity.spec import load_capacity, run_capacity
    from aisim.columns import CAPACITY_POINTS
    from aisim.errors import AisimError

    phases = Phases(progress)
    try:
        flags = {"name": name, "database": database, "engine": engine_path, "model": model, "gpu": gpu, "tp": tp,
                 "deployment": deployment_path, "trace": trace_path, "trace_format": trace_format, "price": price}
        options = {"database": "--db", "price": "--price-per-gpu-hour"}
        given = [options.get(k, f"--{k.replace('_', '-')}") for k, v in flags.items() if v is not None]
        given += [o for o, v in (("--slo", slo), ("--rate", rate), ("--fleet", fleet)) if v]
        if spec_path is not None:
            if given or write_spec_path:
                raise click.UsageError(f"{', '.join(given) or '--write-spec'}: the spec is {spec_path}; give a spec "
                                       "file or its keys as flags, not both")
            spec = load_capacity(spec_path)
        else:
            spec = _spec_from_flags(flags, slo, rate, fleet, write_spec_path)
        if sets:
            from aisim.config.overrides import apply_deployment, apply_engine, parse_sets

            overrides = parse_sets(sets)
            try:
                spec.engine = apply_engine(spec.engine, overrides)
            except AisimError as exc:
                if model is None:
                    raise
                # A planned engine's file was temporary: the message names the plan, as replay's does.
                raise type(exc)(str(exc).replace(spec.engine.source, f"the engine planned for {model}")) from None
            spec.deployment = apply_deployment(spec.deployment, overrides)
        with phases:
            result = run_capacity(spec, progress=phases)
    except AisimError as exc:
        fail(exc)
    names = CAPACITY_POINTS.names
    rows = [dict(zip(names, r)) for r in result.rows()]
    where = f"{len(rows)} points in {spec.database} (table capacity_points, search_id {result.search_id})"
    if fmt == "json":
        echo_json({"search": spec.name, "search_id": result.search_id, "question": result.question,
                   "slo": spec.slo.to_dict(), "answer": result.answer.row["point"] if result.answer else None,
                   "band": result.band,
                   "notes": result.notes, "points": rows})
        console(stderr=True).print(where)
        return
    if fmt == "csv":
        echo_csv(list(names), [list(r.values()) for r in rows])
        console(stderr=True).print(where)
        return
    out = console()
    # Columns every point leaves empty (a rate search's candidate and knobs, costs without a price) are left out.
    t, cut = fit_table([(_HEADINGS.get(c, c), {"justify": "left" if c in ("phase", "candidate", "knobs", "verdict")
                                               else "right"}) for c in _SHOWN + ("answer",)],
                       [[_cell(c, r[c]) for c in _SHOWN + ("answer",)] for r in rows], keep=("point", "verdict", "answer"),
                       title=f"{_title(spec.name)}: SLO {spec.slo.describe()}")
    out.print(t)
    if cut:
        out.print(cut)
    out.print(_answer_line(result))
    for note in result.notes:
        if note != result.floor:  # the answer line said it
            out.print(f"note: {note}")
    out.print(where)
