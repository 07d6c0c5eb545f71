"""``aisim sweep``: replay a grid of engine configurations and rank them by SLO goodput."""

from __future__ import annotations

import json

import click

from aisim.cli_util import (CONTEXT_SETTINGS, Phases, console, echo_csv, echo_json, fail, fmt_num, fmt_pct,
                            fmt_seconds, fit_table, format_option, progress_option)
from aisim.config.overrides import set_option


def _knobs(knobs: dict) -> str:
    return " ".join(f"{k}={json.dumps(v)}" for k, v in knobs.items())


def _with_band(r: dict) -> str:
    """The capacity rate and its band: ``14.200 (12.800-15.100)``."""
    text = fmt_num(r["capacity_rate_req_s"])
    low, high = r["capacity_band_low_req_s"], r["capacity_band_high_req_s"]
    if r["capacity_rate_req_s"] is None or (low is None and high is None):
        return text
    return f"{text} ({fmt_num(low)}-{fmt_num(high)})"


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("spec_path", metavar="SPEC.toml", type=click.Path(dir_okay=False))
@click.option("--scheduler", default="local", show_default=True,
              help="'local' (a LocalCluster), 'sync' (in process) or a Dask scheduler address.")
@click.option("--workers", type=int, help="Worker processes of the local cluster.")
@click.option("--force", is_flag=True, help="Replay again even if the database has this sweep's run.")
@set_option()
@format_option()
@progress_option()
def sweep(spec_path, scheduler, workers, force, sets, fmt, progress):
    """Replay every candidate of SPEC.toml and rank them by SLO goodput."""
    from aisim.errors import AisimError
    from aisim.pipeline.progress import LineProgress, Quiet
    from aisim.sweep import load_sweep, run_sweep

    phases = Phases(progress)
    # A line per candidate replayed, as aisim pipeline run logs its shards (under the phase's spinner).
    reporter = LineProgress(console(stderr=True)) if phases.enabled else Quiet()
    try:
        spec = load_sweep(spec_path)
        if sets:
            from aisim.config.overrides import apply_to_sweep, parse_sets

            apply_to_sweep(spec, parse_sets(sets))
        with phases:
            result = run_sweep(spec, scheduler=scheduler, workers=workers, force=force, progress=reporter,
                               phases=phases)
    except AisimError as exc:
        fail(exc)
    rows = [{"rank": c.rank, "candidate": c.name, "knobs": c.knobs, "goodput_req_s": c.goodput_req_s,
             "slo_attainment": c.slo_attainment, "rejected": c.rejected, "ttft_p99_s": c.ttft_p99_s,
             "tpot_p99_s": c.tpot_p99_s, "gpus": c.gpus, "kv_tokens": c.cost_tokens} for c in result.ranked]
    if spec.capacity is not None:  # what the candidates are ranked by, with its band
        for r, c in zip(rows, result.ranked):
            r["capacity_rate_req_s"] = c.capacity_rate_req_s
            r["capacity_band_low_req_s"], r["capacity_band_high_req_s"] = c.capacity_band
    for r, c in zip(rows, result.ranked):
        r["calibration"] = c.calibration
    if spec.deployment is not None:  # each candidate's deployment, every key resolved
        for r, c in zip(rows, result.ranked):
            r["deployment"] = c.deployment.to_dict()
    refused = [{"candidate": c.name, "knobs": c.knobs, "reason": c.reason} for c in result.candidates if c.refused]
    runs = f"run {result.run_id}" if len(result.run_ids) == 1 else f"runs {', '.join(result.run_ids)}"
    deployed = f" and its deployment to {spec.best_deployment}" if spec.deployment is not None else ""
    where = (f"best configuration ({result.best.name}) written to {spec.best}{deployed}; every candidate is in "
             f"{spec.database} ({runs}, table sweep_candidates"
             f"{'; each search in capacity_points' if spec.capacity is not None else ''})")
    if fmt == "json":
        echo_json({"sweep": spec.name, "model": spec.model, "slo": spec.slo, "run_id": result.run_id,
                   "run_ids": result.run_ids,
                   "best": result.best.name, "best_file": str(spec.best), "ranked": rows, "refused": refused})
        console(stderr=True).print(where)
        return
    if fmt == "csv":
        echo_csv(list(rows[0]) if rows else ["rank"], [list(r.values()) for r in rows])
        console(stderr=True).print(where)
        return
    out = console()
    slo = ", ".join(f"{k} <= {v:g}" for k, v in spec.slo.items())
    headers = ("rank", "candidate", "knobs") + (("capacity req/s",) if spec.capacity is not None else ()) + (
        "goodput req/s", "SLO met", "rejected", "TTFT p99", "TPOT p99", "GPUs", "KV tokens")
    cells = []
    for r in rows:
        capacity = (_with_band(r),) if spec.capacity is not None else ()
        cells.append([str(r["rank"]), r["candidate"], _knobs(r["knobs"]), *capacity, fmt_num(r["goodput_req_s"]),
                      fmt_pct(r["slo_attainment"]), fmt_num(r["rejected"]), fmt_seconds(r["ttft_p99_s"]),
                      fmt_seconds(r["tpot_p99_s"]), str(r["gpus"]), fmt_num(r["kv_tokens"])])
    t, cut = fit_table([(col, {"justify": "left" if col in ("candidate", "knobs") else "right"}) for col in headers],
                       cells, keep=("rank", "candidate"), title=f"sweep {spec.name}: {spec.model}, SLO {slo}")
    out.print(t)
    if cut:
        out.print(cut)
    for c in refused:
        out.print(f"refused {c['candidate']} ({_knobs(c['knobs'])}): {c['reason']}")
    if spec.capacity is not None:
        out.print("ranked by the highest rate within the [capacity] SLO (capacity_points); ties go to fewer GPUs, "
                  "then to the lower p99 TTFT", markup=False)
        cals = sorted({r["calibration"] for r in rows if r["calibration"]})
        if cals:
            out.print(f"bands: every step time at the ends of the held-out errors of calibration "
                      f"{', '.join(repr(c) for c in cals)}", markup=False)
    else:
        out.print("ties in goodput go to fewer GPUs, then to the lower p99 TTFT")
    out.print(where)
