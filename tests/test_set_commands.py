"""``--set`` on the commands that read an engine from a file or spec: ``config show``/``validate``, ``sweep``
and ``pipeline run`` (``replay``, ``plan``: tests/test_bench_serve.py; ``capacity``: tests/test_capacity_flags.py)."""

from __future__ import annotations

import json
import os

from click.testing import CliRunner

from aisim.cli import main


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_config_show_and_validate_apply_set(tmp_path):
    f = tmp_path / "e.json"
    f.write_text(json.dumps({"num_gpu_blocks": 100, "max_model_len": 3072}))  # fits 50 blocks of 64 too
    r = _run("config", "show", f, "--set", "max_num_seqs=7", "--set", "time_model.base_s=0.02", "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert (d["max_num_seqs"], d["time_model"]["base_s"]) == (7, 0.02)
    r = _run("config", "validate", f, "--set", "num_gpu_blocks=50")
    assert r.exit_code == 0 and "50 blocks" in r.output, r.output
    r = _run("config", "show", f, "--set", "deployment.replicas=2")
    assert r.exit_code == 2 and "--set takes engine keys here" in r.output
    r = _run("config", "show", f, "--set", "blocks=2")
    assert r.exit_code == 2 and "unknown key 'blocks'" in r.output


def test_sweep_applies_set_to_its_base_engine(tmp_path):
    # Eight 100-token requests at step 0, ten outputs each, 10 ms steps (tests/test_sweep.py's first case):
    # with max_num_seqs 1 they run one after another and only the first five meet TTFT <= 0.5 s, whatever
    # the blocks; the base's 8 would let all eight meet it.
    trace = [{"request_id": f"r{i}", "prompt_len": 100, "max_tokens": 10, "arrival_step": 0} for i in range(8)]
    (tmp_path / "trace.jsonl").write_text("\n".join(json.dumps(t) for t in trace) + "\n")
    (tmp_path / "base.json").write_text(json.dumps({"num_gpu_blocks": 400, "max_model_len": 1024,
                                                    "max_num_batched_tokens": 2048, "max_num_seqs": 8}))
    (tmp_path / "sweep.toml").write_text(
        'name = "s"\ndatabase = "s.duckdb"\nmodel = "m"\nbase = "base.json"\nbest = "best.toml"\n'
        '[trace]\npaths = ["trace.jsonl"]\nformat = "oracle"\n[grid]\nnum_gpu_blocks = [200, 400]\n'
        '[slo]\nttft_s = 0.5\n')
    spec = tmp_path / "sweep.toml"
    r = _run("sweep", spec, "--scheduler", "sync", "--format", "json")
    assert r.exit_code == 0, r.output
    assert [c["slo_attainment"] for c in json.loads(r.stdout)["ranked"]] == [1.0, 1.0]
    r = _run("sweep", spec, "--scheduler", "sync", "--format", "json", "--set", "max_num_seqs=1")
    assert r.exit_code == 0, r.output
    assert [c["slo_attainment"] for c in json.loads(r.stdout)["ranked"]] == [5 / 8, 5 / 8]
    r = _run("sweep", spec, "--scheduler", "sync", "--set", "num_gpu_blocks=300")
    assert r.exit_code == 2 and "the sweep's grid varies 'num_gpu_blocks'" in r.output, r.output
    r = _run("sweep", spec, "--scheduler", "sync", "--set", "max_num_seqs=0")
    assert r.exit_code == 2 and "'max_num_seqs'" in r.output, r.output


def test_pipeline_run_applies_set_and_keys_the_run_by_it(tmp_path):
    # The sweep test's eight requests (10 ms steps): one sequence at a time with max_num_seqs=1.
    trace = [{"request_id": f"r{i}", "prompt_len": 100, "max_tokens": 10, "arrival_step": 0} for i in range(8)]
    (tmp_path / "trace.jsonl").write_text("\n".join(json.dumps(t) for t in trace) + "\n")
    (tmp_path / "e.json").write_text(json.dumps({"num_gpu_blocks": 400, "max_model_len": 1024,
                                                 "max_num_batched_tokens": 2048, "max_num_seqs": 8}))
    spec = tmp_path / "p.toml"
    spec.write_text('name = "p"\ndatabase = "p.duckdb"\n[[sources]]\nname = "s"\npaths = ["trace.jsonl"]\n'
                    'format = "oracle"\nmodel = "m"\n[[deployments]]\nmodel = "m"\nengines = { base = "e.json" }\n')

    def run(*sets):
        r = _run("pipeline", "run", spec, "--scheduler", "sync", "--progress", "none", "--format", "json",
                 *[a for s in sets for a in ("--set", s)])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    def key(*sets):
        r = _run("pipeline", "check", spec, "--format", "json", *[a for s in sets for a in ("--set", s)])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["run_key"]

    base = run()
    one = run("max_num_seqs=1")
    # Another run (not the cached one), keyed by the change; the same change again is that run.
    assert one["run_id"] != base["run_id"] and one["landed"] and key("max_num_seqs=1") == one["run_id"]
    assert key() == base["run_id"] and key("max_num_seqs=2") not in (base["run_id"], one["run_id"])
    again = run("max_num_seqs=1")
    assert again["run_id"] == one["run_id"] and not again["landed"]
    import duckdb

    with duckdb.connect(str(tmp_path / "p.duckdb"), read_only=True) as con:
        cur = con.execute("SELECT r.spec, s.engine_config, m.ttft_p99_s FROM runs r JOIN shards s USING (run_id) "
                          "JOIN summaries m USING (run_id, shard_id) ORDER BY r.run_seq")
        rows = [dict(zip([d[0] for d in cur.description], row)) for row in cur.fetchall()]
    assert [json.loads(x["engine_config"])["max_num_seqs"] for x in rows] == [8, 1]
    assert "overrides" not in json.loads(rows[0]["spec"])
    assert json.loads(rows[1]["spec"])["overrides"] == [["max_num_seqs", 1]]
    # Eight 10-step requests one after another: the last first token after seven of them.
    assert rows[1]["ttft_p99_s"] > 5 * rows[0]["ttft_p99_s"]
    r = _run("pipeline", "run", spec, "--scheduler", "sync", "--set", "max_num_seqs=0")
    assert r.exit_code == 2 and "model 'm', engine 'base'" in r.output and "'max_num_seqs'" in r.output, r.output


def test_an_engine_key_set_on_a_deployment_whose_pool_runs_its_own_engine_is_refused(tmp_path):
    # The prefill pool runs its own engine file: --set max_num_seqs would change only the deployment's engine
    # (the decode pool's), so it is refused with the pool and its file named, never applied to half.
    eng = tmp_path / "e.json"
    eng.write_text(json.dumps({"num_gpu_blocks": 2000, "max_model_len": 8192}))
    pre = tmp_path / "prefill.json"
    pre.write_text(json.dumps({"num_gpu_blocks": 2000, "max_model_len": 8192}))
    dep = tmp_path / "pd.toml"
    dep.write_text('[deployment.prefill]\nreplicas = 1\nrouter = "round_robin"\nengine = "prefill.json"\n'
                   '[deployment.decode]\nreplicas = 1\nrouter = "round_robin"\n'
                   '[deployment.link]\nbandwidth_gb_s = "inf"\n')
    trace = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "trace.jsonl")
    base = ("replay", "--engine", eng, "--trace", trace, "--deployment", dep)
    r = _run(*base, "--set", "max_num_seqs=8")
    assert r.exit_code == 2, r.output
    assert "--set max_num_seqs=8 changes the deployment's engine, but its prefill pool runs its own engine" in r.output
    assert str(pre) in r.output.replace("\n", "")
    r = _run(*base, "--set", "deployment.link.latency_s=0.01")  # a deployment key changes the deployment alone
    assert r.exit_code == 0, r.output
