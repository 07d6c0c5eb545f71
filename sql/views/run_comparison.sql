-- view: run_comparison
-- purpose: run-to-run comparison: every shard's headline metrics beside those of the previous run
--          of the same name on the same (model, engine), with the differences (this minus
--          previous).  The first run of a name has NULL baselines.  For two arbitrary runs use the
--          named query `compare`.
-- grain:   one row per (run_id, model, engine).
-- sources: summaries, run_shards (runs, shards).
CREATE OR REPLACE VIEW run_comparison AS
WITH per AS (
    SELECT rs.run_id, rs.run_seq, rs.run_name, rs.model, rs.engine, sm.*
    EXCLUDE (run_id, shard_id, summary_json)
    FROM run_shards AS rs
    JOIN summaries AS sm USING (run_id, shard_id)
)
SELECT
    run_name,                                                    -- run name
    model,                                                       -- model
    engine,                                                      -- engine configuration
    run_id,                                                      -- this run
    run_seq,                                                     -- its landing order
    lag(run_id) OVER w AS base_run_id,                           -- the previous run of this name
    requests,                                                    -- requests replayed
    lag(requests) OVER w AS base_requests,                       -- in the previous run
    ttft_p50_s,                                                  -- TTFT median
    ttft_p50_s - lag(ttft_p50_s) OVER w AS ttft_p50_delta_s,     -- change
    ttft_p99_s,                                                  -- TTFT 99th percentile
    ttft_p99_s - lag(ttft_p99_s) OVER w AS ttft_p99_delta_s,     -- change
    tpot_p50_s,                                                  -- TPOT median
    tpot_p50_s - lag(tpot_p50_s) OVER w AS tpot_p50_delta_s,     -- change
    e2e_p50_s,                                                   -- E2E median
    e2e_p50_s - lag(e2e_p50_s) OVER w AS e2e_p50_delta_s,        -- change
    throughput_tok_s,                                            -- output tokens per second
    throughput_tok_s - lag(throughput_tok_s) OVER w AS throughput_tok_delta_s,  -- change
    prefix_hit_rate,                                             -- prefix-cache hit rate
    prefix_hit_rate - lag(prefix_hit_rate) OVER w AS prefix_hit_rate_delta,     -- change
    preemptions,                                                 -- preemptions
    preemptions - lag(preemptions) OVER w AS preemptions_delta   -- change
FROM per
WINDOW w AS (PARTITION BY run_name, model, engine ORDER BY run_seq);
