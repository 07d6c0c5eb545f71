"""``--set key=value``: one engine or deployment key changed from the command line.

A key is dotted into the configuration as a file writes it: ``max_num_seqs=128``,
``enable_prefix_caching=false``, ``time_model.tp=2``, ``speculative.num_speculative_tokens=3``,
``kv_offload.cpu_blocks=20000`` (a tier sized in blocks replaces one sized in GiB, and the reverse);
``deployment.replicas=4``, ``deployment.router=kv_aware``, ``deployment.router.view_delay_s=0.05``,
``deployment.prefill.replicas=2``.  Keys and their types come from the key catalogue
(:mod:`aisim.config.keys`): a key it does not hold is refused with the key named and the section's
keys listed, and a value is read as its key's default is typed (``true``/``false`` for a flag, an
integer, a number; a key without a typed default takes a number, ``true``/``false``, ``null``, a
JSON list or mapping, else the text).  The changed configuration is validated again by the one
factory of its kind (:func:`aisim.config.engine.engine_config_from_dict`,
:func:`aisim.config.deployment.parse_deployment`), so a value the rules refuse is refused as a
file's would be.
"""

from __future__ import annotations

import copy
import json

from aisim.config.keys import (ACCEPTANCE_KEYS, DEPLOYMENT_KEYS, DRAFTER_COST_KEYS, ENGINE_KEYS, LINK_KEYS,
                               OFFLOAD_KEYS, POOL_KEYS, ROUTER_KEYS, SPECULATIVE_KEYS, TIME_MODEL_KEYS)
from aisim.errors import ConfigError

# Dotted section -> its catalogue.  A key of a section is ``section.key``.
ENGINE_SECTIONS = {
    "": ENGINE_KEYS,
    "time_model": TIME_MODEL_KEYS,
    "speculative": SPECULATIVE_KEYS,
    "speculative.acceptance": ACCEPTANCE_KEYS,
    "speculative.drafter_cost": DRAFTER_COST_KEYS,
    "kv_offload": OFFLOAD_KEYS,
}
DEPLOYMENT_SECTIONS = {
    "deployment": DEPLOYMENT_KEYS,
    "deployment.router": ROUTER_KEYS,
    "deployment.prefill": POOL_KEYS,
    "deployment.prefill.router": ROUTER_KEYS,
    "deployment.decode": POOL_KEYS,
    "deployment.decode.router": ROUTER_KEYS,
    "deployment.link": LINK_KEYS,
}
# Keys whose value is a list or a table of its own: set in the file, not one by one.
_WHOLE = {"kv_cache_groups", "cache_extra", "plan_notes"}

SET_HELP = ("Change one engine or deployment key, dotted as the file writes it: max_num_seqs=128, "
            "time_model.tp=2, deployment.replicas=4, deployment.router=kv_aware (repeatable; the key "
            "catalogue types the value and refuses unknown keys).")


def set_option():
    """The repeatable ``--set KEY=VALUE`` option of a command that takes an engine or deployment
    (parameter ``sets``)."""
    import click

    return click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=SET_HELP)


def parse_sets(pairs) -> list:
    """``["key=value", ...]`` as ``[(key, typed value), ...]`` in order.

    Raises
    ------
    ConfigError
        A pair without ``=``, a key given twice, an unknown key (named, with its section's keys) or a
        value of the wrong type.
    """
    out, seen = [], set()
    for pair in pairs or ():
        key, sep, text = str(pair).partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {pair!r}: give KEY=VALUE, e.g. max_num_seqs=128")
        if key in seen:
            raise ConfigError(f"--set {key} is given twice")
        seen.add(key)
        out.append((key, _typed(key, text.strip(), _catalogue_key(key))))
    return out


def _catalogue_key(key: str):
    """The :class:`~aisim.config.keys.ConfigKey` of dotted ``key``; ConfigError naming it when unknown."""
    section, _, name = key.rpartition(".")
    sections = DEPLOYMENT_SECTIONS if key.startswith("deployment") else ENGINE_SECTIONS
    if key == "deployment":
        raise ConfigError("--set deployment: give one of its keys, e.g. deployment.replicas=4")
    if section not in sections:
        known = ", ".join(s for s in sections if s)
        raise ConfigError(f"--set {key}: unknown key '{key}'; keys are top-level engine keys or keys of "
                          f"{known}")
    keys = sections[section]
    for k in keys:
        if k.name == name:
            if k.name in _WHOLE and section == "":
                raise ConfigError(f"--set {key}: '{key}' is a list or table; set it in the configuration file")
            return k
    where = f"'{section}'" if section else "the engine"
    raise ConfigError(f"--set {key}: unknown key '{key}'; the keys of {where}: {', '.join(k.name for k in keys)}")


