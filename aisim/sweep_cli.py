"""``aisim sweep``: replay a grid of engine configurations and rank them by SLO goodput."""

from __future__ import annotations

import json
import sys

import click


def _knobs(knobs: dict) -> str:
    return " ".join(f"{k}={json.dumps(v)}" for k, v in knobs.items())


@click.command()
@click.argument("spec_path", metavar="SPEC.toml", type=click.Path(dir_okay=False))
@click.option("--scheduler", default="local", show_default=True,
              help="'local' (a LocalCluster), 'sync' (in process) or a Dask scheduler address.")
@click.option("--workers", type=int, help="Worker processes of the local cluster.")
@click.option("--force", is_flag=True, help="Replay again even if the database has this sweep's run.")
def sweep(spec_path, scheduler, workers, force):
    """Replay every candidate of SPEC.toml and rank them by SLO goodput."""
    from rich.console import Console
    from rich.table import Table

    from aisim.errors import AisimError
    from aisim.sweep import load_sweep, run_sweep

    try:
        spec = load_sweep(spec_path)
        result = run_sweep(spec, scheduler=scheduler, workers=workers, force=force)
    except AisimError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    console = Console(highlight=False)
    slo = ", ".join(f"{k} <= {v:g}" for k, v in spec.slo.items())
    t = Table(title=f"sweep {spec.name}: {spec.model}, SLO {slo}")
    for col in ("rank", "candidate", "knobs", "goodput req/s", "SLO met", "KV tokens"):
        t.add_column(col, justify="right" if col not in ("candidate", "knobs") else "left")
    for c in result.ranked:
        t.add_row(str(c.rank), c.name, _knobs(c.knobs), f"{c.goodput_req_s:.3f}",
                  f"{100 * c.slo_attainment:.1f}%", f"{c.cost_tokens:,}")
    console.print(t)
    for c in result.candidates:
        if c.refused:
            console.print(f"refused {c.name} ({_knobs(c.knobs)}): {c.reason}")
    console.print(f"best configuration ({result.best.name}) written to {spec.best}; every candidate is in "
                  f"{spec.database} (run {result.run_id}, table sweep_candidates)")
