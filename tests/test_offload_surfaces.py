"""KV offload where a user asks for it: vLLM's flags on ``aisim plan`` and ``aisim replay``, a probe that
ran the OffloadingConnector, ``--set kv_offload.*``, and deployments whose replicas keep their own tiers.

Block size 16, one CPU chunk per GPU block; ``p`` is a token stream requests share.
"""

import json

import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.config.engine import engine_config_from_dict
from aisim.config.overrides import apply_engine, parse_sets
from aisim.config.vllm_offload import from_transfer_config, offload_section, tier_bytes_per_block
from aisim.deploy import deploy
from aisim.errors import ConfigError
from aisim.plan import plan_from_probe
from aisim.replay import replay

from helpers import ipc_bytes, make_trace

GIB = 2**30


def _engine(**offload):
    eng = {"num_gpu_blocks": 11, "block_size": 16, "max_model_len": 320, "max_num_seqs": 4,
           "max_num_batched_tokens": 256, "startup_check": False, "vllm_version": "0.34.0",
           "kv_cache_groups": [{"type": "full", "page_size_bytes": 1024, "num_layers": 2}],
           "time_model": {"kind": "linear", "base_s": 0.01}}
    if offload:
        eng["kv_offload"] = offload
    return eng


def _req(rid, at, prompt, shared=None, shared_len=0):
    segs = [(shared, 0, shared_len)] if shared else []
    if prompt > shared_len:
        segs.append(("own-" + rid, shared_len, prompt - shared_len))
    return {"id": rid, "at": at, "prompt": prompt, "max_tokens": 1, "segments": segs}


def _probe(**over):
    p = {"vllm_version": "0.34.0", "model": "llama", "enable_prefix_caching": True, "block_size": 16,
         "max_model_len": 8192, "max_num_batched_tokens": 8192, "max_num_seqs": 256, "num_gpu_blocks": 20000,
         "async_scheduling": False, "tensor_parallel_size": 2,
         "kv_cache_groups": [{"type": "full", "block_size": 16, "page_size_bytes": 32768, "num_layers": 32}]}
    p.update(over)
    return p


# ---------------------------------------------------------------- vLLM's flags and kv_transfer_config

def test_the_flag_counts_bytes_over_every_worker():
    # 32 layers x 32 KiB pages on each of 2 workers: 2 MiB a block (CPUOffloadingSpec: worker bytes x world size).
    groups = _probe()["kv_cache_groups"]
    assert tier_bytes_per_block(groups, 2) == 2 * 32 * 32768 == 2097152
    sec = offload_section(64, "native", 2097152, base={"load_delay_steps": 3, "cpu_blocks": 9})
    assert sec == {"load_delay_steps": 3, "size_gib": 64.0, "kv_bytes_per_block": 2097152}


@pytest.mark.parametrize("size, backend, message", [
    (0, "native", "positive number of GiB"),
    (8, "lmcache", "LMCache server process"),
    (8, "disk", "one of native, lmcache"),
])
def test_bad_flags_are_refused(size, backend, message):
    with pytest.raises(ConfigError, match=message):
        offload_section(size, backend, 4096)


def test_a_probe_with_the_offloading_connector_plans_the_tier():
    # cpu_bytes_to_use 64 GiB, chunks of 64 tokens = 4 blocks of 2 MiB: 65536 MiB / 8 MiB = 8192 chunks.
    ktc = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"cpu_bytes_to_use": 64 * GIB, "block_size": 64,
                                         "offload_prompt_only": False}}
    cfg, notes = plan_from_probe(_probe(kv_transfer_config=ktc, max_num_inflight_kv_loads=8))
    off = cfg.kv_offload
    assert (off.size_gib, off.kv_bytes_per_block, off.block_size, off.max_num_inflight_kv_loads) == \
        (64.0, 2097152, 64, 8)
    assert off.num_chunks(16) == 8192 and off.prompt_only is False
    assert notes[-1] == "the probed engine's KV offload tier: vLLM's CPU OffloadingConnector, 64 GiB, 8,192 chunks"
    assert cfg.plan_notes[-1] == notes[-1]


