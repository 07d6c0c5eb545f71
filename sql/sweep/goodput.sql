-- query: goodput
-- purpose: what aisim sweep ranks its candidates by: per engine configuration (candidate) of one
--          run, the requests meeting the SLO (slo_attainment's one definition), the finished ones,
--          all of them, and goodput and attainment (0 when there is no duration or no request);
--          then the requests rejected for a prompt of max_model_len tokens or more (they count in
--          the requests and never meet the SLO) and the p99 TTFT and TPOT the ties are broken by.
-- grain:   one row per engine of the run (one shard per candidate).
-- sources: slo_attainment (requests, summaries, runs, shards), requests, summaries.
-- param run VARCHAR: the sweep's run id
-- param ttft_s DOUBLE = NULL: TTFT threshold in seconds (NULL: no limit)
-- param tpot_s DOUBLE = NULL: TPOT threshold in seconds (NULL: no limit)
-- param e2e_s DOUBLE = NULL: E2E threshold in seconds (NULL: no limit)
WITH rejected AS (
    SELECT shard_id, count(*) FILTER (WHERE status = 'rejected') AS rejected
    FROM requests
    WHERE run_id = $run
    GROUP BY shard_id
)
SELECT
    slo.engine,                                    -- the candidate
    slo.slo_met,                                   -- requests meeting the SLO
    slo.finished,                                  -- requests finished
    slo.requests,                                  -- requests replayed or rejected
    coalesce(slo.goodput_req_s, 0.0) AS goodput_req_s,  -- SLO-meeting requests per second
    coalesce(slo.attainment, 0.0) AS attainment,   -- their share of the requests
    rejected.rejected,                             -- requests rejected (prompt of max_model_len tokens or more)
    sm.ttft_p99_s,                                 -- p99 TTFT (NULL: no request got a first token)
    sm.tpot_p99_s                                  -- p99 TPOT (NULL: no finished request had one)
FROM slo_attainment($ttft_s, $tpot_s, e2e_slo_s := $e2e_s) AS slo
JOIN rejected USING (shard_id)
JOIN summaries AS sm ON sm.run_id = slo.run_id AND sm.shard_id = slo.shard_id
WHERE slo.run_id = $run
ORDER BY slo.engine;
