"""``aisim compare RUN_A RUN_B``: two replays side by side, B's change from A per metric.

A side is a replay's output folder (``aisim replay --out DIR``) or a run in a database (``--db
FILE``; a run id, run name or id prefix, as ``aisim query`` and ``aisim report`` pick runs).  Both
are read into the report's shard data (:mod:`aisim.report.folder`, :mod:`aisim.report.data`), so a
folder and a landed run of the same replay compare equal.  Runs of several shards compare shard by
shard, in shard order.  The metrics are the ``summaries`` columns of :data:`METRICS`; the delta is
``B - A`` and the relative change ``(B - A) / A`` (none when A is 0 or either is missing).  A shard
pair where either side had a KV offload tier adds the tiers' totals, :data:`OFFLOAD_METRICS`: each
tier's hits and hit rate, the CPU tier's loads, stores, bytes and evictions (0 on a side without a
tier; docs/kv-offload.md).
"""

from __future__ import annotations

import os

from aisim.errors import ReportError

# (summaries column, label, kind): kind formats the value (count, seconds, fraction, rate).
METRICS = (
    ("requests", "requests", "count"),
    ("finished", "finished", "count"),
    ("steps", "engine steps", "count"),
    ("duration_s", "duration", "seconds"),
    ("throughput_req_s", "throughput, req/s", "rate"),
    ("throughput_tok_s", "output tok/s", "rate"),
    ("ttft_mean_s", "TTFT mean", "seconds"),
    ("ttft_p50_s", "TTFT p50", "seconds"),
    ("ttft_p90_s", "TTFT p90", "seconds"),
    ("ttft_p99_s", "TTFT p99", "seconds"),
    ("tpot_mean_s", "TPOT mean", "seconds"),
    ("tpot_p50_s", "TPOT p50", "seconds"),
    ("tpot_p99_s", "TPOT p99", "seconds"),
    ("itl_mean_s", "ITL mean", "seconds"),
    ("itl_p99_s", "ITL p99", "seconds"),
    ("e2e_mean_s", "E2E mean", "seconds"),
    ("e2e_p50_s", "E2E p50", "seconds"),
    ("e2e_p99_s", "E2E p99", "seconds"),
    ("prefix_hit_rate", "prefix hit rate", "fraction"),
    ("preemptions", "preemptions", "count"),
    ("kv_usage_mean", "KV usage mean", "fraction"),
    ("kv_usage_max", "KV usage max", "fraction"),
)

# A pair of shards where either had a KV offload tier also compares these.  ``offload_hit_rate`` is
# derived as the offload_tiers view derives it: the tokens the CPU tier offered over the tokens
# asked of it (vLLM's connector_prefix_cache_stats), None when nothing was asked.
OFFLOAD_METRICS = (
    ("offload_cpu_chunks", "CPU tier size, blocks", "count"),
    ("prefix_hits", "GPU prefix cache hits, tokens", "count"),
    ("offload_queries", "CPU tier queries, tokens", "count"),
    ("offload_hits", "CPU tier hits, tokens", "count"),
    ("offload_hit_rate", "CPU tier hit rate", "fraction"),
    ("offload_loads", "CPU tier loads", "count"),
    ("offload_load_tokens", "CPU tier tokens loaded", "count"),
    ("offload_load_bytes", "CPU tier bytes loaded", "bytes"),
    ("offload_stores", "CPU tier stores", "count"),
    ("offload_store_chunks", "CPU tier blocks stored", "count"),
    ("offload_store_bytes", "CPU tier bytes stored", "bytes"),
    ("offload_cpu_evicted", "CPU tier blocks evicted", "count"),
)

# With a disk tier behind the CPU tier on either side, also these totals of the summary's
# ``kv_offload.disk`` (0 on a side without one); ``disk_hit_rate`` is hits over queries (chunk lookups
# that reached the disk tier).
DISK_METRICS = (
    ("disk_chunks", "disk tier blocks held", "count"),
    ("queries", "disk tier queries, blocks", "count"),
    ("hits", "disk tier hits, blocks", "count"),
    ("disk_hit_rate", "disk tier hit rate", "fraction"),
    ("promoted_chunks", "disk tier blocks read back", "count"),
    ("written_chunks", "disk tier blocks written", "count"),
    ("read_bytes", "disk tier bytes read", "bytes"),
    ("write_bytes", "disk tier bytes written", "bytes"),
)