def _typed(key: str, text: str, ck):
    """``text`` as the type of ``ck``'s default."""
    d = ck.default
    low = text.lower()
    if isinstance(d, bool):
        if low not in ("true", "false"):
            raise ConfigError(f"--set {key}={text}: '{key}' is true or false")
        return low == "true"
    if (isinstance(d, int) and not isinstance(d, bool)) or (d is None and ck.low is not None):
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"--set {key}={text}: '{key}' is an integer") from None
    if isinstance(d, float):
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"--set {key}={text}: '{key}' is a number") from None
    if isinstance(d, str):
        return text
    # No typed default: a JSON value (number, true/false, null, list, mapping), else the text.
    try:
        return json.loads(text)
    except ValueError:
        return text


def split_sets(sets: list) -> tuple:
    """``(engine sets, deployment sets)`` of :func:`parse_sets`'s list."""
    return ([(k, v) for k, v in sets if not k.startswith("deployment.")],
            [(k, v) for k, v in sets if k.startswith("deployment.")])


# A KV offload tier is sized one way: setting one size drops the other (aisim.config.offload.parse_offload).
_TIER_SIZES = {"kv_offload.cpu_blocks": "size_gib", "kv_offload.size_gib": "cpu_blocks"}


def _put(tree: dict, dotted: str, value) -> None:
    *path, last = dotted.split(".")
    node = tree
    for p in path:
        nxt = node.get(p)
        if isinstance(nxt, str) and p == "router":  # a router given by name becomes a mapping with its kind
            nxt = {"kind": nxt}
        if not isinstance(nxt, dict):
            nxt = {}
        node[p] = nxt = dict(nxt)
        node = nxt
    if dotted in _TIER_SIZES:
        node.pop(_TIER_SIZES[dotted], None)
    if last == "router" and isinstance(node.get("router"), dict) and isinstance(value, str):
        node["router"] = {**node["router"], "kind": value}  # a new kind keeps the router's other keys
    else:
        node[last] = value


def changed_raw(raw: dict, sets: list) -> dict:
    """A copy of an engine's raw keys (as its file writes them) with the engine keys of ``sets`` changed;
    not validated (:func:`apply_engine` validates)."""
    raw = copy.deepcopy(raw)
    for key, value in split_sets(sets)[0]:
        _put(raw, key, value)
    return raw


def apply_engine(engine, sets: list):
    """``engine`` (an :class:`~aisim.config.engine.EngineConfig`) with the engine keys of ``sets`` changed,
    validated again (relative paths stay relative to its file)."""
    from aisim.config.engine import engine_config_from_dict

    sets = split_sets(sets)[0]
    if not sets:
        return engine
    raw = copy.deepcopy(engine.raw)
    extra = raw.get("cache_extra")
    for key, value in sets:
        _put(raw, key, value)
        if isinstance(extra, dict) and key in extra:  # one value for a key spelt both ways
            extra[key] = value
    return engine_config_from_dict(raw, engine.source)


def apply_deployment(deployment, sets: list, source: str | None = None):
    """``deployment`` (or none: one replica behind round-robin) with the ``deployment.`` keys of ``sets``
    changed, validated again; ``deployment`` itself when ``sets`` changes none.  Engine keys of ``sets``
    are refused when a pool of a disaggregated ``deployment`` runs its own engine file: they change the
    deployment's engine, which that pool does not run."""
    engine_sets, sets = split_sets(sets)
    for name in ("prefill", "decode"):
        pool = getattr(deployment, name, None)
        if engine_sets and pool is not None and pool.engine is not None:
            raise ConfigError(f"--set {describe_sets(engine_sets)} changes the deployment's engine, but its {name} "
                              f"pool runs its own engine ({pool.engine}); set the key in that file, or drop the "
                              f"pool's 'engine' so that it runs the changed one")
    if not sets:
        return deployment
    from aisim.config.deployment import parse_deployment

    raw = {"deployment": deployment.to_dict() if deployment is not None else {}}
    for key, value in sets:
        _put(raw, key, value)
    return parse_deployment(raw["deployment"], source=source)


def apply_to_sweep(spec, sets: list) -> None:
    """Change a sweep spec's base engine (``spec.base``, its raw keys; validated again with its file) and
    deployment in place; a key the grid varies is refused (the grid sets it for every candidate)."""
    from aisim.config.engine import engine_config_from_dict

    engine_sets, deployment_sets = split_sets(sets)
    for key, _ in engine_sets:
        if key in getattr(spec, "grid", {}):
            raise ConfigError(f"--set {key}: the sweep's grid varies '{key}'; change the grid in the spec")
    if engine_sets:
        raw = copy.deepcopy(spec.base)
        for key, value in engine_sets:
            _put(raw, key, value)
        engine_config_from_dict(raw, spec.base_path)  # refused as a file's value would be
        spec.base = raw
    spec.deployment = apply_deployment(spec.deployment, sets)


def describe_sets(sets: list) -> str:
    """``max_num_seqs=128, deployment.replicas=4`` (JSON values), for titles and notes."""
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in sets)
