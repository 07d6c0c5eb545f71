"""The report's deployment panel: how a deployment shard's router spread the load.

A shard that replayed a deployment (replicas of one engine behind a router) gets a panel in
its section, beside the deployment's totals (its ``summaries`` row): one row per replica (the
``replicas`` table) with its requests and their share, prefix-cache hit rate, busy time and
utilisation, TTFT and KV-cache peak; the imbalance, max over mean across the replicas of
requests and of busy time (as the ``replica_balance`` view computes it; 1.0 is a perfect
balance); and bars of requests and of utilisation per replica.  A disaggregated deployment's
replicas name their pool (prefill or decode), and shares and imbalances are within the pool.  A
shard replayed on one engine shows nothing of this.
"""

from __future__ import annotations

import json
from html import escape

from aisim.report.data import ShardData
from aisim.report.svg import bar_chart, fmt_count, fmt_duration, fmt_pct


def _num(v):
    return None if v is None else float(v)


def imbalance(values: list):
    """max / mean of ``values`` (None when the mean is 0 or there are none)."""
    vals = [float(v) for v in values if v is not None]
    mean = sum(vals) / len(vals) if vals else 0.0
    return max(vals) / mean if mean > 0 else None


def balance(sd: ShardData, pool: str | None = None) -> dict:
    """The deployment's balance: ``replicas`` (count), ``router``, ``requests`` and ``busy_s``
    (per replica), ``request_imbalance`` and ``busy_imbalance`` (max / mean); of a disaggregated
    deployment's ``pool`` ("prefill" or "decode") when given."""
    reps = [r for r in sd.replicas if pool is None or r.get("pool") == pool]
    req = [int(r["requests"]) for r in reps]
    busy = [_num(r["busy_s"]) for r in reps]
    router = sd.shard.get("router")
    if pool is not None:  # the pool's own router, as the deployment's settings give it
        router = json.loads(sd.shard["deployment_config"])[pool]["router"]["kind"]
    return {"replicas": len(reps), "router": router, "requests": req, "busy_s": busy,
            "request_imbalance": imbalance(req), "busy_imbalance": imbalance(busy)}


def _td(key: str, value, text: str, cls: str = "num") -> str:
    data = "" if value is None else f' data-value="{float(value)!r}"'
    return f'<td class="{cls}" data-key="{escape(key)}"{data}>{escape(text)}</td>'


def _pct(v) -> str:
    return fmt_pct(v) if v is not None else "-"


def _dur(v) -> str:
    return fmt_duration(v) if v is not None else "-"


# A disaggregated deployment's pools, in the replicas' order.
POOLS = ("prefill", "decode")


def _label(r: dict) -> str:
    return f"replica {r['replica']}" + (f" ({r['pool']})" if r.get("pool") else "")


HEADERS = ("replica", "requests", "share", "prefix hits", "busy", "utilisation", "TTFT p50", "TTFT p99",
           "KV active peak")


def _row(label: str, key: str, r: dict, share, util) -> str:
    cells = [f'<td class="txt">{escape(label)}</td>',
             _td("requests", r.get("requests"), fmt_count(r.get("requests"))),
             _td("share", share, _pct(share)),
             _td("prefix_hit_rate", _num(r.get("prefix_hit_rate")), _pct(_num(r.get("prefix_hit_rate")))),
             _td("busy_s", _num(r.get("busy_s")), _dur(_num(r.get("busy_s")))),
             _td("utilisation", util, _pct(util)),
             _td("ttft_p50_s", _num(r.get("ttft_p50_s")), _dur(_num(r.get("ttft_p50_s")))),
             _td("ttft_p99_s", _num(r.get("ttft_p99_s")), _dur(_num(r.get("ttft_p99_s")))),
             _td("kv_usage_max", _num(r.get("kv_usage_max")), _pct(_num(r.get("kv_usage_max"))))]
    return f'<tr data-replica="{escape(key)}">{"".join(cells)}</tr>'


