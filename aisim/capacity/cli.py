"""``aisim capacity``: the highest rate within an SLO, or the smallest deployment that serves a trace."""

from __future__ import annotations

import json

import click

from aisim.cli_util import (CONTEXT_SETTINGS, Phases, console, echo_csv, echo_json, fail, fmt_num, fmt_pct,
                            fmt_seconds, format_option, new_table, progress_option)

# The columns printed as a table (every column is in csv, json and the database).
_SHOWN = ("point", "phase", "candidate", "knobs", "replicas", "rate_req_s", "verdict", "attainment", "ttft_p99_s",
          "tpot_p99_s", "e2e_p99_s", "throughput_req_s", "gpus", "gpu_hours", "cost_per_mtok")


def _cell(name: str, v) -> str:
    if v is None:
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
        return f"highest rate within the SLO: {rate} ({how}, point {a['point']}) on {_gpus(a['gpus'])}"
    split = (f"{a['prefill_replicas']} prefill + {a['decode_replicas']} decode replicas"
             if a["prefill_replicas"] is not None else f"{a['replicas']} replica{'s' if a['replicas'] != 1 else ''}")
    cost = f", {fmt_num(a['cost_per_mtok'], 4)} per million output tokens" if a["cost_per_mtok"] is not None else ""
    return (f"smallest deployment: {a['candidate']} {a['knobs']}, {split}, {_gpus(a['gpus'])}, "
            f"{fmt_num(a['gpu_hours'], 4)} GPU-hours{cost} (point {a['point']})")


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("spec_path", metavar="SPEC.toml", type=click.Path(dir_okay=False))
@format_option()
@progress_option()
def capacity(spec_path, fmt, progress):
    """Answer SPEC.toml's question: the highest rate within its SLO ([rate]), or the smallest
    deployment that serves its trace ([fleet]); every evaluated point lands in capacity_points."""
    from aisim.capacity.spec import load_capacity, run_capacity
    from aisim.columns import CAPACITY_POINTS
    from aisim.errors import AisimError

    phases = Phases(progress)
    try:
        spec = load_capacity(spec_path)
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
                   "notes": result.notes, "points": rows})
        console(stderr=True).print(where)
        return
    if fmt == "csv":
        echo_csv(list(names), [list(r.values()) for r in rows])
        console(stderr=True).print(where)
        return
    out = console()
    t = new_table(*[(c, {"justify": "left" if c in ("phase", "candidate", "knobs", "verdict") else "right"})
                    for c in _SHOWN + ("answer",)],
                  title=f"capacity {spec.name}: SLO {spec.slo.describe()}")
    for r in rows:
        t.add_row(*[_cell(c, r[c]) for c in _SHOWN + ("answer",)])
    out.print(t)
    out.print(_answer_line(result))
    for note in result.notes:
        if note != result.floor:  # the answer line said it
            out.print(f"note: {note}")
    out.print(where)
