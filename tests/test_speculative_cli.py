"""Speculative decoding end to end: ``aisim replay`` files, a pipeline run, the query and the report.

The llama sample trace (2,000 requests) replays on ``examples/engine.json``
and on ``examples/engine-eagle.json`` (the same engine with EAGLE, k = 3, the
hash rule at 800/600/400 permille, a drafter at a tenth of the step).  The
hash rule's expected acceptance per verification is 0.8 + 0.8 * 0.6 + 0.8 *
0.6 * 0.4 = 1.472 of 3 drafts (49 %); the replay lands within a point of it.
"""

import json
import os

import duckdb
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aisim.cli import main
from aisim.pipeline.run import run_pipeline
from aisim.pipeline.spec import spec_from_dict
from aisim.query.runner import run_query

from test_pipeline_common import EXAMPLES, PIPELINES

TRACE = os.path.join(EXAMPLES, "trace.jsonl")
EAGLE = os.path.join(EXAMPLES, "engine-eagle.json")


def test_replay_writes_the_speculative_columns_and_log(tmp_path):
    out, log = tmp_path / "out", tmp_path / "d.jsonl"
    r = CliRunner().invoke(main, ["replay", "--engine", EAGLE, "--trace", TRACE, "--out", str(out),
                                  "--decision-log", str(log)])
    assert r.exit_code == 0, r.output
    assert "draft acceptance" in r.output
    requests = pq.read_table(out / "requests.parquet")
    steps = pq.read_table(out / "steps.parquet")
    summary = json.loads((out / "summary.json").read_text())
    drafts = sum(requests.column("spec_drafts").to_pylist())
    accepted = sum(requests.column("spec_accepted").to_pylist())
    assert drafts == sum(steps.column("spec_tokens").to_pylist()) == summary["spec"]["draft_tokens"]
    assert accepted == sum(steps.column("spec_accepted").to_pylist()) == summary["spec"]["accepted_tokens"]
    assert summary["spec"]["acceptance_rate"] == pytest.approx(1.472 / 3, abs=0.01)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert lines[0]["speculative"]["num_hash_lookahead_tokens"] == 1
    assert lines[0]["speculative"]["drafter_cost"] == 0.1
    # (the asynchronous engine's drain lines schedule nothing: no "spec")
    assert sum(m for line in lines[1:-1] for m, _ in line.get("spec", {}).values()) == drafts
    assert lines[-1]["spec"]["draft_tokens"] == drafts


def test_bad_speculative_configuration_exits_2(tmp_path):
    with open(EAGLE) as fh:
        cfg = json.load(fh)
    cfg["speculative"]["acceptance"] = {"permille": [800, 1200]}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(cfg))
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["replay", "--engine", str(path), "--trace", TRACE, "--out", str(out)])
    assert r.exit_code == 2
    assert "'speculative.acceptance.permille'" in r.output and str(path) in r.output
    assert not out.exists()


@pytest.fixture(scope="module")
def landed(tmp_path_factory):
    db = tmp_path_factory.mktemp("spec") / "spec.duckdb"
    spec = spec_from_dict({
        "name": "spec", "database": str(db),
        "sources": [{"name": "llama-chat", "paths": [TRACE], "format": "oracle", "model": "llama-3.1-8b"}],
        "deployments": [{"model": "llama-3.1-8b", "engines": {"base": os.path.join(EXAMPLES, "engine.json"),
                                                              "eagle": EAGLE}}],
    }, source="spec.toml", base_dir=PIPELINES)
    run_pipeline(spec, scheduler="sync")
    return str(db)


def test_pipeline_lands_the_speculative_columns(landed):
    con = duckdb.connect(landed, read_only=True)
    try:
        rows = con.execute("SELECT shard_id, sum(spec_drafts), sum(spec_accepted) FROM requests GROUP BY 1 "
                           "ORDER BY 1").fetchall()
        steps = con.execute("SELECT shard_id, sum(spec_tokens), sum(spec_accepted) FROM steps GROUP BY 1 "
                            "ORDER BY 1").fetchall()
        detail = json.loads(con.execute("SELECT summary_json FROM summaries WHERE shard_id = 1").fetchone()[0])
    finally:
        con.close()
    assert rows[0][1:] == (0, 0) and steps[0][1:] == (0, 0)
    assert rows[1][1:] == steps[1][1:] == (detail["spec"]["draft_tokens"], detail["spec"]["accepted_tokens"])


def test_spec_acceptance_query(landed):
    cols, rows = run_query(landed, "spec_acceptance", params={})
    got = [dict(zip(cols, r)) for r in rows]
    assert [(g["engine"], g["draft_tokens"] > 0) for g in got] == [("base", False), ("eagle", True)]
    base, eagle = got
    assert base["acceptance_rate"] is None and base["tpot_ratio"] == 1.0
    assert eagle["acceptance_rate"] == pytest.approx(eagle["accepted_tokens"] / eagle["draft_tokens"], abs=1e-4)
    assert eagle["acceptance_rate_p10"] <= eagle["acceptance_rate_p50"] <= eagle["acceptance_rate_p90"]
    # Two to three tokens a step at a 10 % drafting overhead: TPOT well under the base engine's.
    assert eagle["tpot_p50_without_s"] == base["tpot_p50_s"] and eagle["tpot_ratio"] < 0.6


def test_report_shows_the_speculative_panel_for_the_drafting_shard_only(landed, tmp_path):
    from aisim.report import write_report

    out = tmp_path / "r.html"
    write_report(landed, str(out))
    html = out.read_text()
    base, eagle = html.split('id="shard-1"')
    assert "Speculative decoding" not in base.split('id="shard-0"')[1]
    assert "Speculative decoding" in eagle and 'data-key="spec_acceptance_rate"' in eagle
    assert 'id="cmp-spec-tpot"' in html and 'id="spec-tpot-1"' in html


def test_config_show_derives_the_scheduler_view():
    r = CliRunner().invoke(main, ["config", "show", EAGLE, "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["speculative"] == {"num_speculative_tokens": 3, "method": "eagle", "drafter_cost": 0.1,
                                "acceptance": {"permille": [800, 600, 400], "seed": 1}}
    # 0.33.0 (the default): lookahead hashes instead of the block drop; one 16-token block holds 1 + 3 + 3 slots.
    assert d["derived"]["speculative"] == {
        "num_lookahead_tokens": 3, "num_prefill_lookahead_tokens": 1, "draft_slots": 0, "use_eagle": True,
        "use_eagle_block_drop": False, "num_hash_lookahead_tokens": 1, "spec_decode_step_blocks": 1,
        "num_speculative_blocks": []}
