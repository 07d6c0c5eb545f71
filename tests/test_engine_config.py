"""The validated engine configuration: one factory, one catalogue of keys, versions and group kinds."""

import dataclasses
import json
import os
import pickle

import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.config.engine import EngineConfig, TimeModel, engine_config_from_dict
from aisim.config.keys import ENGINE_KEYS, GROUP_KEYS, TIME_MODEL_KEYS
from aisim.config.readme import render_tables
from aisim.config.kvgroups import GROUP_DEFAULTS, GROUP_KINDS, KINDS, STATE_KINDS, expand_groups
from aisim.config.rule import catalog_cold_reason, probe_cold_reason, unmodeled_version_note
from aisim.config.versions import DEFAULT_VLLM_VERSION, RELEASES, SUPPORTED_VLLM_VERSIONS, release, rules_table
from aisim.errors import ConfigError

from conftest import ORACLE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FACTORY = ("an EngineConfig is built by engine_config_from_dict(raw, source) (or EngineConfig.from_dict), which "
           "applies the defaults and the configuration rules; change one with cfg.replace(**changes)")
PAGE = 2176 * 1024


def glm(**over):
    """A GLM-5.3-Flash deployment the grouped-prefix rule accepts."""
    cfg = {"model": "GLM-5.3-Flash", "vllm_version": "0.32.0", "num_gpu_blocks": 71, "block_size": 2176,
           "max_model_len": 131072, "max_num_batched_tokens": 8192, "prefix_match_unit": 2176,
           "kv_cache_groups": [
               {"type": "full", "page_size_bytes": PAGE, "prefix_cacheable": True},
               {"type": "ring", "page_size_bytes": PAGE, "prefix_cacheable": False},
               {"type": "kda", "count": 4, "page_size_bytes": PAGE, "prefix_cacheable": True,
                "prefill_checkpoint_blocks": 0}]}
    cfg.update(over)
    return cfg


# ---------------------------------------------------------------- one factory


def test_direct_construction_is_refused():
    for kw in ({"num_gpu_blocks": 600}, {}):
        with pytest.raises(TypeError) as exc:
            EngineConfig(**kw)
        assert str(exc.value) == FACTORY


def test_dataclasses_replace_is_refused():
    cfg = engine_config_from_dict({"num_gpu_blocks": 600})
    with pytest.raises(TypeError) as exc:
        dataclasses.replace(cfg, num_gpu_blocks=1)
    assert str(exc.value) == FACTORY


def test_from_dict_is_the_factory():
    raw = {"num_gpu_blocks": 600, "max_num_seqs": 8}
    assert EngineConfig.from_dict(raw, "x.toml") == engine_config_from_dict(raw, "x.toml")


def test_replace_validates_again_and_declares_the_change():
    cfg = engine_config_from_dict({"num_gpu_blocks": 600, "max_num_seqs": 8}, source="engine.toml")
    new = cfg.replace(policy="priority", max_num_seqs=16)
    assert (new.policy, new.max_num_seqs, new.num_gpu_blocks) == ("priority", 16, 600)
    assert new.declared == {"num_gpu_blocks", "max_num_seqs", "policy"}
    assert cfg.max_num_seqs == 8 and cfg.declared == {"num_gpu_blocks", "max_num_seqs"}
    with pytest.raises(ConfigError) as exc:
        cfg.replace(max_num_seqs=0)
    assert str(exc.value) == "'max_num_seqs' in engine.toml must be at least 1, got 0"
    with pytest.raises(ConfigError) as exc:
        cfg.replace(max_num_seqs=9000)
    assert str(exc.value) == ("'max_num_batched_tokens' (8192) in engine.toml must be at least "
                              "'max_num_seqs' (9000)")


def test_replace_refuses_what_the_grouped_prefix_rule_refuses():
    cfg = engine_config_from_dict(glm(), source="glm.toml")
    with pytest.raises(ConfigError) as exc:
        cfg.replace(max_num_batched_tokens=8190)
    assert str(exc.value) == (
        "grouped prefix caching refused in glm.toml: 'max_num_batched_tokens' (8190) must be a multiple of 4 "
        "for GLM-5.3-Flash prefix caching. Set enable_prefix_caching = false for a cold replay.")
    # The --vllm-version path: declaring a version without groups is refused as in a file.
    plain = engine_config_from_dict({"num_gpu_blocks": 600})
    with pytest.raises(ConfigError, match="'vllm_version' \\(0.31.0\\) selects the grouped KV-cache rules"):
        plain.replace(vllm_version="0.31.0")
    assert cfg.replace(vllm_version="0.31.0").version == "0.31.0"
    with pytest.raises(ConfigError, match="'num_gpu_blocks' \\(40\\) leaves 39 usable blocks"):
        cfg.replace(num_gpu_blocks=40)


