"""Capacity: the highest request rate within an SLO, and the smallest deployment that serves a trace.

:mod:`aisim.capacity.slo` validates an SLO and judges replays against it (the one definition,
``sql/views/slo_attainment.sql``); :mod:`aisim.capacity.search` bisects along the rate or the
replicas; :mod:`aisim.capacity.spec` reads a capacity spec (TOML) and runs it;
:mod:`aisim.capacity.store` lands every evaluated point in ``capacity_points``;
:mod:`aisim.capacity.cli` is the ``aisim capacity`` command.
"""

from aisim.capacity.search import (CapacityResult, Point, deployment_gpus, highest_rate, monotone_notes,
                                   smallest_deployment)
from aisim.capacity.slo import Slo, slo_from_dict
from aisim.capacity.spec import CapacitySpec, capacity_from_dict, load_capacity, run_capacity
from aisim.capacity.store import land_points

__all__ = ["CapacityResult", "CapacitySpec", "Point", "Slo", "capacity_from_dict", "deployment_gpus",
           "highest_rate", "land_points", "load_capacity", "monotone_notes", "run_capacity", "slo_from_dict",
           "smallest_deployment"]
