"""The example engines are what ``aisim plan`` writes today, so the demo runs today's defaults."""

import json
import os

import pytest
from click.testing import CliRunner

from aisim.cli import main

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
PLAN = ["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--format", "json"]


@pytest.mark.parametrize("name, extra", [("engine.json", []),
                                         ("engine-nocache.json", ["--set", "enable_prefix_caching=false"])])
def test_an_example_engine_is_the_plan_its_readme_names(name, extra):
    # examples/README.md: engine.json is `aisim plan --model ... --gpu H100 --format json`, the no-cache
    # engine the same with `--set enable_prefix_caching=false`.
    out = CliRunner().invoke(main, PLAN + extra)
    assert out.exit_code == 0, out.output
    planned = json.loads(out.stdout)
    with open(os.path.join(EXAMPLES, name), encoding="utf-8") as fh:
        assert json.load(fh) == planned


def test_the_eagle_example_is_the_plan_plus_its_speculative_table():
    with open(os.path.join(EXAMPLES, "engine.json"), encoding="utf-8") as fh:
        base = json.load(fh)
    with open(os.path.join(EXAMPLES, "engine-eagle.json"), encoding="utf-8") as fh:
        eagle = json.load(fh)
    rest = ("speculative", "plan_notes")
    assert {k: v for k, v in eagle.items() if k not in rest} == {k: v for k, v in base.items() if k not in rest}
    assert eagle["plan_notes"][:-1] == base["plan_notes"]
    assert eagle["speculative"]["num_speculative_tokens"] == 3
