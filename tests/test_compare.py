"""``aisim compare``: two replays' deltas checked by hand; a landed run against its replay folder; the
report page with both; ``aisim report --replay``."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from aisim.cli import main


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A: two requests at 0 s (a: 16-token prompt, 3 outputs; b: 32, 2) on a linear engine, 10 ms a step plus
    1 ms a scheduled token (tests/test_bench_serve.py's steps: TTFT 58 and 58 ms, finishes at 81 and 70 ms).
    B: the same with max_num_seqs 1.  a alone: prefill 10 + 16 = 26 ms, decodes end at 37 and 48 ms; then b:
    prefill 10 + 32 ms ends at 90 ms, its decode at 101 ms.  TTFT 26 and 90 ms, E2E 48 and 101 ms."""
    d = tmp_path_factory.mktemp("compare")
    (d / "t.jsonl").write_text(
        json.dumps({"request_id": "a", "prompt_len": 16, "max_tokens": 3, "arrival_time": 0.0}) + "\n"
        + json.dumps({"request_id": "b", "prompt_len": 32, "max_tokens": 2, "arrival_time": 0.0}) + "\n")
    (d / "e.json").write_text(json.dumps({"model": "m", "num_gpu_blocks": 100, "max_model_len": 4096,
                                          "time_model": {"base_s": 0.01, "per_token_s": 0.001}}))
    for name, extra in (("A", ()), ("B", ("--set", "max_num_seqs=1"))):
        r = _run("replay", "--engine", d / "e.json", "--trace", d / "t.jsonl", "--out", d / name, *extra)
        assert r.exit_code == 0, r.output
    return d


def _metrics(out: str) -> dict:
    return {m["metric"]: m for m in json.loads(out)["metrics"]}


def test_compare_two_folders_by_hand(runs):
    r = _run("compare", runs / "A", runs / "B", "--format", "json")
    assert r.exit_code == 0, r.output
    m = _metrics(r.stdout)
    # TTFT: A 58, 58 ms; B 26, 90 ms.  Means equal; p99 of B = 26 + 0.99 * 64 ms.
    assert m["ttft_mean_s"]["a"] == pytest.approx(0.058) and m["ttft_mean_s"]["delta"] == pytest.approx(0, abs=1e-12)
    assert m["ttft_p99_s"]["b"] == pytest.approx(0.026 + 0.99 * 0.064)
    assert m["ttft_p99_s"]["delta"] == pytest.approx(0.99 * 0.064 - 0.032)
    # E2E mean: A (81 + 70) / 2 = 75.5 ms, B (48 + 101) / 2 = 74.5 ms.
    assert m["e2e_mean_s"]["delta"] == pytest.approx(-0.001)
    assert m["e2e_mean_s"]["relative"] == pytest.approx(-0.001 / 0.0755)
    # TPOT: A 11.5 and 12 ms; B (48 - 26) / 2 = 11 and (101 - 90) / 1 = 11 ms.
    assert m["tpot_mean_s"]["delta"] == pytest.approx(0.011 - 0.01175)
    # Steps: A 3 and a last empty one; B 5 and a last empty one.
    assert (m["steps"]["a"], m["steps"]["b"], m["steps"]["delta"]) == (4, 6, 2)
    assert m["requests"]["relative"] == 0 and m["prefix_hit_rate"]["relative"] is None  # no hits in A: 0
    table = _run("compare", runs / "A", runs / "B").stdout
    assert "TTFT p99" in table and "+31.4 ms" in table and "B against A" in table


