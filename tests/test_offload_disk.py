"""The disk tier behind the CPU tier of KV offload (vLLM 0.34.0's TieringOffloadingSpec with one `fs`
secondary tier), on small cases derived by hand (docs/kv-offload.md, "The disk tier").

Block size 16; one chunk is one GPU block.  The engine has 11 GPU blocks (10 usable), a CPU tier of
9 chunks and the disk tier; ``p`` is a token stream A and C share.
"""

import json

import pytest

from aisim.config.engine import engine_config_from_dict
from aisim.config.vllm_offload import from_transfer_config
from aisim.decisionlog import decision_lines, log_line_json
from aisim.errors import ConfigError
from aisim.replay import replay

from helpers import ipc_bytes, make_trace, run_log
from test_kv_offload import _engine, _req

# A (p, 64 tokens) at step 0, B (159 tokens of its own) at step 5, C (p + 16 of its own) at step 10.
REQS = [_req("A", 0, 64, "p", 64), _req("B", 5, 159), _req("C", 10, 80, "p", 64)]
# The disk tier's totals over REQS. Queries: A 4 + 1, B 9 + 1, C 5 + 5 + 1; RETRY 4 + 9 + 5; writes
# 4 + 9 + 1 (promoted chunks are not written again); the disk keeps all 14 while the CPU tier holds 9.
DISK_TOTALS = {
    "queries": 26, "retries": 18, "hits": 4, "promotions": 1, "promoted_chunks": 4, "promote_failed": 0,
    "cascades": 3, "cascade_chunks": 14, "written_chunks": 14, "disk_chunks": 14, "read_bytes": 0,
    "write_bytes": 0}


def test_a_prefix_evicted_from_gpu_and_cpu_is_read_back_from_disk():
    # Every first lookup past the CPU tier answers RETRY: the disk's verdict comes with the next step
    # (AsyncLookupManager: the probe goes out at the end of the step).
    # - A: step 0 RETRY (4 chunks probed); step 1 the verdict "absent" misses, A runs 64 tokens and
    #   stores 4 chunks (job 0).  Step 2 reports job 0: its chunks are pinned for the write to disk
    #   (cpu_evictable 0); step 3's poll reports the write (cpu_evictable 4).  The engine steps on
    #   through 2 and 3 because a disk job is in flight.
    # - B: step 5 RETRY (9 chunks); step 6 B runs 159 tokens, taking every GPU block (A's cached
    #   blocks go) and storing 9 chunks: 4 + 9 > 9 evicts A's 4 (cpu_evicted 4).  Written by step 8.
    # - C: no GPU hit, chunk 0 misses the CPU tier: step 10 RETRY (5 chunks).  Step 11: chunks 0-3 are
    #   on disk; each promotion takes a CPU chunk, evicting one of B's (cpu_evicted 4), and answers
    #   HIT_PENDING; chunk 4 is absent (MISS).  The lookup is None; one read job of 4 chunks goes out.
    #   Step 12's poll reports the read; C hits 4 chunks in the CPU tier: 64 tokens, load job 2
    #   (4 blocks allocated: free 6).  Step 13 reports the load, C runs from 64 tokens in step 14 and
    #   stores chunk 4 (evicting one chunk), written by step 16.
    steps, summary, res = run_log(_engine(11, cpu_blocks=9, disk_tier=True), REQS)
    assert sorted(steps) == [0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16]
    off = {k: steps[k]["offload"] for k in steps}
    assert off[0]["lookups"] == {"A": [0, None]} and off[1]["lookups"] == {"A": [0, 0]}
    assert off[1]["stores"] == {"0": ["A", 4]}
    assert off[2]["done"] == [0] and off[2]["cpu_evictable"] == 0 and off[3]["cpu_evictable"] == 4
    assert off[6]["stores"] == {"1": ["B", 9]} and off[6]["cpu_evicted"] == 4
    assert off[7]["cpu_evictable"] == 0 and off[8]["cpu_evictable"] == 9
    assert off[10]["lookups"] == {"C": [0, None]}
    assert off[11]["lookups"] == {"C": [0, None]} and off[11]["cpu_evicted"] == 4
    assert off[11]["cpu_used"] == 9 and off[11]["cpu_evictable"] == 5
    assert off[12]["lookups"] == {"C": [0, 64]} and off[12]["loads"] == {"2": ["C", 64, 4]}
    assert steps[12]["free_blocks"] == 6 and off[13]["done"] == [2]
    assert steps[14]["new"] == {"C": 64} and steps[14]["sched"] == {"C": 16}
    assert off[14]["stores"] == {"3": ["C", 1]} and off[14]["cpu_evicted"] == 1
    assert summary["kv_offload"]["disk"] == DISK_TOTALS
    assert res.requests.column("offload_hit_tokens").to_pylist() == [0, 0, 64]
    assert res.requests.column("offload_disk_read_chunks").to_pylist() == [0, 0, 4]
    # The step columns: queries as above, the writes issued by the outputs of steps 2, 7 and 15 and on
    # disk from the next step's poll, C's read at step 11.
    col = {c: res.steps.column(c).to_pylist() for c in res.steps.column_names}
    assert col["step"] == [0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16]
    assert col["offload_disk_queries"] == [4, 1, 0, 0, 9, 1, 0, 0, 5, 5, 1, 0, 0, 0, 0]
    assert col["offload_disk_hits"] == col["offload_disk_read_chunks"] == [0] * 9 + [4] + [0] * 5
    assert col["offload_disk_write_chunks"] == [0, 0, 4, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 1, 0]
    assert col["offload_disk_chunks"] == [0, 0, 0, 4, 4, 4, 4, 13, 13, 13, 13, 13, 13, 13, 14]
    # Without the disk tier C finds nothing and recomputes its 80 tokens at step 10.
    steps, _, res = run_log(_engine(11, cpu_blocks=9), REQS)
    assert steps[10]["new"] == {"C": 0} and steps[10]["sched"] == {"C": 80}


