"""No inert option: a key that does not act on the chosen kind (router, time model) is refused with the
reason, in a file, a spec and from Python alike (the catalogue's ``kinds``, aisim/config/keys.py)."""

import json

import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.config.deployment import ROUTERS, parse_deployment
from aisim.config.engine import engine_config_from_dict
from aisim.config.keys import GROUP_KEYS, ROUTER_KEYS, TIME_MODEL_KEYS
from aisim.errors import ConfigError

ENGINE = {"num_gpu_blocks": 64, "block_size": 16, "max_model_len": 512, "max_num_batched_tokens": 512}


@pytest.mark.parametrize("key", [k for k in ROUTER_KEYS if k.kinds is not None], ids=lambda k: k.name)
def test_every_router_option_is_refused_on_every_router_it_does_not_act_on(key):
    for kind in ROUTERS:
        raw = {"replicas": 2, "router": {"kind": kind, key.name: key.default}}
        if kind in key.kinds:
            assert parse_deployment(raw).options[key.name] == key.default
            continue
        with pytest.raises(ConfigError) as err:
            parse_deployment(raw, source="d.toml")
        assert str(err.value) == (f"'deployment.router.{key.name}' in d.toml does not apply to the {kind} router "
                                  f"(it applies to {', '.join(key.kinds)}); remove it or change "
                                  "'deployment.router.kind'")


def test_a_pool_s_router_option_is_refused_by_its_pool_s_key():
    raw = {"prefill": {"router": {"kind": "round_robin", "overlap_weight": 2.0}}, "decode": {},
           "link": {"bandwidth_gb_s": 10}}
    with pytest.raises(ConfigError, match=r"^'deployment\.prefill\.router\.overlap_weight' does not apply to the "
                                          r"round_robin router \(it applies to kv_aware, session_affinity\)"):
        parse_deployment(raw)


def test_a_deployment_writes_back_only_the_options_its_router_acts_on():
    # to_dict() is what a sweep's best deployment file and a run key hold: it loads back.
    for kind in ROUTERS:
        d = parse_deployment({"replicas": 2, "router": kind})
        written = d.to_dict()["router"]
        assert set(written) == {"kind"} | {k.name for k in ROUTER_KEYS if k.kinds and kind in k.kinds}
        assert parse_deployment(d.to_dict()) == d


@pytest.mark.parametrize("key", [k for k in TIME_MODEL_KEYS if k.kinds is not None], ids=lambda k: k.name)
def test_every_time_model_constant_is_refused_on_a_kind_it_does_not_shape(key):
    value = {"gpu": "H100", "model": "llama-3.1-8b", "dtype": "bf16", "path": "p.csv",
             "triton_group_quant": True}.get(key.name, 0.5)
    for kind in ("linear", "roofline", "table"):
        if kind in key.kinds:
            continue
        tm = {"kind": kind, key.name: value}
        with pytest.raises(ConfigError) as err:
            engine_config_from_dict({**ENGINE, "time_model": tm}, source="e.json")
        assert str(err.value) == (f"'time_model.{key.name}' in e.json does not apply to the {kind} time model "
                                  f"(it applies to {', '.join(key.kinds)}); remove it or change 'time_model.kind'")


def test_replay_refuses_a_round_robin_deployment_with_a_kv_aware_option(tmp_path):
    (tmp_path / "e.json").write_text(json.dumps(ENGINE))
    (tmp_path / "d.toml").write_text('[deployment]\nreplicas = 2\nrouter = { kind = "round_robin", seed = 3 }\n')
    (tmp_path / "t.jsonl").write_text('{"request_id": "a", "prompt_len": 10, "max_tokens": 2, "arrival_time": 0.5}\n')
    r = CliRunner().invoke(main, ["replay", "--trace", str(tmp_path / "t.jsonl"), "--engine", str(tmp_path / "e.json"),
                                  "--deployment", str(tmp_path / "d.toml")])
    assert r.exit_code == 2, r.output
    assert r.output == (f"error: 'deployment.router.seed' in {tmp_path / 'd.toml'} does not apply to the round_robin "
                        "router (it applies to random); remove it or change 'deployment.router.kind'\n")


def test_config_validate_refuses_a_linear_model_with_a_roofline_constant(tmp_path):
    (tmp_path / "e.json").write_text(json.dumps({**ENGINE, "time_model": {"base_s": 0.01, "overhead_s": 0.001}}))
    r = CliRunner().invoke(main, ["config", "validate", str(tmp_path / "e.json")])
    assert r.exit_code == 2, r.output
    assert r.output == (f"error: 'time_model.overhead_s' in {tmp_path / 'e.json'} does not apply to the linear time "
                        "model (it applies to roofline); remove it or change 'time_model.kind'\n")


@pytest.mark.parametrize("key", [k for k in GROUP_KEYS if k.kinds is not None], ids=lambda k: k.name)
def test_every_group_key_is_refused_on_a_group_type_it_does_not_shape(key):
    raw = {**ENGINE, "enable_prefix_caching": False, "kv_cache_groups": [{"type": "full", key.name: 1}]}
    with pytest.raises(ConfigError) as err:
        engine_config_from_dict(raw, source="e.json")
    assert str(err.value) == (f"'kv_cache_groups[0].{key.name}' in e.json does not apply to the full group (it "
                              f"applies to {', '.join(key.kinds)}); remove it or change 'kv_cache_groups[0].type'")


def test_the_state_group_kinds_are_the_catalogue_s():
    from aisim.config.keys import STATE_GROUPS
    from aisim.config.kvgroups import STATE_KINDS

    assert STATE_GROUPS == STATE_KINDS


def test_a_reader_option_the_guessed_format_does_not_take_is_refused(tmp_path):
    # No format: the .jsonl file is guessed oracle, whose reader takes no unit_tokens (Mooncake's).
    (tmp_path / "e.json").write_text(json.dumps(ENGINE))
    (tmp_path / "t.jsonl").write_text('{"request_id": "a", "prompt_len": 10, "max_tokens": 2, "arrival_time": 0.5}\n')
    (tmp_path / "c.toml").write_text('name = "c"\ndatabase = "c.duckdb"\nengine = "e.json"\n[trace]\n'
                                     'path = "t.jsonl"\noptions = { unit_tokens = 64 }\n[slo]\nttft_p99_s = 1\n[rate]\n')
    r = CliRunner().invoke(main, ["capacity", str(tmp_path / "c.toml")])
    assert r.exit_code == 2
    assert r.output == (f"error: {tmp_path / 't.jsonl'}: the 'oracle' trace reader takes no option 'unit_tokens' "
                        "(the format is guessed from the file; give format)\n")
