import os

import pytest

DATA = os.path.join(os.path.dirname(__file__), "data")
ORACLE = os.path.join(DATA, "oracle", "scenarios")
SPEC_ORACLE = os.path.join(DATA, "oracle", "spec_scenarios")


@pytest.fixture
def oracle_dir():
    return ORACLE


# Test modules about what runs around the core (the pipeline's landing and staging, Dask clusters,
# packaging, the report, the SQL library, the README and the start-up): they replay inputs the
# core's own tests already cover, so the second CI pass over a debug build of the core (bounds and
# initialisation checks) deselects them with ``-m "not around_core"``.
AROUND_CORE = frozenset(
    "test_" + name + ".py" for name in (
        "all_or_nothing", "architecture", "fuzz_readers", "measured_runs", "packaging",
        "pipeline_cli", "pipeline_cluster", "pipeline_common", "pipeline_reads", "pipeline_run",
        "pipeline_spec", "pipeline_staging", "plaintable", "readme", "report", "report_capacity",
        "report_palette", "report_sweep", "sql_library", "startup", "toml_out", "trace_frames",
    )
)


_missing = sorted(n for n in AROUND_CORE if not os.path.exists(os.path.join(os.path.dirname(__file__), n)))
assert not _missing, f"AROUND_CORE names test modules that do not exist: {_missing}"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in AROUND_CORE:
            item.add_marker(pytest.mark.around_core)
