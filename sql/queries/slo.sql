-- query: slo
-- purpose: SLO attainment and goodput of one run for a TTFT, a TPOT and optionally an E2E threshold,
--          per model and engine: which configuration serves the most requests within the SLO per
--          second (the SLO as slo_attainment defines it).
-- grain:   one row per (model, engine) of the run.
-- sources: slo_attainment (requests, summaries, runs, shards), resolve_run (runs).
-- param run VARCHAR = NULL: run name, run id or id prefix (default: the latest run)
-- param ttft_s DOUBLE = 1.0: TTFT threshold in seconds
-- param tpot_s DOUBLE = 0.05: TPOT threshold in seconds
-- param e2e_s DOUBLE = NULL: E2E threshold in seconds (default: no limit)
SELECT
    model,                                     -- model
    engine,                                    -- engine configuration
    requests,                                  -- requests replayed
    slo_met,                                   -- requests meeting every threshold
    round(attainment, 4) AS attainment,        -- their share
    round(goodput_req_s, 3) AS goodput_req_s,  -- SLO-meeting requests per second
    round(goodput_tok_s, 1) AS goodput_tok_s,  -- their output tokens per second
    round(throughput_req_s, 3) AS throughput_req_s  -- all finished requests per second
FROM slo_attainment($ttft_s, $tpot_s, e2e_slo_s := $e2e_s)
WHERE run_id = resolve_run($run)
ORDER BY model, goodput_req_s DESC, engine;