def test_disk_reads_and_writes_on_the_clock():
    # PCIe 4.0 x16: 16e9 * 128/130 / 8 * 16 B/s; a chunk of 100 MiB; the drive's defaults: 6.9 GB/s
    # read, 4.1 GB/s write; every step computes 10 ms.
    # - Step 3 reports A's GPU->CPU store at the end of its forward pass; the write of 4 chunks starts
    #   then and lasts 4 * chunk / 4.1e9 = 102.3 ms: the empty step 3 lasts 10 + 102.3 ms, and step 4's
    #   poll takes the write (cpu_evictable 4).  B's 9 chunks: step 8 lasts 10 ms + 9 * chunk / 4.1e9.
    # - Step 11's promotions go out when its schedule() ends: 4 * chunk / 6.9e9 = 60.8 ms, the empty
    #   step 11's length; step 12 hits the CPU tier and loads over PCIe (10 + 13.3 ms).
    chunk = 100 * 2**20
    steps, summary, res = run_log(_engine(11, cpu_blocks=9, disk_tier=True, pcie_gen=4, kv_bytes_per_block=chunk),
                                  REQS)
    pcie = 16e9 * 128 / 130 / 8 * 16
    dur = dict(zip(res.steps.column("step").to_pylist(), res.steps.column("duration_s").to_pylist()))
    assert steps[3]["offload"]["done"] == [0] and steps[4]["offload"]["cpu_evictable"] == 4
    assert dur[3] == pytest.approx(0.01 + 4 * chunk / 4.1e9)
    assert dur[8] == pytest.approx(0.01 + 9 * chunk / 4.1e9)
    assert steps[11]["offload"]["lookups"] == {"C": [0, None]} and dur[11] == pytest.approx(4 * chunk / 6.9e9)
    assert steps[12]["offload"]["loads"] == {"2": ["C", 64, 4]} and dur[12] == pytest.approx(0.01 + 4 * chunk / pcie)
    assert steps[14]["new"] == {"C": 64}
    disk = summary["kv_offload"]["disk"]
    assert disk["read_bytes"] == 4 * chunk and disk["write_bytes"] == 14 * chunk