def test_replace_keeps_a_key_spelt_in_cache_extra_consistent():
    cfg = engine_config_from_dict({"num_gpu_blocks": 600, "cache_extra": {"prefix_cache_retention_interval": 4}})
    new = cfg.replace(prefix_cache_retention_interval=8)
    assert new.prefix_cache_retention_interval == 8 and new.cache_extra == {"prefix_cache_retention_interval": 8}


def test_kv_cache_bytes_gives_the_block_count_inside_the_factory():
    raw = glm(num_gpu_blocks=None, kv_cache_bytes=71 * PAGE + 5)
    del raw["num_gpu_blocks"]
    cfg = engine_config_from_dict(raw)
    assert cfg.num_gpu_blocks == 71 and "num_gpu_blocks" not in cfg.declared
    assert cfg.replace(kv_cache_bytes=80 * PAGE).num_gpu_blocks == 80
    with pytest.raises(ConfigError, match="'num_gpu_blocks' \\(70\\) leaves 69 usable blocks"):
        cfg.replace(kv_cache_bytes=70 * PAGE)


def test_pickle_round_trip():
    cfg = engine_config_from_dict(glm(time_model={"kind": "linear", "base_s": 0.02}), source="glm.toml")
    back = pickle.loads(pickle.dumps(cfg))
    assert back == cfg and back.to_dict() == cfg.to_dict()
    assert (back.declared, back.raw, back.source) == (cfg.declared, cfg.raw, "glm.toml")
    assert back.replace(max_num_seqs=64).max_num_seqs == 64


def test_to_dict_leaves_out_the_bookkeeping():
    d = engine_config_from_dict({"num_gpu_blocks": 600}).to_dict()
    assert list(d) == [k.name for k in ENGINE_KEYS] + ["resolved_groups"]


# ---------------------------------------------------------------- one catalogue


def test_dataclass_defaults_come_from_the_catalogue():
    names = [f.name for f in dataclasses.fields(EngineConfig)]
    assert names == [k.name for k in ENGINE_KEYS] + ["declared", "raw", "source"]
    cfg = engine_config_from_dict({"num_gpu_blocks": 600})
    derived = {"num_gpu_blocks", "cache_extra", "scheduler_extra", "time_model", "block_size"}
    for k in ENGINE_KEYS:
        if k.name not in derived:
            assert getattr(cfg, k.name) == k.default, k.name
    # The block size is the release's (aisim.config.versions.Release.block_size).
    assert cfg.block_size == release(cfg.version).block_size
    assert cfg.cache_extra == {} and cfg.scheduler_extra == {} and cfg.time_model == engine_config_from_dict({"num_gpu_blocks": 600}).time_model
    assert [f.name for f in dataclasses.fields(TimeModel)] == [k.name for k in TIME_MODEL_KEYS]
    # frontend is derived from the kind: off for the default linear model.
    assert dataclasses.asdict(cfg.time_model) == {**{k.name: k.default for k in TIME_MODEL_KEYS}, "frontend": False}


def test_configuration_tables_are_rendered_from_the_catalogue():
    with open(os.path.join(ROOT, "docs", "configuration.md"), encoding="utf-8") as fh:
        readme = fh.read()
    tables = render_tables()
    assert tables in readme
    assert "| `max_model_len` | 32768 | as in vLLM's `SchedulerConfig` (1 to 2147483647) |" in tables
    assert "| `vllm_version` | `0.34.0` (one of `0.31.0`, `0.32.0`, `0.33.0`, `0.34.0`) |" in tables
    assert "| `ring` | a ring buffer of one block | — | false |" in tables


def test_group_kinds_are_one_table():
    assert GROUP_KINDS == {"full": 0, "sliding_window": 1, "chunked_local": 2, "mamba": 3, "gdn": 3, "kda": 3,
                           "conv": 3, "ring": 4}
    assert STATE_KINDS == ("mamba", "gdn", "kda", "conv")
    assert {k.name: k.required for k in KINDS if k.required} == {"sliding_window": "sliding_window",
                                                                 "chunked_local": "attention_chunk_size"}
    assert list(GROUP_DEFAULTS) == [k.name for k in GROUP_KEYS]
    assert expand_groups([{"type": "ring"}])[0] == {
        "type": "ring", "block_size": None, "count": 1, "sliding_window": None, "attention_chunk_size": None,
        "prefix_cacheable": None, "num_speculative_blocks": None, "prefill_checkpoint_blocks": 0,
        "prefill_checkpoint_alignment": None, "page_size_bytes": None, "num_layers": 1}