def test_a_probe_with_the_flags_plans_the_same_tier():
    cfg, _ = plan_from_probe(_probe(kv_offloading_size=64.0, kv_offloading_backend="native"))
    assert cfg.kv_offload.num_chunks(16) == 64 * GIB // 2097152 == 32768


def test_a_probe_whose_engine_the_offload_replay_does_not_model_says_why():
    # vLLM 0.33 and later schedule asynchronously by default: that engine keeps its tier.
    cfg, notes = plan_from_probe(_probe(kv_offloading_size=8.0, async_scheduling=True))
    assert cfg.async_scheduling and cfg.kv_offload.num_chunks(16) == 4096
    groups = [{"type": "full", "block_size": 16, "page_size_bytes": 32768, "num_layers": 16},
              {"type": "sliding_window", "sliding_window": 128, "block_size": 16, "page_size_bytes": 32768,
               "num_layers": 16}]
    cfg, notes = plan_from_probe(_probe(kv_offloading_size=8.0, kv_cache_groups=groups))
    assert cfg.kv_offload is None
    assert notes[-1].startswith("no KV offload tier:")
    assert "this engine has a grouped (hybrid) KV cache" in notes[-1]
    cfg, notes = plan_from_probe(_probe(kv_transfer_config={"kv_connector": "NixlConnector", "kv_role": "kv_both"}))
    assert cfg.kv_offload is None and "'NixlConnector', which aisim does not replay" in notes[-1]
    cfg, notes = plan_from_probe(_probe(kv_offloading_size=8.0, kv_offloading_backend="lmcache"))
    assert cfg.kv_offload is None and "'LMCacheMPConnector', which aisim does not replay" in notes[-1]


