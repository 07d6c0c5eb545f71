"""How a pipeline run shows itself: progress while it runs, one screen when it ends.

:func:`aisim.pipeline.run.run_pipeline` reports to any object with the
methods of :class:`Quiet` (the reporter that shows nothing); the command line
picks :class:`RichProgress` on a terminal and :class:`LineProgress` in logs,
and prints :func:`print_summary` at the end.  Nothing here changes what a run
computes or lands.
"""

from __future__ import annotations

from aisim.cli_util import fmt_num, fmt_pct, fmt_seconds, new_table


class Quiet:
    """A progress reporter that reports nothing (the interface of all of them)."""

    def start(self, run_id: str, name: str, plan: dict, scheduler: str) -> None:
        """The shards are about to be computed."""

    def event(self, event: str, kind: str, index: int, payload) -> None:
        """A task started running (``"running"``) or finished (``"done"``)."""

    def landing(self) -> None:
        """Computation finished; the landing transaction starts."""

    def stop(self) -> None:
        """The run ended (landed, skipped or failed)."""


class RichProgress(Quiet):
    """Live progress on a terminal: one bar per shard and one for the run.

    A shard's bar fills when its replay is done (a replay is one call into
    the compiled core, so there is nothing finer to show); its status says
    whether it waits, runs or finished, with its requests and task time.
    """

    def __init__(self, console):
        self.console = console
        self.progress = None

    def start(self, run_id, name, plan, scheduler):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.plan = plan
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=24),
                                 TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                                 console=self.console, transient=False)
        self.progress.start()
        self.overall = self.progress.add_task(f"[bold]run {name} ({run_id[:8]})", total=len(plan["shards"]),
                                              status=f"0/{len(plan['shards'])} shards on {scheduler}")
        self.bars = []
        for s in plan["shards"]:
            self.bars.append(self.progress.add_task(f"  {s['shard_id']}: {s['model']} / {s['engine']}", total=1,
                                                    status="waiting", start=False))
        self.done = 0

    def event(self, event, kind, index, payload):
        if kind != "shard":
            return
        bar = self.bars[index]
        if event == "running":
            self.progress.start_task(bar)
            self.progress.update(bar, status="replaying")
        elif event == "done":
            row = payload["shard"]
            self.progress.start_task(bar)
            self.progress.update(bar, completed=1, status=f"{fmt_num(row['requests'])} requests in {fmt_seconds(row['task_s'])}")
            self.progress.stop_task(bar)
            self.done += 1
            self.progress.update(self.overall, completed=self.done,
                                 status=f"{self.done}/{len(self.bars)} shards")

    def landing(self):
        self.progress.update(self.overall, status="landing in DuckDB")

    def stop(self):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class LineProgress(Quiet):
    """Progress as plain lines (logs, cron mail): one line per finished shard."""

    def __init__(self, console):
        self.console = console

    def start(self, run_id, name, plan, scheduler):
        self.plan = plan
        self.n = len(plan["shards"])
        self.done = 0
        self.console.print(f"run {name} ({run_id}): {self.n} shards, {len(plan['reads'])} input files, "
                           f"scheduler {scheduler}")

    def event(self, event, kind, index, payload):
        if kind == "shard" and event == "done":
            self.done += 1
            row = payload["shard"]
            self.console.print(f"[{self.done}/{self.n}] shard {index} {row['model']} / {row['engine']}: "
                               f"{fmt_num(row['requests'])} requests in {fmt_seconds(row['task_s'])}")
        elif kind == "search" and event == "done":
            s = self.plan["searches"][index]
            self.console.print(f"[{s['key']}] shard {s['shard_id']} {s['model']} / {s['engine']}: "
                               f"{fmt_num(payload['rows'][s['table']])} {s['table']} rows")

    def landing(self):
        self.console.print("landing in DuckDB")


def summary_record(report) -> dict:
    """The run report as plain data (``aisim pipeline run --format json``)."""
    import dataclasses

    return dataclasses.asdict(report)


def print_summary(report, console) -> None:
    """One screen: the run, its shards' headline numbers, where the rows went."""
    if not report.landed:
        console.print(f"run {report.name} ({report.run_id}) is already in {report.database}; nothing to do "
                      "(--force replaces it)")
        return

    verb = "replaced" if report.replaced else "landed"
    cols = [("#", {"justify": "right"}), "model / engine"]
    cols += [(c, {"justify": "right"}) for c in ("requests", "TTFT p50", "TTFT p99", "TPOT p50", "tok/s", "hit rate",
                                                  "preempt", "KV peak")]
    t = new_table(*cols, title=f"run {report.name} ({report.run_id}), #{report.run_seq} in {report.database}",
                  title_justify="left", box=None, pad_edge=False, header_style="bold underline")
    for s in report.shards:
        tok = s.get("throughput_tok_s")
        done, n = s.get("finished") or 0, s["requests"]
        t.add_row(str(s["shard_id"]), f"{s['model']} / {s['engine']}",
                  fmt_num(n) if done == n else f"{fmt_num(done)}/{fmt_num(n)}",
                  fmt_seconds(s.get("ttft_p50_s")), fmt_seconds(s.get("ttft_p99_s")), fmt_seconds(s.get("tpot_p50_s")),
                  fmt_num(tok, 0), fmt_pct(s.get("prefix_hit_rate")),
                  fmt_num(s.get("preemptions") or 0), fmt_pct(s.get("kv_usage_max")))
    console.print(t)
    rows = report.rows_landed
    rate = rows / report.land_s if report.land_s > 0 else 0.0
    console.print(f"{verb} {fmt_num(rows)} rows ({fmt_num(report.rows.get('requests', 0))} requests, "
                  f"{fmt_num(report.rows.get('steps', 0))} steps) in {fmt_seconds(report.land_s)} "
                  f"({fmt_num(rate, 0)} rows/s)")
    console.print(f"read {fmt_num(report.rows_read)} trace rows, {fmt_num(report.rows_in_window)} in the window"
                  + (f"; the readers skipped {fmt_num(report.rows_bad)} malformed rows" if report.rows_bad else "")
                  + (f"; skipped {fmt_num(report.rows_skipped)} of models without a deployment: "
                     + ", ".join(f"{m or '(none)'} {fmt_num(n)}" for m, n in report.skipped_models.items())
                     if report.rows_skipped else ""))
    start = f"cluster start {fmt_seconds(report.startup_s)}; " if report.startup_s >= 0.05 else ""
    console.print(f"wall {fmt_seconds(report.wall_s)} ({start}shards {fmt_seconds(report.compute_s)} on "
                  f"{report.scheduler}, {report.workers} worker{'s' if report.workers != 1 else ''}; "
                  f"landing {fmt_seconds(report.land_s)})")
    console.print(f"next: aisim query shards --db {report.database}")
