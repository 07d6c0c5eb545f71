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


def test_a_layer_count_no_memory_holds_is_refused_by_name(tmp_path):
    # Found by the fuzzer: a per-layer table of 2**31 - 1 entries took the machine's memory.
    import json
    import os

    from aisim.config.hfconfig import load_hf_config
    from aisim.errors import ConfigError

    with open(os.path.join(os.path.dirname(__file__), "data", "hf", "llama-3.1-8b.json"), encoding="utf-8") as fh:
        raw = json.load(fh)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(raw, num_hidden_layers=2**31 - 1)))
    with pytest.raises(ConfigError) as err:
        load_hf_config(path)
    assert "'num_hidden_layers'" in str(err.value) and "from 1 to 10,000, got 2147483647" in str(err.value)
    assert str(path) in str(err.value)
