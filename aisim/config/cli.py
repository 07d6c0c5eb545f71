"""``aisim config`` and ``aisim plan``: check, show and plan engine configurations."""

from __future__ import annotations

import json
import sys

import click

from aisim.config.keys import ENGINE_KEYS, defaults


def _fail(exc: Exception) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(2)


@click.group()
def config():
    """Check and show engine configurations."""


@config.command()
@click.argument("file", type=click.Path(dir_okay=False))
def validate(file):
    """Check FILE strictly (keys, values, the grouped-prefix rule)."""
    from aisim.config.engine import load_engine_config
    from aisim.config.kvgroups import expand_groups
    from aisim.errors import AisimError

    try:
        cfg = load_engine_config(file)
    except AisimError as exc:
        _fail(exc)
    groups = expand_groups(cfg.groups)
    kinds = ", ".join(g["type"] for g in groups)
    click.echo(f"{file}: valid. {len(groups)} KV-cache group(s) [{kinds}], {cfg.num_gpu_blocks} blocks, "
               f"prefix caching {'on' if cfg.enable_prefix_caching else 'off'}, vLLM {cfg.version} rules")


@config.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["toml", "json"]), default="toml", show_default=True)
def show(file, fmt):
    """Print FILE's resolved configuration, every default filled in."""
    from aisim.config.engine import load_engine_config
    from aisim.config.kvgroups import resolve_groups
    from aisim.config.toml_out import dumps
    from aisim.errors import AisimError

    try:
        cfg = load_engine_config(file)
    except AisimError as exc:
        _fail(exc)
    d = cfg.to_dict()
    kw = resolve_groups(cfg)
    d["derived"] = {"hash_block_size": kw["hash_block_size"], "scheduler_block_size": kw["sched_block_size"],
                    "fine_grained_hits": kw["fine_grained"],
                    "cache_hit_alignment": kw["hash_block_size"] if kw["fine_grained"] else kw["sched_block_size"]}
    if fmt == "json":
        click.echo(json.dumps(d, indent=2, sort_keys=True))
    else:
        d["time_model"] = dict(d["time_model"])
        click.echo(dumps(d), nl=False)


@click.command()
@click.option("--probe", "probe_path", type=click.Path(dir_okay=False), help="Probe JSON of a running vLLM engine.")
@click.option("--model", help="Catalog model, to plan without a probe.")
@click.option("--gpu-memory-gib", type=float, help="Memory of one GPU (with --model).")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size (with --model).")
@click.option("--max-model-len", type=int,
              help=f"Longest sequence (with --model; default {defaults(ENGINE_KEYS)['max_model_len']}).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), help="Write the engine configuration (TOML).")
def plan(probe_path, model, gpu_memory_gib, tp, max_model_len, out_path):
    """Plan an engine configuration from a probe or from the model catalog, and explain it."""
    from aisim.errors import AisimError
    from aisim.output import write_atomic_text
    from aisim.plan import engine_toml, load_probe, plan_from_model, plan_from_probe

    try:
        if (probe_path is None) == (model is None):
            raise click.UsageError("give exactly one of --probe and --model")
        if probe_path:
            cfg, notes = plan_from_probe(load_probe(probe_path))
        else:
            if gpu_memory_gib is None:
                raise click.UsageError("--model needs --gpu-memory-gib")
            cfg, notes = plan_from_model(model, gpu_memory_gib, tp, max_model_len)
        text = engine_toml(cfg, notes)
        if out_path:
            write_atomic_text(out_path, [text])
    except AisimError as exc:
        _fail(exc)
    for n in notes:
        click.echo(f"- {n}")
    if out_path:
        click.echo(f"plan written to {out_path}")
    else:
        click.echo(text, nl=False)
