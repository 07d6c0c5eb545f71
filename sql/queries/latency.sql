-- query: latency
-- purpose: latency percentiles (TTFT, TPOT, ITL, E2E, queueing) of one run, per model and engine.
-- grain:   one row per (model, engine) of the run.
-- sources: latency_percentiles (requests, runs, shards), resolve_run (runs).
-- param run VARCHAR = NULL: run name, run id or id prefix (default: the latest run)
SELECT
    model,                                     -- model
    engine,                                    -- engine configuration
    requests,                                  -- requests replayed
    finished,                                  -- of those, finished
    round(ttft_p50_s, 4) AS ttft_p50_s,        -- TTFT median
    round(ttft_p90_s, 4) AS ttft_p90_s,        -- TTFT 90th percentile
    round(ttft_p99_s, 4) AS ttft_p99_s,        -- TTFT 99th percentile
    round(tpot_p50_s, 5) AS tpot_p50_s,        -- TPOT median
    round(tpot_p99_s, 5) AS tpot_p99_s,        -- TPOT 99th percentile
    round(itl_p50_s, 5) AS itl_p50_s,          -- ITL median
    round(itl_p99_s, 5) AS itl_p99_s,          -- ITL 99th percentile
    round(e2e_p50_s, 4) AS e2e_p50_s,          -- E2E median
    round(e2e_p99_s, 4) AS e2e_p99_s,          -- E2E 99th percentile
    round(queue_p99_s, 4) AS queue_p99_s       -- queueing delay, 99th percentile
FROM latency_percentiles
WHERE run_id = resolve_run($run)
ORDER BY model, engine;
