"""``aisim sweep``: replay a grid of engine configurations and rank them by SLO goodput."""

from __future__ import annotations

import json

import click

from aisim.cli_util import CONTEXT_SETTINGS, console, fail


def _knobs(knobs: dict) -> str:
    return " ".join(f"{k}={json.dumps(v)}" for k, v in knobs.items())


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("spec_path", metavar="SPEC.toml", type=click.Path(dir_okay=False))
@click.option("--scheduler", default="local", show_default=True,
              help="'local' (a LocalCluster), 'sync' (in process) or a Dask scheduler address.")
@click.option("--workers", type=int, help="Worker processes of the local cluster.")
@click.option("--force", is_flag=True, help="Replay again even if the database has this sweep's run.")
def sweep(spec_path, scheduler, workers, force):
    """Replay every candidate of SPEC.toml and rank them by SLO goodput."""
    from rich.table import Table

    from aisim.errors import AisimError
    from aisim.sweep import load_sweep, run_sweep

    try:
        spec = load_sweep(spec_path)
        result = run_sweep(spec, scheduler=scheduler, workers=workers, force=force)
    except AisimError as exc:
        fail(exc)
    out = console()
    slo = ", ".join(f"{k} <= {v:g}" for k, v in spec.slo.items())
    t = Table(title=f"sweep {spec.name}: {spec.model}, SLO {slo}")
    for col in ("rank", "candidate", "knobs", "goodput req/s", "SLO met", "KV tokens"):
        t.add_column(col, justify="right" if col not in ("candidate", "knobs") else "left")
    for c in result.ranked:
        t.add_row(str(c.rank), c.name, _knobs(c.knobs), f"{c.goodput_req_s:.3f}",
                  f"{100 * c.slo_attainment:.1f}%", f"{c.cost_tokens:,}")
    out.print(t)
    for c in result.candidates:
        if c.refused:
            out.print(f"refused {c.name} ({_knobs(c.knobs)}): {c.reason}")
    out.print(f"best configuration ({result.best.name}) written to {spec.best}; every candidate is in "
                  f"{spec.database} (run {result.run_id}, table sweep_candidates)")