@pytest.mark.parametrize("group, message", [
    ({"type": "sliding_window"},
     "'kv_cache_groups[0].sliding_window' in g.toml is required for a sliding_window group"),
    ({"type": "chunked_local"},
     "'kv_cache_groups[0].attention_chunk_size' in g.toml is required for a chunked_local group"),
    ({"type": "full", "num_speculative_blocks": -1},
     "'kv_cache_groups[0].num_speculative_blocks' in g.toml must be an integer >= 0, got -1"),
    ({"type": "full", "num_layers": 0}, "'kv_cache_groups[0].num_layers' in g.toml must be an integer >= 1, got 0"),
    ({"type": "lstm"}, "'kv_cache_groups[0].type' in g.toml must be one of full, sliding_window, chunked_local, "
                       "mamba, gdn, kda, conv, ring, got 'lstm'"),
])
def test_group_validation_reads_the_tables(group, message):
    with pytest.raises(ConfigError) as exc:
        engine_config_from_dict({"num_gpu_blocks": 600, "kv_cache_groups": [group]}, source="g.toml")
    assert str(exc.value) == message


# ---------------------------------------------------------------- one list of versions


def test_versions_are_read_from_one_place():
    assert SUPPORTED_VLLM_VERSIONS == tuple(r.version for r in RELEASES) == ("0.31.0", "0.32.0", "0.33.0", "0.34.0")
    assert DEFAULT_VLLM_VERSION == RELEASES[-1].version
    assert engine_config_from_dict({"num_gpu_blocks": 600}).version == DEFAULT_VLLM_VERSION
    with pytest.raises(ConfigError) as exc:
        engine_config_from_dict({"num_gpu_blocks": 600, "vllm_version": "0.30.0"})
    assert str(exc.value) == "'vllm_version' must be one of 0.31.0, 0.32.0, 0.33.0, 0.34.0, got '0.30.0'"
    option = next(p for p in main.commands["replay"].params if p.name == "vllm_version")
    assert tuple(option.type.choices) == SUPPORTED_VLLM_VERSIONS
    res = CliRunner().invoke(main, ["replay", "--engine", "x.json", "--trace", "t.jsonl", "--vllm-version", "0.30.0"])
    assert res.exit_code == 2 and "'0.30.0' is not one of '0.31.0', '0.32.0', '0.33.0', '0.34.0'" in res.output


def test_every_oracle_scenario_is_recorded_on_every_supported_version():
    for name in sorted(os.listdir(ORACLE)):
        logs = sorted(f for f in os.listdir(os.path.join(ORACLE, name)) if f.startswith("vllm-"))
        # Every supported release from the first one that has the scenario's settings on (a setting
        # only newer releases know is recorded for those alone); logs of releases aisim does not
        # model yet may lie beside them.
        first = next(i for i, v in enumerate(SUPPORTED_VLLM_VERSIONS) if f"vllm-{v}.jsonl" in logs)
        assert {f"vllm-{v}.jsonl" for v in SUPPORTED_VLLM_VERSIONS[first:]} <= set(logs), name
        with open(os.path.join(ORACLE, name, "config.json")) as fh:
            assert first == 0 or "scheduler_extra" in json.load(fh), name


def test_docs_name_the_supported_versions():
    # The switch table of every release, generated from aisim/config/versions.py.
    with open(os.path.join(ROOT, "docs", "vllm-version-rules.md"), encoding="utf-8") as fh:
        text = fh.read()
    assert rules_table() in text
    assert rules_table().startswith("| switch | " + " | ".join(SUPPORTED_VLLM_VERSIONS) + " |")


# ---------------------------------------------------------------- plan decisions live in the rule


def test_plan_decisions_are_the_rule_modules():
    assert unmodeled_version_note("0.32.0") is None
    assert unmodeled_version_note("0.30.0") == ("vllm_version 0.30.0 is not modeled (only 0.31.0, 0.32.0, 0.33.0, "
                                                "0.34.0); the replay follows 0.34.0's scheduler")
    assert probe_cold_reason(ran_with_prefix_caching=False, grouped=True, hash_block=16, version="0.32.0") == \
        "the probed engine ran with prefix caching off"
    assert probe_cold_reason(ran_with_prefix_caching=True, grouped=True, hash_block=None, version="0.32.0") == \
        "the probe did not record hash_block_size_tokens"
    assert probe_cold_reason(ran_with_prefix_caching=True, grouped=True, hash_block=16, version="0.30.0") == \
        "grouped prefix caching is modeled for vLLM 0.31.0, 0.32.0, 0.33.0 and 0.34.0 only"
    assert probe_cold_reason(ran_with_prefix_caching=True, grouped=False, hash_block=None, version="0.30.0") is None
    assert catalog_cold_reason(False) is None
    assert catalog_cold_reason(True) == ("grouped prefix caching needs probe evidence of the hash block; run aisim "
                                         "plan --probe")


def test_catalog_layers_are_group_kinds():
    from aisim.config.catalog import MODELS
    from aisim.config.kvgroups import KIND

    assert {layer.kind for m in MODELS.values() for layer in m.layers} <= set(KIND)
