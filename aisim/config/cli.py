"""``aisim config``: check and show engine configurations."""

from __future__ import annotations

import click

from aisim.cli_util import CONTEXT_SETTINGS, console, echo_csv, echo_json, fail, flatten, format_option, new_table
from aisim.config.overrides import set_option


@click.group(context_settings=CONTEXT_SETTINGS)
def config():
    """Check and show engine configurations."""


def _load(file, sets):
    """FILE's engine configuration with ``--set``'s changes (engine keys only)."""
    from aisim.config.engine import load_engine_config
    from aisim.config.overrides import apply_engine, parse_sets, split_sets
    from aisim.errors import ConfigError

    overrides = parse_sets(sets)
    if split_sets(overrides)[1]:
        raise ConfigError("an engine file has no deployment: --set takes engine keys here")
    return apply_engine(load_engine_config(file), overrides)


@config.command()
@click.argument("file", type=click.Path(dir_okay=False))
@set_option()
def validate(file, sets):
    """Check FILE strictly (keys, values, the grouped-prefix rule)."""
    from aisim.config.kvgroups import expand_groups
    from aisim.errors import AisimError

    try:
        cfg = _load(file, sets)
    except AisimError as exc:
        fail(exc)
    groups = expand_groups(cfg.groups)
    kinds = ", ".join(g["type"] for g in groups)
    click.echo(f"{file}: valid. {len(groups)} KV-cache group(s) [{kinds}], {cfg.num_gpu_blocks} blocks, "
               f"prefix caching {'on' if cfg.enable_prefix_caching else 'off'}, vLLM {cfg.version} rules")


@config.command()
@click.argument("file", type=click.Path(dir_okay=False))
@set_option()
@format_option("toml", default="toml")
def show(file, sets, fmt):
    """Print FILE's resolved configuration, every default filled in."""
    from aisim.config.kvgroups import resolve_groups
    from aisim.errors import AisimError

    try:
        cfg = _load(file, sets)
    except AisimError as exc:
        fail(exc)
    d = cfg.to_dict()
    kw = resolve_groups(cfg)
    d["derived"] = {"hash_block_size": kw["hash_block_size"], "scheduler_block_size": kw["sched_block_size"],
                    "fine_grained_hits": kw["fine_grained"],
                    "cache_hit_alignment": kw["hash_block_size"] if kw["fine_grained"] else kw["sched_block_size"]}
    if cfg.speculative is not None:
        from aisim.config.speculative import scheduler_view

        view = scheduler_view(cfg)
        # What the scheduler derives from the speculative configuration (absent values: not in this release).
        d["derived"]["speculative"] = {k: v for k, v in view.items()
                                       if k not in ("method", "num_speculative_tokens", "acceptance", "async_scheduling")
                                       and v is not None}
    d["time_model"] = dict(d["time_model"])
    print_config(d, fmt, title=f"{file} resolved")


def print_config(d: dict, fmt: str, title: str | None = None) -> None:
    """An engine configuration dict on stdout as ``fmt``: toml, json, csv (key,value) or a key/value table."""
    from aisim.config.toml_out import dumps

    if fmt == "json":
        echo_json(d, sort_keys=True)
    elif fmt == "csv":
        echo_csv(["key", "value"], flatten(d))
    elif fmt == "table":
        t = new_table(("key", {"style": "bold"}), "value", title=title, title_justify="left")
        for k, v in flatten(d):
            t.add_row(k, "-" if v is None else str(v))
        console().print(t)
    else:
        click.echo(dumps(d), nl=False)
