"""TOML written by aisim reads back to what was written: any text, any key, nested tables."""

import os
import tomllib

import pytest

from aisim.config.engine import load_engine_config
from aisim.config.toml_out import dumps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("doc", [
    {"model": "Qwen3-Next-80B — “hybrid”", "note": "naïve 日本語 \"quoted\" \\ back\nslash\ttab"},
    {"cache.extra": 1, "a b": "spaced key", "ключ": True, "": "empty key"},
    {"outer": {"inner": {"deepest": {"x": 1.5, "y": [1, 2, 3]}}, "after": "z"}},
    {"kv_cache_groups": [{"type": "full", "page_size_bytes": 1048576, "prefix_cacheable": True},
                         {"type": "mamba", "prefill_checkpoint_blocks": 0, "extra": {"k.v": "x"}}]},
    {"floats": [0.1, 1e-9, 123456789.125, float("inf")], "nested": [[1, 2], ["a"]], "empty": []},
])
def test_round_trip(doc):
    assert tomllib.loads(dumps(doc)) == doc


def test_none_values_are_left_out_at_every_depth():
    doc = {"a": None, "b": 1, "t": {"c": None, "d": "x"}, "groups": [{"type": "full", "window": None}]}
    assert tomllib.loads(dumps(doc)) == {"b": 1, "t": {"d": "x"}, "groups": [{"type": "full"}]}


def test_header_comments_come_first_and_keys_keep_their_order():
    text = dumps({"zeta": 1, "alpha": {"y": 2, "b": 3}, "mid": "m"},
                 header_comments=["Engine configuration planned by aisim.", "größer\nzweite Zeile"])
    assert text == ('# Engine configuration planned by aisim.\n# größer\n# zweite Zeile\n\n'
                    'zeta = 1\nmid = "m"\n\n[alpha]\ny = 2\nb = 3\n')


def test_an_engine_configuration_written_as_toml_loads_back_the_same(tmp_path):
    cfg = load_engine_config(os.path.join(ROOT, "examples", "qwen3-next-80b.json"))
    notes = ["best of 3 candidates — ünïcode", "knobs {\"max_num_seqs\": 64}"]
    path = tmp_path / "best.toml"
    path.write_text(dumps(cfg.replace(plan_notes=notes).raw, header_comments=notes), encoding="utf-8")
    again = load_engine_config(path)
    assert again.to_dict() == cfg.replace(plan_notes=notes).to_dict()
    assert len(again.raw["kv_cache_groups"]) == 2
