"""Fuzzed readers: any bytes, any value of the wrong shape, read to a valid object or one InputError naming where.

A few examples per reader, derandomized (the same examples every run), so CI stays fast and
deterministic; ``benchmarks/fuzz_readers.py --examples 10000`` runs the same targets long.
"""

import tempfile

import pytest
from hypothesis import HealthCheck, given, settings

from fuzzing import targets

EXAMPLES = 25
TARGETS = {t.name: t for t in targets()}


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_a_reader_returns_or_raises_the_input_error(name):
    target = TARGETS[name]
    with tempfile.TemporaryDirectory() as workdir:
        @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(target.strategy)
        def check(value):
            target.check(value, workdir)

        check()