def test_the_disk_tier_never_evicts():
    # vLLM's fs tier deletes no file (FileSystemTierManager has no capacity): A's 4 chunks, the first
    # written, are read back after three requests of 159 tokens of their own wrote 27 more (the CPU
    # tier of 9 evicted 27 chunks meanwhile).  C's read-back runs as in the test above, 30 steps later:
    # RETRY at 40, promotion at 41, the load at 42, C runs from 64 tokens at 44.
    reqs = [_req("A", 0, 64, "p", 64), _req("B1", 5, 159), _req("B2", 15, 159), _req("B3", 25, 159),
            _req("C", 40, 80, "p", 64)]
    steps, summary, _ = run_log(_engine(11, cpu_blocks=9, disk_tier=True), reqs)
    assert summary["kv_offload"]["cpu_evicted_chunks"] == 27
    assert steps[41]["offload"]["cpu_evicted"] == 4 and steps[42]["offload"]["loads"] == {"4": ["C", 64, 4]}
    assert steps[44]["new"] == {"C": 64}
    disk = summary["kv_offload"]["disk"]
    assert disk["written_chunks"] == disk["disk_chunks"] == 4 + 3 * 9 + 1 and disk["promoted_chunks"] == 4


def test_the_disk_tier_off_changes_no_byte():
    # disk_tier false is the CPU tier alone: the same tables and the same decision log, header included.
    plain = engine_config_from_dict(_engine(11, cpu_blocks=9))
    off = engine_config_from_dict(_engine(11, cpu_blocks=9, disk_tier=False))
    assert off.kv_offload.to_dict() == plain.kv_offload.to_dict()
    a = replay(make_trace(REQS, "step"), plain, record_decisions=True)
    b = replay(make_trace(REQS, "step"), off, record_decisions=True)
    assert ipc_bytes(a.steps) == ipc_bytes(b.steps) and ipc_bytes(a.requests) == ipc_bytes(b.requests)
    assert [log_line_json(x) for x in decision_lines(a)] == [log_line_json(x) for x in decision_lines(b)]
    assert "disk" not in a.summary["kv_offload"] and "offload_disk_chunks" not in a.steps.column_names


@pytest.mark.parametrize("section, message", [
    ({"disk_read_gbps": 3.0}, "'kv_offload.disk_read_gbps' sets the disk tier; it needs 'kv_offload.disk_tier'"),
    ({"disk_tier": "yes"}, "'kv_offload.disk_tier' must be true or false"),
    ({"disk_tier": True, "disk_write_gbps": 0}, "'kv_offload.disk_write_gbps' must be a positive number"),
    ({"disk_tier": True, "disk_read_delay_steps": 0}, "'kv_offload.disk_read_delay_steps' must be at least 1"),
])
def test_bad_disk_keys_are_refused(section, message):
    with pytest.raises(ConfigError, match=message):
        engine_config_from_dict(_engine(11, cpu_blocks=9, **section))


def _ktc(**extra):
    return {"kv_connector": "OffloadingConnector",
            "kv_connector_extra_config": {"cpu_bytes_to_use": 2**30, "spec_name": "TieringOffloadingSpec", **extra}}


def test_a_probe_with_an_fs_tier_plans_the_disk_tier():
    section, note = from_transfer_config(_ktc(secondary_tiers=[{"type": "fs", "root_dir": "/mnt/kv"}]), 2**20)
    assert note is None and section["disk_tier"] is True and section["size_gib"] == 1.0
    section, _ = from_transfer_config(_ktc(), 2**20)
    assert "disk_tier" not in section


@pytest.mark.parametrize("extra, message", [
    ({"secondary_tiers": [{"type": "obj"}]}, "tier 'obj' is not modelled"),
    ({"secondary_tiers": [{"type": "fs"}, {"type": "fs"}]}, "has 2 tiers; aisim replays one 'fs' tier"),
    ({"secondary_tiers": [{"type": "fs", "backpressure": {}}]}, "a back-pressure detector is not modelled"),
    ({"secondary_tiers": [], "backpressure": {"backpressure_cls": "X"}}, "back-pressure detector"),
    ({"secondary_tiers": {"type": "fs"}}, "must be a list of tier configurations"),
])
def test_other_tiers_are_refused(extra, message):
    with pytest.raises(ConfigError, match=message):
        from_transfer_config(_ktc(**extra), 2**20)


def test_decision_log_summary_names_the_disk_totals():
    steps, summary, res = run_log(_engine(11, cpu_blocks=9, disk_tier=True), REQS)
    header = next(iter(decision_lines(res)))
    assert header["kv_offload"]["disk_tier"] is True and header["kv_offload"]["disk_read_delay_steps"] == 1
    assert json.loads(log_line_json(summary))["kv_offload"]["disk"]["hits"] == 4


