-- query: compare
-- purpose: two runs side by side per (model, engine): latency, throughput, prefix-cache hit rate
--          and preemptions of a baseline and another run, with the differences (other - base).
--          Shards present in only one run show NULLs for the other.
-- grain:   one row per (model, engine) in either run.
-- sources: summaries, run_shards (runs, shards), resolve_run (runs).
-- param other VARCHAR = NULL: the run to compare: name, id or id prefix (default: the latest run)
-- param base VARCHAR = NULL: the baseline run (default: the run of the same name landed before `other`)
WITH pick AS (
    SELECT o.run_id AS other_id,
           CASE WHEN $base IS NULL THEN (
               SELECT p.run_id FROM runs AS p
               WHERE p.name = o.name AND p.run_seq < o.run_seq
               ORDER BY p.run_seq DESC LIMIT 1)
           ELSE resolve_run($base) END AS base_id
    FROM runs AS o
    WHERE o.run_id = resolve_run($other)
), per AS (
    SELECT rs.run_id, rs.model, rs.engine, sm.requests, sm.ttft_p50_s, sm.ttft_p99_s, sm.tpot_p50_s,
           sm.itl_p99_s, sm.e2e_p50_s, sm.throughput_tok_s, sm.prefix_hit_rate, sm.preemptions
    FROM run_shards AS rs
    JOIN summaries AS sm USING (run_id, shard_id)
), b AS (
    SELECT per.* FROM per, pick WHERE per.run_id = pick.base_id
), o AS (
    SELECT per.* FROM per, pick WHERE per.run_id = pick.other_id
)
SELECT
    coalesce(o.model, b.model) AS model,                          -- model
    coalesce(o.engine, b.engine) AS engine,                       -- engine configuration
    b.run_id AS base_run_id,                                      -- baseline run
    o.run_id AS other_run_id,                                     -- compared run
    b.requests AS base_requests,                                  -- requests, baseline
    o.requests AS other_requests,                                 -- requests, other
    round(b.ttft_p50_s, 4) AS base_ttft_p50_s,                    -- TTFT median, baseline
    round(o.ttft_p50_s, 4) AS other_ttft_p50_s,                   -- TTFT median, other
    round(o.ttft_p50_s - b.ttft_p50_s, 4) AS ttft_p50_delta_s,    -- difference
    round(o.ttft_p99_s - b.ttft_p99_s, 4) AS ttft_p99_delta_s,    -- TTFT p99 difference
    round(o.tpot_p50_s - b.tpot_p50_s, 5) AS tpot_p50_delta_s,    -- TPOT median difference
    round(o.itl_p99_s - b.itl_p99_s, 5) AS itl_p99_delta_s,       -- ITL p99 difference
    round(o.e2e_p50_s - b.e2e_p50_s, 4) AS e2e_p50_delta_s,       -- E2E median difference
    round(o.throughput_tok_s - b.throughput_tok_s, 1) AS throughput_tok_delta_s,  -- output tok/s difference
    round(o.prefix_hit_rate - b.prefix_hit_rate, 4) AS prefix_hit_rate_delta,     -- hit-rate difference
    o.preemptions - b.preemptions AS preemptions_delta            -- preemptions difference
FROM b
FULL OUTER JOIN o USING (model, engine)
ORDER BY model, engine;
