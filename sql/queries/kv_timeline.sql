-- query: kv_timeline
-- purpose: KV-cache occupancy of one run over simulated time, in buckets: mean and peak kv_usage (active
--          blocks) and physical usage, cached blocks, and the queues, for plotting or eyeballing pressure.
-- grain:   one row per (model, engine, bucket) of the run.
-- sources: kv_cache_timeline (steps, runs, shards), resolve_run (runs).
-- param run VARCHAR = NULL: run name, run id or id prefix (default: the latest run)
-- param model VARCHAR = NULL: only this model (default: all)
-- param bucket_s DOUBLE = 5.0: bucket width in simulated seconds
SELECT
    model,                                                     -- model
    engine,                                                    -- engine configuration
    floor(clock_s / $bucket_s) * $bucket_s AS t_s,             -- bucket start
    count(*) AS steps,                                         -- steps in the bucket
    round(avg(kv_usage), 4) AS kv_usage_mean,                  -- mean kv_usage (active blocks)
    round(max(kv_usage), 4) AS kv_usage_max,                   -- peak kv_usage
    round(avg(cached_usage), 4) AS cached_usage_mean,          -- mean cached usage
    round(max(physical_usage), 4) AS physical_usage_max,       -- peak physical usage
    max(running) AS running_max,                               -- most requests running
    max(waiting) AS waiting_max                                -- most requests waiting
FROM kv_cache_timeline
WHERE run_id = resolve_run($run) AND ($model IS NULL OR model = $model)
GROUP BY model, engine, t_s
ORDER BY model, engine, t_s;