def _disk(summary: dict):
    """A side's disk tier totals (``kv_offload.disk`` of its summary), or None."""
    return ((summary.get("summary_detail") or {}).get("kv_offload") or {}).get("disk")


def _disk_metric(summary: dict, key: str):
    d = _disk(summary) or {}
    if key == "disk_hit_rate":
        return d["hits"] / d["queries"] if d.get("queries") else None
    return _value(d.get(key, 0))


def _has_tier(summary: dict) -> bool:
    return bool(summary.get("offload_cpu_chunks") or 0)


def _metric(summary: dict, key: str, offload: bool):
    """One side's value of ``key``; an offload total of a side without a tier is 0."""
    if key == "offload_hit_rate":
        q, h = _metric(summary, "offload_queries", offload), _metric(summary, "offload_hits", offload)
        return h / q if q else None
    v = _value(summary.get(key))
    return 0 if v is None and offload and key.startswith("offload_") and not _has_tier(summary) else v


def load_side(selector: str, database: str | None, first_id: int = 0):
    """The shards of one side: a replay folder, or a run of ``database``; and its label.

    Returns
    -------
    (list of ShardData, str)
    """
    import os

    from aisim.report.folder import is_replay_folder, load_folder

    if is_replay_folder(selector):
        sd = load_folder(selector, first_id)
        return [sd], os.path.basename(os.path.normpath(selector))
    if database is None:
        if os.path.isdir(selector):
            load_folder(selector)  # names what the folder lacks
        raise ReportError(f"{selector} is not a replay output folder; to compare runs of a database, give --db FILE")
    from aisim.report.data import load_run

    rd = load_run(database, selector)
    for i, sd in enumerate(rd.shards):
        sd.shard["shard_id"] = first_id + i
    return rd.shards, f"{rd.run['name']} ({rd.run['run_id'][:12]})"


def compare_rows(a: list, b: list) -> list:
    """One row per shard pair and metric: shard, metric, label, kind, a, b, delta, relative.

    Raises
    ------
    ReportError
        The sides have different numbers of shards.
    """
    if len(a) != len(b):
        raise ReportError(f"the runs have {len(a)} and {len(b)} shards; compare runs of the same shards")
    rows = []
    for i, (sa, sb) in enumerate(zip(a, b)):
        offload = _has_tier(sa.summary) or _has_tier(sb.summary)
        for key, label, kind in METRICS + (OFFLOAD_METRICS if offload else ()):
            va, vb = _metric(sa.summary, key, offload), _metric(sb.summary, key, offload)
            delta = vb - va if va is not None and vb is not None else None
            rel = delta / va if delta is not None and va != 0 else None
            rows.append({"shard": i, "metric": key, "label": label, "kind": kind, "a": va, "b": vb,
                         "delta": delta, "relative": rel})
        if _disk(sa.summary) is not None or _disk(sb.summary) is not None:
            for key, label, kind in DISK_METRICS:
                va, vb = _disk_metric(sa.summary, key), _disk_metric(sb.summary, key)
                delta = vb - va if va is not None and vb is not None else None
                rel = delta / va if delta is not None and va != 0 else None
                rows.append({"shard": i, "metric": "offload_disk_" + key.replace("disk_", "", 1), "label": label,
                             "kind": kind, "a": va, "b": vb, "delta": delta, "relative": rel})
    return rows


def _value(v):
    import math

    if v is None or isinstance(v, bool):
        return None
    v = float(v) if not isinstance(v, int) else v
    return None if isinstance(v, float) and math.isnan(v) else v


def compare_run(a: list, b: list, label_a: str, label_b: str, slo: dict | None = None):
    """The report's :class:`~aisim.report.data.RunData` with both sides' shards (A's first), for ``--report``."""
    from aisim import __version__
    from aisim.report.data import RunData

    shards = []
    for side, label in ((a, label_a), (b, label_b)):
        for sd in side:
            sd.shard["engine"] = f"{label}: {sd.shard['engine']}" if len(side) > 1 else label
            sd.shard["shard_id"] = len(shards)
            shards.append(sd)
    folders = [sd.shard.get("folder") or label for sd, label in ((a[0], label_a), (b[0], label_b))]
    run = {"name": f"{label_a} vs {label_b}", "run_id": "compare", "folders": folders, "aisim_version": __version__}
    return RunData(database=", ".join(folders), run=run, shards=shards, runs_in_db=0, same_name=0,
                   note="aisim compare", slo=dict(slo or {}))


