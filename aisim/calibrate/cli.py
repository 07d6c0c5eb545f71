"""``aisim calibrate``: fit the time model to ``vllm bench serve`` result files, with cross-validation."""

from __future__ import annotations

import click

from aisim.cli_util import CONTEXT_SETTINGS, fail, format_option, out_option, progress_option


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--engine", "engine_path", type=click.Path(dir_okay=False),
              help="The engine the runs ran (an engine file); or give --model and --gpu.")
@click.option("--model", help="Catalog model or config.json path, planned as `aisim plan --model` does.")
@click.option("--gpu", help="Catalog GPU (with --model).")
@click.option("--tp", "--tensor-parallel-size", "-tp", "tp", type=int, default=1, show_default=True,
              help="Tensor-parallel size (with --model).")
@click.option("--dtype", type=click.Choice(["bf16", "fp8"]), help="Weights as served (with --model).")
@click.option("--max-model-len", type=int, help="As vllm serve was started (with --model).")
@click.option("--fit", "fit_keys", help="Comma-separated constants to fit (default: every fitted time-model constant).")
@click.option("--name", help="The calibration's name in its record (default: the --out file's stem, else "
                             "'calibrated').")
@click.option("--max-iter", type=click.IntRange(1), default=60, show_default=True,
              help="Least-squares iterations of each fit.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the rebuilt send times.")
@out_option("--out", "out_path", help="Write the engine with the fitted time model and its calibration (TOML).")
@click.option("--db", "db_path", type=click.Path(dir_okay=False),
              help="Also land the measured runs in this DuckDB file (table measured_runs).")
@format_option()
@progress_option()
def calibrate(results, engine_path, model, gpu, tp, dtype, max_model_len, fit_keys, name, max_iter, seed, out_path,
              db_path, fmt, progress):
    """Fit the time model's fitted constants to vllm bench serve RESULTS (--save-result JSON files;
    AIPerf's profile_export_aiperf.json too).

    Each run is rebuilt (its lengths, its send times at its request rate and burstiness, its
    concurrency cap), replayed on the engine, and its mean TTFT, TPOT, ITL, E2E latency and output
    throughput compared with the measured ones; the constants are fitted by least squares on the
    log errors.  Every point's error is printed twice: from the fit on every file, and held out
    (from the fit on every other file).  The held-out errors' quantiles go into the calibration
    record of the written time model, and give capacity answers their band.  Each fit's iterations
    on stderr with --progress (default: on a terminal).
    """
    import os
    import sys

    from aisim.calibrate.benchserve import read_bench_serve
    from aisim.calibrate.fit import calibrate as run_calibration
    from aisim.errors import AisimError

    try:
        if (engine_path is None) == (model is None):
            raise click.UsageError("give exactly one of --engine and --model")
        if model is not None and gpu is None:
            raise click.UsageError("--model needs --gpu")
        runs = [r for path in results for r in read_bench_serve(path)]
        if engine_path:
            from aisim.config.engine import load_engine_config

            engine = load_engine_config(engine_path)
        else:
            from aisim.plan import plan_from_model

            engine, _ = plan_from_model(model, tp=tp, max_model_len=max_model_len, gpu=gpu, dtype=dtype)
        from aisim.files import check_outputs

        # Refused before the fits: an output that is an input, or --out and --db in one file.
        inputs = {"RESULTS": list(results), "--engine": engine_path}
        check_outputs({"--out": out_path, "--db": db_path}, inputs)
        keys = tuple(k.strip() for k in fit_keys.split(",") if k.strip()) if fit_keys else None
        label = name or (os.path.splitext(os.path.basename(out_path))[0] if out_path else "calibrated")
        result = run_calibration(runs, engine, name=label, keys=keys, max_iter=max_iter, seed=seed,
                                 progress=_progress_line if (sys.stderr.isatty() if progress is None else progress)
                                 else None)
        # The database first, in its own transaction: a database that refuses the runs leaves no --out either.
        if db_path:
            from aisim.calibrate.measured import land_measured

            land_measured(db_path, runs, result.engine, result.record["name"])
        if out_path:
            from aisim.calibrate.output import write_engine

            write_engine(out_path, result, inputs)
    except AisimError as exc:
        fail(exc)
    _print(result, fmt)
    if out_path:
        click.echo(f"calibrated engine written to {out_path}", err=fmt != "table")
    if db_path:
        click.echo(f"{len(runs)} measured runs landed in {db_path}", err=fmt != "table")


def _progress_line(line: str) -> None:
    click.echo(line, err=True)


def _print(result, fmt: str) -> None:
    from aisim.cli_util import echo_csv, echo_json

    from aisim.config.calibration import METRIC_UNITS, METRICS

    # Values in the metric's unit (ms; tok/s for throughput), errors as predicted / measured - 1.
    cols = ("run", "metric", "unit", "measured", "fitted", "fitted_error", "held_out", "held_out_error")
    points = [{c: METRIC_UNITS[r["metric"]] if c == "unit" else r[c] for c in cols} for r in result.rows]
    if fmt == "json":
        echo_json({"constants": result.fit.values, "loss": result.fit.loss, "calibration": result.record,
                   "folds": {f: r.values for f, r in result.folds.items()}, "points": points})
        return
    if fmt == "csv":
        echo_csv(cols, [[p[c] for c in cols] for p in points])
        return
    import numpy as np

    from aisim.cli_util import console, new_table

    t = new_table("run", "metric", ("measured", {"justify": "right"}), ("fitted", {"justify": "right"}),
                  ("error", {"justify": "right"}), ("held out", {"justify": "right"}), ("error", {"justify": "right"}),
                  title="each point: fitted on every file, and held out (fitted on the other files)")
    for r in result.rows:
        u = METRIC_UNITS[r["metric"]]
        t.add_row(r["run"], r["metric"], f"{r['measured']:,.2f} {u}", f"{r['fitted']:,.2f}",
                  f"{100 * r['fitted_error']:+.1f}%", f"{r['held_out']:,.2f}", f"{100 * r['held_out_error']:+.1f}%")
    con = console()
    con.print(t)
    s = new_table("metric", ("points", {"justify": "right"}), ("median |error| fitted", {"justify": "right"}),
                  ("median |error| held out", {"justify": "right"}), title="median absolute error")
    for m in METRICS:
        rows = [r for r in result.rows if r["metric"] == m]
        if rows:
            s.add_row(m, str(len(rows)), f"{100 * np.median([abs(r['fitted_error']) for r in rows]):.1f}%",
                      f"{100 * np.median([abs(r['held_out_error']) for r in rows]):.1f}%")
    con.print(s)
    con.print("fitted: " + ", ".join(f"{k} {v:.4g}" for k, v in result.fit.values.items())
              + f" (loss {result.fit.loss:.4g})")
    from aisim.config.calibration import scale_band

    band = scale_band(result.record)
    if band is not None:
        q = result.record["quantiles"]
        con.print(f"capacity bands from this calibration: every step time x{band[0]:.3g} to x{band[1]:.3g} (its "
                  f"held-out step-time errors at quantiles {q[0]:g} and {q[-1]:g})")
