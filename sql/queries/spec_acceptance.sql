-- query: spec_acceptance
-- purpose: speculative decoding in one run, per model and engine: the acceptance rate, its
--          distribution over requests, and TPOT with speculative decoding against the same model's
--          engines without it in the run (the deployment's alternatives).
-- grain:   one row per (model, engine) of the run.
-- sources: spec_acceptance (requests, steps, runs, shards), resolve_run (runs).
-- param run VARCHAR = NULL: run name, run id or id prefix (default: the latest run)
WITH run AS (
    SELECT * FROM spec_acceptance WHERE run_id = resolve_run($run)
),
without AS (
    SELECT model, median(tpot_p50_s) AS tpot_p50_s
    FROM run
    WHERE draft_tokens = 0
    GROUP BY model
)
SELECT
    r.model,                                                        -- model
    r.engine,                                                       -- engine configuration
    r.requests,                                                     -- requests replayed
    r.draft_tokens,                                                 -- draft tokens verified (0: no speculative decoding)
    r.accepted_tokens,                                              -- of those, accepted
    round(r.acceptance_rate, 4) AS acceptance_rate,                 -- accepted / drafted
    round(r.acceptance_rate_p10, 4) AS acceptance_rate_p10,         -- per-request rate: 10th percentile
    round(r.acceptance_rate_p50, 4) AS acceptance_rate_p50,         -- median
    round(r.acceptance_rate_p90, 4) AS acceptance_rate_p90,         -- 90th percentile
    round(r.tpot_p50_s, 5) AS tpot_p50_s,                           -- TPOT median of this engine
    round(w.tpot_p50_s, 5) AS tpot_p50_without_s,                   -- TPOT median of the model's engines without drafts
    round(r.tpot_p50_s / w.tpot_p50_s, 4) AS tpot_ratio             -- with / without (below 1: drafts pay off)
FROM run AS r
LEFT JOIN without AS w USING (model)
ORDER BY r.model, r.engine;
