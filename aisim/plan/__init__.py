"""Plans: an engine configuration from probe evidence or from the model catalog.

:mod:`aisim.plan.planner` holds the planning; :mod:`aisim.plan.cli` the
``aisim plan`` command.
"""

__all__ = ["engine_toml", "load_probe", "offload_flags", "plan_from_model", "plan_from_probe"]


def __getattr__(name):
    # The planner (and through the group kinds, the compiled core and numpy) is imported when a
    # plan is made, not when ``aisim`` starts.
    if name in __all__:
        from aisim.plan import planner

        return getattr(planner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