def replica_panel(sd: ShardData) -> str:
    """The deployment panel of a shard's section ("" for a shard replayed on one engine)."""
    reps = sd.replicas
    if not reps:
        return ""
    sid = sd.shard_id
    pools = [p for p in POOLS if any(r.get("pool") == p for r in reps)]
    b = balance(sd)
    total = sum(b["requests"])
    # A disaggregated deployment's share is within the pool: each request visits one replica of each.
    within = {p: sum(int(r["requests"]) for r in reps if r.get("pool") == p) for p in pools}
    rows = [_row(_label(r), str(r["replica"]), r,
                 (r["requests"] / within[r["pool"]] if within[r["pool"]] else None) if r.get("pool") in within
                 else r["requests"] / total if total else None, _num(r.get("utilisation"))) for r in reps]
    s = sd.summary
    busy = [v for v in b["busy_s"] if v is not None]
    utils = [_num(r.get("utilisation")) for r in reps if r.get("utilisation") is not None]
    totals = dict(s, busy_s=sum(busy) if busy else None)
    rows.append(_row("deployment", "all", totals, 1.0 if total else None,
                     sum(utils) / len(utils) if utils else None).replace("<tr ", '<tr class="total" ', 1))
    head = "".join(f"<th>{escape(h)}</th>" for h in HEADERS)
    table = (f'<div class="scroll"><table class="summary replicas" id="replicas-{sid}"><thead><tr>{head}</tr></thead>'
             f'<tbody>{"".join(rows)}</tbody></table></div>')

    def ratio(v):
        return f"{v:.3f}" if v is not None else "-"

    if pools:
        parts = []
        for p in pools:
            pb = balance(sd, p)
            parts.append(f'<span data-pool="{p}" data-request-imbalance="{ratio(pb["request_imbalance"])}" '
                         f'data-busy-imbalance="{ratio(pb["busy_imbalance"])}">{pb["replicas"]} {p} replicas '
                         f'behind the {escape(str(pb["router"]))} router (imbalance, max / mean over the pool, '
                         f'1 is even: requests {ratio(pb["request_imbalance"])}, busy time '
                         f'{ratio(pb["busy_imbalance"])})</span>')
        note = (f'<p class="engine" data-key="balance">Disaggregated: {"; ".join(parts)}. Every request is '
                "prefilled in one pool and decoded in the other, so shares are within a pool. The last row is "
                "the deployment's totals (utilisation: the replicas' mean).</p>")
    else:
        note = (f'<p class="engine" data-key="balance" data-request-imbalance="{ratio(b["request_imbalance"])}" '
                f'data-busy-imbalance="{ratio(b["busy_imbalance"])}">{b["replicas"]} replicas behind the '
                f'{escape(str(b["router"]))} router. Imbalance (max / mean over the replicas, 1 is even): requests '
                f'{ratio(b["request_imbalance"])}, busy time {ratio(b["busy_imbalance"])}. The last row is the '
                "deployment's totals (utilisation: the replicas' mean).</p>")
    cats = [_label(r) for r in reps]
    bars = [
        ("Requests per replica", bar_chart(cats, [("requests", [float(v) for v in b["requests"]], "blue")],
                                           title=f"Requests per replica, shard {sid}",
                                           chart_id=f"replica-requests-{sid}", fmt="count")),
        ("Utilisation and prefix hits per replica",
         bar_chart(cats, [("utilisation", [_num(r.get("utilisation")) for r in reps], "orange"),
                          ("prefix hit rate", [_num(r.get("prefix_hit_rate")) for r in reps], "green")],
                   title=f"Utilisation and prefix-cache hit rate per replica, shard {sid}",
                   chart_id=f"replica-util-{sid}", fmt="pct")),
    ]
    figs = "".join(f'<figure class="card"><figcaption>{escape(t)}</figcaption>{c}</figure>' for t, c in bars)
    return f'<h3>Replicas</h3>{note}{table}<div class="grid compare">{figs}</div>'


__all__ = ["balance", "imbalance", "replica_panel"]