def test_a_pipeline_lands_the_disk_columns_and_the_view_reads_them(tmp_path):
    # The demo pipeline's first source on the churning pool of tests/test_offload_results.py, its CPU
    # tier with the disk tier behind it: the landed step and request columns are the replay's, and
    # offload_tiers adds them up per shard.
    import os

    import duckdb

    from aisim.traces import read_trace
    from test_offload_results import TIER, land_engines
    from test_pipeline_common import EXAMPLES

    disk = dict(TIER, kv_offload=dict(TIER["kv_offload"], cpu_blocks=500, disk_tier=True))
    con = duckdb.connect()
    key = land_engines(con, "disk", {"disk": disk})
    trace = read_trace(os.path.join(EXAMPLES, "trace.jsonl"), "oracle", max_model_len=8192)
    d = replay(trace, engine_config_from_dict(disk)).summary["kv_offload"]["disk"]
    assert d["hits"] > 0 and d["disk_chunks"] > 500  # the disk serves and outgrows the CPU tier
    row = con.execute("SELECT disk_queries, disk_hits, disk_read_chunks, disk_write_chunks, disk_chunks, "
                      "disk_read_bytes FROM offload_tiers").fetchone()
    assert row == (d["queries"], d["hits"], d["promoted_chunks"], d["written_chunks"], d["disk_chunks"],
                   d["read_bytes"])
    got = con.execute("SELECT sum(offload_disk_read_chunks) FROM requests").fetchone()
    assert got == (d["promoted_chunks"],)
    # The report's KV offload panel names the disk tier's reads and writes.
    from aisim.report.data import load_run
    from aisim.report.offload import offload_panel

    db = tmp_path / "disk.duckdb"
    con.execute(f"ATTACH '{db}' AS f")
    con.execute("COPY FROM DATABASE memory TO f")
    con.execute("DETACH f")
    con.close()
    html = offload_panel(load_run(str(db), key).shards[0], 100)
    assert f'data-key="offload_disk_read_chunks" data-value="{float(d["promoted_chunks"])!r}"' in html


def test_plan_from_a_probe_that_ran_the_fs_tier():
    # 32 layers x 32 KiB pages on 2 workers: 2 MiB a block; 1 GiB of CPU tier is 512 chunks, a disk behind it.
    from aisim.plan import plan_from_probe

    from test_offload_surfaces import _probe

    ktc = _ktc(secondary_tiers=[{"type": "fs", "root_dir": "/mnt/kv", "n_read_threads": 8}])
    cfg, notes = plan_from_probe(_probe(kv_transfer_config=ktc))
    assert cfg.kv_offload.disk_tier is True and cfg.kv_offload.num_chunks(16) == 512
    assert any("512 chunks, a disk tier behind it (TieringOffloadingSpec, fs)" in n for n in notes)


def test_each_replica_has_its_own_disk():
    # Replica 0 of two (round robin: A, B, C) is the single engine replaying its share, its disk columns
    # too; the deployment's disk totals add the replicas' up (C reads A's 4 chunks back from replica 0's disk:
    # B's 9 chunks fill replica 0's CPU tier of 9, evicting A's).
    from aisim.deploy import deploy

    from test_offload_surfaces import TRACE
    from test_offload_surfaces import _engine as _timed_engine

    cfg = engine_config_from_dict(_timed_engine(cpu_blocks=9, disk_tier=True))
    d = deploy(make_trace(TRACE, "time"), cfg, {"replicas": 2, "router": "round_robin"})
    alone = replay(make_trace([TRACE[0], TRACE[2], TRACE[4]], "time"), cfg)
    mine = d.requests.filter(d.requests.column("replica").to_numpy() == 0).select(alone.requests.column_names)
    assert ipc_bytes(mine.combine_chunks()) == ipc_bytes(alone.requests.combine_chunks())
    steps = d.steps.filter(d.steps.column("replica").to_numpy() == 0).select(alone.steps.column_names)
    assert ipc_bytes(steps.combine_chunks()) == ipc_bytes(alone.steps.combine_chunks())
    assert alone.requests.column("offload_disk_read_chunks").to_pylist() == [0, 0, 4]
    per = [s["kv_offload"]["disk"] for s in d.summary["replicas"]]
    assert d.summary["kv_offload"]["disk"]["disk_chunks"] == sum(p["disk_chunks"] for p in per)