def _text(kind: str, v) -> str:
    from aisim.cli_util import fmt_num, fmt_pct, fmt_seconds

    if v is None:
        return "-"
    if kind == "seconds":
        return fmt_seconds(v)
    if kind == "fraction":
        return fmt_pct(v, 2)
    if kind == "rate":
        return fmt_num(float(v), 3)
    if kind == "bytes":
        from aisim.report.svg import fmt_bytes

        return fmt_bytes(v)
    return fmt_num(v)


def _delta_text(kind: str, v) -> str:
    if v is None:
        return "-"
    sign = "+" if v > 0 else "-" if v < 0 else "±"
    if kind == "fraction":  # a change of a share, in percentage points
        return f"{sign}{abs(v) * 100:.2f} pp"
    return sign + _text(kind, abs(v))


def _command():
    import click

    from aisim.cli_util import CONTEXT_SETTINGS, format_option, out_option

    @click.command("compare", context_settings=CONTEXT_SETTINGS)
    @click.argument("run_a", metavar="RUN_A")
    @click.argument("run_b", metavar="RUN_B")
    @click.option("--db", "database", envvar="AISIM_DB", type=click.Path(dir_okay=False),
                  help="The run database, when RUN_A or RUN_B is a run (id, name or id prefix) rather than a "
                       "replay output folder (default: $AISIM_DB).")
    @out_option("--report", "report_path", help="Also write an HTML report with both replays (their CDFs overlaid).")
    @click.option("--slo", "slo", multiple=True, metavar="KEY=SECONDS",
                  help="A latency threshold drawn on the report's charts: ttft_s, tpot_s or e2e_s (repeatable).")
    @format_option()
    def compare(run_a, run_b, database, report_path, slo, fmt):
        """Compare two replays: RUN_A and RUN_B are replay output folders (aisim replay --out) or runs of
        --db; prints each metric for A and B and B's change.

        \b
        Example (prefix caching off against on):
          aisim replay --engine e.toml --trace t.jsonl --out on/
          aisim replay --engine e.toml --trace t.jsonl --set enable_prefix_caching=false --out off/
          aisim compare on/ off/ --report on-off.html
        """
        from aisim.cli_util import console, echo_csv, echo_json, fail, new_table
        from aisim.errors import AisimError

        try:
            a, label_a = load_side(run_a, database)
            b, label_b = load_side(run_b, database, len(a))
            rows = compare_rows(a, b)
            if report_path:
                from aisim.files import write_text
                from aisim.report.cli import parse_slo
                from aisim.report.folder import folder_files
                from aisim.report.html import render

                # A side's folder is its three files: the report never lands on one of them.
                write_text(report_path, [render(compare_run(a, b, label_a, label_b, parse_slo(slo)))], "--report",
                           inputs={"RUN_A": folder_files(run_a) if os.path.exists(run_a) else None,
                                   "RUN_B": folder_files(run_b) if os.path.exists(run_b) else None,
                                   "--db": database})
        except AisimError as exc:
            fail(exc)
        several = len(a) > 1
        if fmt == "json":
            echo_json({"a": label_a, "b": label_b,
                       "metrics": [{k: r[k] for k in ("shard", "metric", "a", "b", "delta", "relative")}
                                   for r in rows]})
        elif fmt == "csv":
            echo_csv(["shard", "metric", "a", "b", "delta", "relative"],
                     [[r[k] for k in ("shard", "metric", "a", "b", "delta", "relative")] for r in rows])
        else:
            cols = ((("shard", {"justify": "right"}),) if several else ()) + (
                "metric", (f"A: {label_a}", {"justify": "right"}), (f"B: {label_b}", {"justify": "right"}),
                ("B - A", {"justify": "right"}), ("change", {"justify": "right"}))
            t = new_table(*cols, title=f"B against A")
            for r in rows:
                rel = "-" if r["relative"] is None else f"{r['relative'] * 100:+.1f}%"
                t.add_row(*((str(r["shard"]),) if several else ()), r["label"], _text(r["kind"], r["a"]),
                          _text(r["kind"], r["b"]), _delta_text(r["kind"], r["delta"]), rel)
            console().print(t)
        if report_path:
            console(stderr=fmt != "table").print(f"report written to {report_path}")

    return compare


compare = _command()
