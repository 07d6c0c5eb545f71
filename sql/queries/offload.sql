-- query: offload
-- purpose: KV offload in one run, per model and engine: hit rate per tier (GPU prefix cache, CPU
--          tier), the tier's traffic, and TTFT against the same model's engines without a tier in
--          the run (what the tier bought).
-- grain:   one row per (model, engine) of the run.
-- sources: offload_tiers (summaries, steps, runs, shards), resolve_run (runs).
-- param run VARCHAR = NULL: run name, run id or id prefix (default: the latest run)
WITH run AS (
    SELECT * FROM offload_tiers WHERE run_id = resolve_run($run)
),
without AS (
    SELECT model, median(ttft_p50_s) AS ttft_p50_s, median(ttft_p99_s) AS ttft_p99_s
    FROM run
    WHERE cpu_chunks = 0
    GROUP BY model
)
SELECT
    r.model,                                                        -- model
    r.engine,                                                       -- engine configuration
    r.requests,                                                     -- requests replayed
    r.cpu_chunks,                                                   -- CPU tier size, offloaded blocks (0: none)
    round(r.gpu_hit_rate, 4) AS gpu_hit_rate,                       -- GPU prefix cache hit rate
    round(r.cpu_hit_rate, 4) AS cpu_hit_rate,                       -- CPU tier hit rate (NULL: no tier)
    r.loads,                                                        -- load jobs
    r.load_tokens,                                                  -- tokens loaded from the CPU tier
    r.store_chunks,                                                 -- offloaded blocks written
    r.cpu_evicted,                                                  -- offloaded blocks evicted
    round(r.ttft_p50_s, 5) AS ttft_p50_s,                           -- TTFT median
    round(r.ttft_p99_s, 5) AS ttft_p99_s,                           -- TTFT 99th percentile
    round(w.ttft_p50_s, 5) AS ttft_p50_without_s,                   -- TTFT median of the model's engines without a tier
    round(r.ttft_p99_s / w.ttft_p99_s, 4) AS ttft_p99_ratio         -- p99 with / without (below 1: the tier pays)
FROM run AS r
LEFT JOIN without AS w USING (model)
ORDER BY r.model, r.engine;
