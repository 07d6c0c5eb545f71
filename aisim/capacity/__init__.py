"""Capacity: the highest request rate within an SLO, and the smallest deployment that serves a trace.

:mod:`aisim.capacity.slo` validates an SLO and judges replays against it (the one definition,
``sql/views/slo_attainment.sql``); :mod:`aisim.capacity.search` bisects along the rate or the
replicas; :mod:`aisim.capacity.spec` reads a capacity spec (TOML) and runs it;
:mod:`aisim.capacity.store` lands every evaluated point in ``capacity_points``;
:mod:`aisim.capacity.cli` is the ``aisim capacity`` command; :mod:`aisim.capacity.pipeline` is
a pipeline spec's ``[capacity]`` section, plugged into the pipeline when this package is imported.

The names below are imported from their modules when first used, so that ``aisim --help``
(which registers the command) loads no Arrow.
"""

import importlib

from aisim.capacity.pipeline import plug as _plug

_WHERE = {
    "CapacityResult": "search", "Point": "search", "highest_rate": "search",
    "monotone_notes": "search", "smallest_deployment": "search",
    "Slo": "slo", "slo_from_dict": "slo",
    "CapacitySpec": "spec", "Question": "spec", "capacity_from_dict": "spec", "load_capacity": "spec",
    "question_from_dict": "spec", "run_capacity": "spec",
    "land_points": "store",
}

__all__ = sorted(_WHERE)

_plug()


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module 'aisim.capacity' has no attribute {name!r}")
    return getattr(importlib.import_module(f"aisim.capacity.{_WHERE[name]}"), name)
