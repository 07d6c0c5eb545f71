"""A pipeline spec's ``[capacity]`` section: a capacity search on every shard, in the run.

::

    [capacity]                      # the keys of a capacity spec's question (aisim.capacity.spec)
    price_per_gpu_hour = 2.5        # optional
    [capacity.slo]
    ttft_s = 2.0
    attainment = 0.95
    [capacity.rate]                 # the highest rate within the SLO, or
    by = "poisson_rate"
    # [capacity.fleet]              # the smallest deployment that serves the shard's trace
    # max_replicas = 16

Each shard of the run (a model on one of its engines) is searched on its model's merged trace
(the sources' rows in the window, as traced: ``[replay]``'s load transform is the replay's, not
the search's) with its engine, through its deployment when the engine entry has one (a
``[capacity.fleet]`` search starts from it).  The points land in ``capacity_points`` in the run's
landing transaction, tagged with the run (``run_id``), the shard and the model.  The shards are
replayed as usual too.

Importing :mod:`aisim.capacity` plugs the section into the pipeline
(:mod:`aisim.pipeline.sections`): the pipeline imports nothing of this room.
"""

from __future__ import annotations

from aisim.errors import ConfigError

KEY = "capacity"
TABLE = "capacity_points"


def parse_section(raw, where: str, spec: dict):
    """Validate a pipeline spec's ``[capacity]`` table (:func:`aisim.capacity.spec.question_from_dict`).

    Parameters
    ----------
    raw : dict
    where : str
        `` in FILE``, appended to messages.
    spec : dict
        The rest of the validated spec: ``replay`` (its options) and ``deployments``.

    Returns
    -------
    aisim.capacity.spec.Question

    Raises
    ------
    ConfigError
        Naming the key (``capacity.rate.rel_tol`` ...) and the file.
    """
    from aisim.capacity.spec import QUESTION_KEYS, question_from_dict

    if not isinstance(raw, dict):
        raise ConfigError(f"'{KEY}'{where} must be a table of {', '.join(QUESTION_KEYS)}")
    for k in raw:
        if k not in QUESTION_KEYS:
            raise ConfigError(f"unknown key '{KEY}.{k}'{where}; known keys: {', '.join(QUESTION_KEYS)}")
    question = question_from_dict(raw, where, prefix=f"{KEY}.")
    if spec["replay"].get("closed_loop"):
        raise ConfigError(f"'{KEY}'{where} searches along the request rate; a closed loop ('replay.closed_loop') "
                          "paces each turn by the previous one and has no rate to search")
    if question.question == "deployment" and question.params["splits"]:
        for d in spec["deployments"]:
            for e in d.engines:
                if e.deployment is None or not e.deployment.disaggregated:
                    raise ConfigError(f"'{KEY}.fleet.splits'{where} need a disaggregated deployment (its pools and "
                                      f"link) on every engine entry; '{d.model}/{e.name}' has none")
    return question


def search_shard(desc: dict, question, trace):
    """Run ``question`` on one shard's trace; its points as a ``capacity_points`` table.

    Parameters
    ----------
    desc : dict
        The shard's search task (:func:`aisim.pipeline.shards.run_search`): ``run_id``,
        ``shard_id``, ``model``, ``engine``, ``engine_config``, ``deployment``.
    question : aisim.capacity.spec.Question
    trace : pyarrow.Table
        The shard's merged trace.

    Returns
    -------
    pyarrow.Table
    """
    import pyarrow as pa

    from aisim.capacity.search import highest_rate, smallest_deployment
    from aisim.columns import CAPACITY_POINTS

    search = highest_rate if question.question == "rate" else smallest_deployment
    result = search(trace, desc["engine_config"], question.slo, deployment=desc["deployment"],
                    price_per_gpu_hour=question.price_per_gpu_hour, name=f"{desc['model']}/{desc['engine']}",
                    tags={"run_id": desc["run_id"], "shard_id": desc["shard_id"], "model": desc["model"]},
                    **question.params)
    names = CAPACITY_POINTS.names
    return pa.Table.from_pylist([dict(zip(names, row)) for row in result.rows()],
                                schema=CAPACITY_POINTS.arrow_schema())


def plug() -> None:
    """Plug ``[capacity]`` into pipeline specs (done when :mod:`aisim.capacity` is imported)."""
    from aisim.pipeline.sections import Section, register

    register(Section(key=KEY, table=TABLE, parse=parse_section, task=search_shard))