@pytest.mark.parametrize("ktc, message", [
    ({"kv_connector": "OffloadingConnector"}, "cpu_bytes_to_use' must be a positive number"),
    ({"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {"cpu_bytes_to_use": 1, "spec_name": "X"}},
     "aisim replays the CPU tier"),
    ({"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {"cpu_bytes_to_use": 1, "tiers": 2}},
     "kv_connector_extra_config.tiers' is not an OffloadingConnector setting"),
    ("OffloadingConnector", "must be a mapping"),
])
def test_bad_transfer_configs_are_refused(ktc, message):
    with pytest.raises(ConfigError, match=message):
        from_transfer_config(ktc, 4096)


def test_plan_takes_vllms_flag(tmp_path):
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(_probe()))
    r = CliRunner().invoke(main, ["plan", "--probe", str(path), "--kv-offloading-size", "1",
                                  "--set", "kv_offload.load_delay_steps=2", "--format", "json"])
    assert r.exit_code == 0, r.output
    cfg = json.loads(r.stdout)
    assert cfg["kv_offload"]["size_gib"] == 1.0 and cfg["kv_offload"]["kv_bytes_per_block"] == 2097152
    assert cfg["kv_offload"]["load_delay_steps"] == 2
    r = CliRunner().invoke(main, ["plan", "--probe", str(path), "--kv-offloading-backend", "native"])
    assert r.exit_code != 0 and "goes with --kv-offloading-size" in r.output


@pytest.mark.parametrize("sets, disk", [((), False), (("--set", "kv_offload.disk_tier=true"), True)])
def test_a_plan_with_a_tier_loads_back(tmp_path, sets, disk):
    # The written section holds a disk tier's keys only with the disk tier, as the loader asks.
    from aisim.config.engine import load_engine_config

    out = tmp_path / "plan.toml"
    r = CliRunner().invoke(main, ["plan", "--model", "llama-3.1-8b", "--gpu", "H100", "--kv-offloading-size", "16",
                                  *sets, "--out", str(out)])
    assert r.exit_code == 0, r.output
    off = load_engine_config(out).kv_offload
    # 16 GiB of 8 MiB blocks (32 layers x 4,096 B x 64 tokens): 2,048 chunks.
    assert (off.size_gib, off.kv_bytes_per_block, off.num_chunks(64), off.disk_tier) == (16.0, 8388608, 2048, disk)
    import tomllib

    keys = set(tomllib.loads(out.read_text())["kv_offload"])
    assert keys == {"size_gib", "kv_bytes_per_block", "load_delay_steps", "store_delay_steps", "pcie_lanes",
                    "pcie_efficiency", "eviction_policy", "extra"} | (
        {"disk_tier", "disk_read_delay_steps", "disk_write_delay_steps", "disk_read_gbps", "disk_write_gbps"}
        if disk else set())


def test_set_sizes_the_tier_one_way():
    cfg = engine_config_from_dict(_engine(size_gib=1.0, kv_bytes_per_block=2048))
    cfg = apply_engine(cfg, parse_sets(["kv_offload.cpu_blocks=20", "kv_offload.load_delay_steps=2"]))
    assert (cfg.kv_offload.cpu_blocks, cfg.kv_offload.size_gib, cfg.kv_offload.load_delay_steps) == (20, None, 2)
    cfg = apply_engine(engine_config_from_dict(_engine()), parse_sets(["kv_offload.cpu_blocks=20"]))
    assert cfg.kv_offload.cpu_blocks == 20
    with pytest.raises(ConfigError, match="the keys of 'kv_offload': cpu_blocks, size_gib"):
        parse_sets(["kv_offload.tiers=2"])


def test_replay_takes_vllms_flag(tmp_path):
    # 2048 bytes a block rounds up to a 4096-byte page: 1/256 GiB holds 1024 chunks.
    (tmp_path / "engine.json").write_text(json.dumps(_engine()))
    rows = [{"request_id": "a", "arrival_step": 0, "prompt_len": 64, "max_tokens": 1},
            {"request_id": "b", "arrival_step": 3, "prompt_len": 48, "max_tokens": 2}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = CliRunner().invoke(main, ["replay", "--engine", str(tmp_path / "engine.json"), "--trace",
                                  str(tmp_path / "t.jsonl"), "--kv-offloading-size", str(1 / 256),
                                  "--kv-offloading-backend", "native", "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["engine"]["kv_offload"]["size_gib"] == 1 / 256
    assert out["kv_offload"]["cpu_chunks"] == 1024 and out["kv_offload"]["store_chunks"] == 4 + 3
    r = CliRunner().invoke(main, ["replay", "--engine", str(tmp_path / "engine.json"), "--trace",
                                  str(tmp_path / "t.jsonl"), "--kv-offloading-size", "1",
                                  "--kv-offloading-backend", "lmcache"])
    assert r.exit_code != 0 and "LMCache server process" in r.output


# ---------------------------------------------------------------- deployments

# Round-robin over two replicas sends A, B, C to replica 0 and D, E to replica 1.  Replica 0 stores A's 4
# chunks (p); B's 159 tokens take every GPU block and evict them; C (p + 16) loads its 64 tokens from
# replica 0's tier (issued in its first step, reported by the next, run in the third: TTFT 3 steps).
# Replica 1 never held p: E (p + 16) finds nothing in its own tier and computes and stores all 5 blocks.
TRACE = [_req("A", 0, 64, "p", 64), _req("D", 0.02, 159), _req("B", 0.05, 159), _req("E", 0.07, 80, "p", 64),
         _req("C", 0.1, 80, "p", 64)]


def test_each_replica_has_its_own_tier():
    cfg = engine_config_from_dict(_engine(cpu_blocks=20))
    d = deploy(make_trace(TRACE, "time"), cfg, {"replicas": 2, "router": "round_robin"})
    rq = d.requests.to_pydict()
    assert rq["replica"] == [0, 1, 0, 1, 0]
    assert rq["offload_hit_tokens"] == [0, 0, 0, 0, 64] and rq["offload_loads"] == [0, 0, 0, 0, 1]
    assert rq["offload_store_chunks"] == [4, 9, 9, 5, 1] and rq["cached_tokens"] == [0] * 5
    assert rq["ttft_s"][4] == pytest.approx(0.03)
    assert [s["kv_offload"]["loads"] for s in d.summary["replicas"]] == [1, 0]
    assert [s["kv_offload"]["store_chunks"] for s in d.summary["replicas"]] == [14, 14]
    off = d.summary["kv_offload"]
    assert (off["cpu_chunks"], off["loads"], off["load_tokens"], off["store_chunks"]) == (40, 1, 64, 28)
    assert off["connector_prefix_cache_stats"]["hits"] == 64
    assert d.summary["prefix_hit_tokens_at_admission"] == 64  # vLLM's num_cached_tokens: the tier's too
    assert d.steps.column("offload_load_chunks").to_pylist().count(4) == 1
    # Replica 0 is the single engine replaying its share: the same rows, offload columns too.
    alone = replay(make_trace([TRACE[0], TRACE[2], TRACE[4]], "time"), cfg)
    mine = d.requests.filter(d.requests.column("replica").to_numpy() == 0).select(alone.requests.column_names)
    assert ipc_bytes(mine.combine_chunks()) == ipc_bytes(alone.requests.combine_chunks())
    # One engine with one tier for all five: E finds A's blocks on the GPU.
    one = replay(make_trace(TRACE, "time"), cfg).requests.to_pydict()
    assert one["offload_hit_tokens"] != rq["offload_hit_tokens"]


def test_a_disaggregated_deployment_refuses_a_tier():
    cfg = engine_config_from_dict(_engine(cpu_blocks=20))
    with pytest.raises(ConfigError, match="a KV offload tier on its prefill replicas only"):
        deploy(make_trace(TRACE, "time"), cfg, {"prefill": {"replicas": 1}, "decode": {"replicas": 1},
                                                "link": {"bandwidth_gb_s": 100.0}})


# ---------------------------------------------------------------- sweep and capacity knobs

def test_the_tier_size_is_a_knob():
    from aisim.sweep.knobs import resolve

    base = _engine(load_delay_steps=2, cpu_blocks=8)
    # 2 layers x 1024-byte pages: 2048 bytes a block, 4096 with the page rounding; 1/256 GiB = 1024 chunks.
    point = resolve(base, None, {"kv_offloading_size": 1 / 256}, "candidate c001")
    assert point.config["kv_offload"] == {"load_delay_steps": 2, "size_gib": 1 / 256, "kv_bytes_per_block": 2048}
    assert point.engine.kv_offload.num_chunks(16) == 1024
    assert resolve(base, None, {"kv_offloading_size": "unset"}, "c002").engine.kv_offload is None
    with pytest.raises(ConfigError, match="knob 'kv_offloading_size': the tier size is a positive number"):
        resolve(base, None, {"kv_offloading_size": -1}, "c003")


# ---------------------------------------------------------------- streamed replays (the pipeline's)

def test_a_streamed_replay_carries_the_tier():
    import os

    from test_replay_stream import _streamed

    from conftest import DATA
    from helpers import oracle_engine_dict, oracle_hash_id_trace

    d = os.path.join(DATA, "oracle", "offload", "offload_multiturn")
    eng = engine_config_from_dict(oracle_engine_dict(d, "0.34.0"))
    trace = oracle_hash_id_trace(os.path.join(d, "trace.jsonl"))
    whole = replay(trace, eng)
    requests, steps, summary = _streamed(trace, eng, chunk=50, out_rows=97)
    assert ipc_bytes(requests.combine_chunks()) == ipc_bytes(whole.requests.combine_chunks())
    assert ipc_bytes(steps.combine_chunks()) == ipc_bytes(whole.steps.combine_chunks())
    assert summary == whole.summary
    # The recorded run's totals (docs/kv-offload.md): 239 loads of 9,973 chunks, 491 stores of 12,583.
    off = summary["kv_offload"]
    assert (off["loads"], off["load_chunks"], off["stores"], off["store_chunks"]) == (239, 9973, 491, 12583)


def test_a_replica_of_one_request_keeps_its_rows():
    # Replica 1 runs D alone (one request row): its 159 tokens fill 9 blocks, all stored.
    cfg = engine_config_from_dict(_engine(cpu_blocks=20))
    for _ in range(3):
        d = deploy(make_trace(TRACE[:3], "time"), cfg, {"replicas": 2, "router": "round_robin"})
        rq = d.requests.to_pydict()
        assert rq["replica"] == [0, 1, 0] and rq["offload_store_chunks"] == [4, 9, 9]
        assert rq["offload_hit_tokens"] == [0, 0, 0] and rq["offload_loads"] == [0, 0, 0]
