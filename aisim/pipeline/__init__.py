"""Batch pipelines: traces of many models -> parallel replays (Dask) -> DuckDB.

==================  =====================================================================
module              what it does
==================  =====================================================================
``spec``            the TOML spec (strict), input fingerprints and the run key
``reads``           the read tasks: files in blocks, staged per model
``merge``           a shard's trace: its model's staged parts merged in arrival order, streamed
``shards``          the shard tasks: replay a shard, stage its rows
``graph``           the Dask graph and the schedulers (sync, LocalCluster, an address)
``staging``         where a run's files are staged (a directory or an fsspec URL)
``landing``         one DuckDB transaction per run from the staged files; lock errors, reclaiming space
``run``             :func:`run_pipeline`, :func:`land_run`, progress and the end-of-run summary
``cli``             ``aisim pipeline run|land|check``
==================  =====================================================================

The SQL (schema, views, named queries) lives in :mod:`aisim.sql`.
"""

from aisim.errors import PipelineError, SpecError


def __getattr__(name):
    # The spec module is imported when a spec is read, not when ``aisim`` starts.
    if name in ("PipelineSpec", "load_spec", "spec_from_dict"):
        from aisim.pipeline import spec

        return getattr(spec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run_pipeline(spec, **kwargs):
    """Run a pipeline spec and land its results; see :func:`aisim.pipeline.run.run_pipeline`."""
    from aisim.pipeline.run import run_pipeline as _run

    return _run(spec, **kwargs)


__all__ = ["PipelineError", "PipelineSpec", "SpecError", "load_spec", "run_pipeline", "spec_from_dict"]
