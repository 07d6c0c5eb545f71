"""Spec sections that rooms above the pipeline plug in: a question asked of every shard.

The pipeline runs a spec's shards; a room that imports the pipeline (and so cannot be imported
by it) can ask each shard something more, in the same run: :mod:`aisim.capacity` plugs in
``[capacity]`` (a capacity search on each shard's trace) when it is imported.  A section names

- its key in the spec, and how to validate that key's table (errors name the key and the file);
- the task that answers it for one shard: given the shard's description, the validated section
  and the shard's whole merged trace (an Arrow table), it returns the rows for its table;
- its table (:data:`aisim.columns.RUN_EXTRA_TABLES`), landed in the run's one transaction.

The section's task is a module-level function of the plugging room: a Dask worker imports it
when it unpickles the task, so the registry below need not exist in the worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from aisim.errors import SpecError

# The rooms that plug a section in, by key: named in the message when a spec has the key but the
# room was not imported (no import of them here: they import the pipeline).
KNOWN = {"capacity": "aisim.capacity"}


@dataclass(frozen=True)
class Section:
    """A spec section a room above the pipeline answers per shard.

    Attributes
    ----------
    key : str
        The spec's top-level key (``capacity``).
    table : str
        The table its rows land in, a key of :data:`aisim.columns.RUN_EXTRA_TABLES`.
    parse : callable
        ``parse(raw, where, spec) -> object``: the validated section (picklable, with a
        ``to_dict()`` the run key hashes); ``spec`` is the rest of the validated spec (its
        ``replay`` options, its deployments).  Raises an :class:`~aisim.errors.AisimError`
        naming ``<key>.<subkey>`` and ``where``.
    task : callable
        ``task(desc, section, trace) -> pyarrow.Table`` with the columns of ``table``: the
        answer for one shard (``desc``: ``run_id``, ``shard_id``, ``model``, ``engine``,
        ``engine_config``, ``deployment``).  A module-level function.
    """

    key: str
    table: str
    parse: object
    task: object


_SECTIONS: dict = {}


def register(section: Section) -> None:
    """Plug ``section`` in (again: the same key replaces it).

    Done when the plugging room is imported, on ``aisim``'s start-up path: nothing heavy is
    imported here (its table is checked against the catalogue when a run lands it).
    """
    _SECTIONS[section.key] = section


def section(key: str) -> Section | None:
    """The section plugged in under ``key``, or None."""
    return _SECTIONS.get(key)


def keys() -> tuple:
    """The keys plugged in, sorted."""
    return tuple(sorted(_SECTIONS))


def unplugged(key: str, where: str) -> SpecError:
    """The error for a known section key whose room was not imported."""
    return SpecError(f"'{key}'{where} is read by {KNOWN[key]}: import it before loading the spec "
                     f"(the aisim command does)")
