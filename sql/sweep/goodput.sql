-- query: goodput
-- purpose: what aisim sweep ranks its candidates by: per engine configuration (candidate) of one
--          run, the requests meeting the SLO (slo_attainment's one definition), the finished ones,
--          all of them, and goodput and attainment (0 when there is no duration or no request).
-- grain:   one row per engine of the run (one shard per candidate).
-- sources: slo_attainment (requests, summaries, runs, shards).
-- param run VARCHAR: the sweep's run id
-- param ttft_s DOUBLE = NULL: TTFT threshold in seconds (NULL: no limit)
-- param tpot_s DOUBLE = NULL: TPOT threshold in seconds (NULL: no limit)
-- param e2e_s DOUBLE = NULL: E2E threshold in seconds (NULL: no limit)
SELECT
    engine,                                    -- the candidate
    slo_met,                                   -- requests meeting the SLO
    finished,                                  -- requests finished
    requests,                                  -- requests replayed
    coalesce(goodput_req_s, 0.0) AS goodput_req_s,  -- SLO-meeting requests per second
    coalesce(attainment, 0.0) AS attainment    -- their share of the requests
FROM slo_attainment($ttft_s, $tpot_s, e2e_slo_s := $e2e_s)
WHERE run_id = $run
ORDER BY engine;
