-- query: prefix_reuse
-- purpose: prefix-cache reuse of one run per model and engine: hit rate, cached share of prompt
--          tokens, requests that hit, and the cached blocks kept.
-- grain:   one row per (model, engine) of the run.
-- sources: prefix_reuse (requests, steps, runs, shards), resolve_run (runs).
-- param run VARCHAR = NULL: run name, run id or id prefix (default: the latest run)
SELECT
    model,                                               -- model
    engine,                                              -- engine configuration
    requests,                                            -- requests replayed
    round(request_hit_share, 4) AS request_hit_share,    -- share of requests with a hit at admission
    round(cached_token_share, 4) AS cached_token_share,  -- share of prompt tokens cached at admission
    round(prefix_hit_rate, 4) AS prefix_hit_rate,        -- hit rate as vLLM reports it
    preempted_prefix_hits,                               -- hit tokens of resumed requests
    cached_blocks_max                                    -- peak cached blocks
FROM prefix_reuse
WHERE run_id = resolve_run($run)
ORDER BY model, engine;