def test_compare_a_landed_run_with_its_replay_folder(runs, tmp_path):
    from aisim.pipeline.run import run_pipeline

    spec = tmp_path / "p.toml"
    spec.write_text(f'name = "tiny"\ndatabase = "tiny.duckdb"\n[[sources]]\nname = "s"\n'
                    f'paths = ["{runs / "t.jsonl"}"]\nformat = "oracle"\nmodel = "m"\n[[deployments]]\n'
                    f'model = "m"\nengines = {{ base = "{runs / "e.json"}" }}\n')
    run_pipeline(str(spec), scheduler="sync", database=str(tmp_path / "tiny.duckdb"))
    r = _run("compare", "tiny", runs / "A", "--db", tmp_path / "tiny.duckdb", "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["a"].startswith("tiny (") and doc["b"] == "A"
    for m in doc["metrics"]:  # the same replay, landed and written to a folder: no differences
        assert m["delta"] in (0, None) or abs(m["delta"]) < 1e-12, m


def test_compare_refuses_what_it_cannot_read(runs, tmp_path):
    r = _run("compare", runs / "A", tmp_path)
    assert r.exit_code == 2 and "lacks requests.parquet, steps.parquet, summary.json" in r.output
    r = _run("compare", runs / "A", "somerun")
    assert r.exit_code == 2 and "give --db FILE" in r.output


def test_compare_report_and_replay_report_draw_both(runs, tmp_path):
    out = tmp_path / "cmp.html"
    r = _run("compare", runs / "A", runs / "B", "--report", out, "--slo", "ttft_s=0.05", "--format", "json")
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert "A vs B" in page and 'id="shard-0"' in page and 'id="shard-1"' in page
    assert "TTFT CDF, every shard" in page and "SLO 50 ms" in page
    rep = tmp_path / "a.html"
    r = _run("report", "--replay", runs / "A", "--out", rep)
    assert r.exit_code == 0 and "report of 1 replay written to" in r.output, r.output
    page = rep.read_text()
    assert str(runs / "A") in page and "from aisim replay --out" in page
    r = CliRunner(env={"AISIM_DB": str(tmp_path / "none.duckdb")}).invoke(
        main, ["report", "--replay", str(runs / "A"), "--out", str(rep)])
    assert r.exit_code == 0, r.output  # $AISIM_DB is the run database's default, not in the way of --replay
    r = _run("report", "--replay", runs / "A", "--db", tmp_path / "x.duckdb", "--out", rep)
    assert r.exit_code == 2 and "--replay reports replay output folders" in r.output
    r = _run("report", "--replay", tmp_path, "--out", rep)
    assert r.exit_code == 2 and "lacks" in r.output


def test_compare_shows_the_offload_tiers(tmp_path):
    # tests/test_kv_offload.py's first case: A (64 tokens of p) is stored, 4 chunks; B (159 tokens) takes
    # every GPU block (9 chunks stored) and evicts p; C (p + 16) misses on the GPU and loads p's 64 tokens
    # from the tier, then stores its one new chunk.  The tier is asked 64 + 159 + 80 = 303 tokens and
    # offers 64; chunks are 4096 bytes.  Without the tier C recomputes p: no offload totals (0).
    import sys

    from aisim.config.engine import engine_config_from_dict
    from aisim.output import write_result
    from aisim.replay import replay

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from helpers import make_trace
    from test_kv_offload import _engine, _req

    trace = [_req("A", 0, 64, "p", 64), _req("B", 5, 159), _req("C", 10, 80, "p", 64)]
    for name, off in (("off", {}), ("on", {"cpu_blocks": 20, "kv_bytes_per_block": 4096})):
        write_result(replay(make_trace(trace, "time"), engine_config_from_dict(_engine(11, **off))),
                     str(tmp_path / name))
    r = _run("compare", tmp_path / "off", tmp_path / "on", "--format", "json")
    assert r.exit_code == 0, r.output
    m = _metrics(r.stdout)
    got = {k: (m[k]["a"], m[k]["b"], m[k]["delta"]) for k in (
        "offload_cpu_chunks", "offload_queries", "offload_hits", "offload_loads", "offload_load_tokens",
        "offload_load_bytes", "offload_stores", "offload_store_chunks", "offload_store_bytes",
        "offload_cpu_evicted")}
    assert got == {"offload_cpu_chunks": (0, 20, 20), "offload_queries": (0, 303, 303),
                   "offload_hits": (0, 64, 64), "offload_loads": (0, 1, 1), "offload_load_tokens": (0, 64, 64),
                   "offload_load_bytes": (0, 4 * 4096, 4 * 4096), "offload_stores": (0, 3, 3),
                   "offload_store_chunks": (0, 14, 14), "offload_store_bytes": (0, 14 * 4096, 14 * 4096),
                   "offload_cpu_evicted": (0, 0, 0)}
    assert m["offload_hit_rate"]["a"] is None and m["offload_hit_rate"]["b"] == pytest.approx(64 / 303)
    # The GPU prefix cache hits nothing either way (C's p was evicted before it came).
    assert (m["prefix_hits"]["a"], m["prefix_hits"]["b"]) == (0, 0)
    table = _run("compare", tmp_path / "off", tmp_path / "on").stdout
    assert "CPU tier hit rate" in table and "21.12%" in table and "+56 KiB" in table
    # Two runs without a tier compare as before: no offload rows.
    plain = _metrics(_run("compare", tmp_path / "off", tmp_path / "off", "--format", "json").stdout)
    assert "offload_hits" not in plain and "prefix_hits" not in plain


def test_compare_shows_the_disk_tier(tmp_path):
    # tests/test_offload_disk.py's first case: a CPU tier of 9 chunks with and without the disk tier.
    # With it, C's prefix (evicted from the GPU and the CPU tier) is read back from disk: the disk is
    # asked for 26 chunks (A 4 + 1, B 9 + 1, C 5 + 5 + 1), finds 4, reads them back and keeps the 14
    # chunks written to it; without it nothing of the disk counts (0).
    import sys

    from aisim.config.engine import engine_config_from_dict
    from aisim.output import write_result
    from aisim.replay import replay

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from helpers import make_trace
    from test_offload_disk import REQS
    from test_kv_offload import _engine

    for name, extra in (("cpu", {}), ("disk", {"disk_tier": True})):
        write_result(replay(make_trace(REQS), engine_config_from_dict(_engine(11, cpu_blocks=9, **extra))),
                     str(tmp_path / name))
    r = _run("compare", tmp_path / "cpu", tmp_path / "disk", "--format", "json")
    assert r.exit_code == 0, r.output
    m = _metrics(r.stdout)
    got = {k: (m[k]["a"], m[k]["b"]) for k in ("offload_disk_chunks", "offload_disk_queries", "offload_disk_hits",
                                               "offload_disk_promoted_chunks", "offload_disk_written_chunks")}
    assert got == {"offload_disk_chunks": (0, 14), "offload_disk_queries": (0, 26), "offload_disk_hits": (0, 4),
                   "offload_disk_promoted_chunks": (0, 4), "offload_disk_written_chunks": (0, 14)}
    assert m["offload_disk_hit_rate"]["a"] is None and m["offload_disk_hit_rate"]["b"] == pytest.approx(4 / 26)
    # The CPU tier's hits: C's 64 tokens with the disk tier, none without.
    assert (m["offload_hits"]["a"], m["offload_hits"]["b"]) == (0, 64)
    assert "disk tier hit rate" in _run("compare", tmp_path / "cpu", tmp_path / "disk").stdout


def test_a_report_never_lands_on_a_replay_folders_file(runs, tmp_path):
    # A report written over a side's summary.json would leave that folder unreadable: refused, nothing written.
    import shutil

    a = tmp_path / "A"
    shutil.copytree(runs / "A", a)
    before = {f.name: f.read_bytes() for f in a.iterdir()}
    for name in ("summary.json", "steps.parquet"):
        r = _run("compare", a, runs / "B", "--report", a / name)
        assert r.exit_code == 2
        assert r.output == (f"error: --report {a / name} is RUN_A {a / name}, an input of this run; aisim never "
                            "writes over its inputs\n")
        r = _run("compare", runs / "B", a, "--report", a / name)
        assert r.exit_code == 2 and f"is RUN_B {a / name}, an input" in r.output
        r = _run("report", "--replay", a, "--out", a / name)
        assert r.exit_code == 2
        assert r.output == (f"error: --out {a / name} is --replay {a / name}, an input of this run; aisim never "
                            "writes over its inputs\n")
    assert {f.name: f.read_bytes() for f in a.iterdir()} == before


def test_an_unreadable_summary_is_named_with_its_line(runs, tmp_path):
    import shutil

    a = tmp_path / "A"
    shutil.copytree(runs / "A", a)
    (a / "summary.json").write_text('{\n  "requests": 2,\n  oops\n}\n')
    r = _run("compare", a, runs / "B")
    assert r.exit_code == 2
    assert r.output == (f"error: {a / 'summary.json'}:3: not valid JSON (Expecting property name enclosed in double "
                        f"quotes); is {a} a folder aisim replay --out wrote?\n")
