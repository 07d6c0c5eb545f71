"""Plans: an engine configuration from probe evidence or from the model catalog.

:mod:`aisim.plan.planner` holds the planning; :mod:`aisim.plan.cli` the
``aisim plan`` command.
"""

from aisim.plan.planner import engine_toml, load_probe, plan_from_model, plan_from_probe

__all__ = ["engine_toml", "load_probe", "plan_from_model", "plan_from_probe"]
