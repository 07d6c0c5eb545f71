-- macro: slo_attainment(ttft_slo_s, tpot_slo_s, e2e_slo_s := NULL) -- a view with parameters (a table macro)
-- purpose: SLO attainment and goodput for given TTFT, TPOT and E2E thresholds (seconds), the one
--          definition of "meets the SLO" (aisim query slo and aisim sweep both use it).  As vLLM's
--          benchmarks count it: a request meets the SLO when it finished and every given threshold
--          holds; a NULL threshold is no limit, and a one-token output has no TPOT and passes that
--          half.  Goodput is the rate of requests (and of their output tokens) that met it, over
--          the shard's duration.
-- grain:   one row per (run_id, shard_id), i.e. per (run_id, model, engine).
-- sources: requests, summaries, run_shards (runs, shards).
-- usage:   SELECT * FROM slo_attainment(0.5, 0.05);  SELECT * FROM slo_attainment(0.5, 0.05, e2e_slo_s := 30);
-- The thresholds are an SLO's ttft_s, tpot_s and e2e_s (an [slo] table, aisim query slo's parameters);
-- here they are *_slo_s: a macro's parameter may not share a name with a column it reads.
CREATE OR REPLACE MACRO slo_attainment(ttft_slo_s, tpot_slo_s, e2e_slo_s := NULL) AS TABLE
WITH judged AS (
    SELECT
        run_id, shard_id, status, output_tokens,
        ttft_s IS NOT NULL AND (ttft_slo_s IS NULL OR ttft_s <= ttft_slo_s) AS ttft_ok,
        status = 'finished' AND (tpot_slo_s IS NULL OR coalesce(tpot_s <= tpot_slo_s, true)) AS tpot_ok,
        status = 'finished' AND (e2e_slo_s IS NULL OR e2e_s <= e2e_slo_s) AS e2e_ok
    FROM requests
), met AS (
    SELECT
        run_id, shard_id,
        count(*) AS requests,
        count(*) FILTER (WHERE status = 'finished') AS finished,
        count(*) FILTER (WHERE ttft_ok) AS ttft_met,
        count(*) FILTER (WHERE tpot_ok) AS tpot_met,
        count(*) FILTER (WHERE ttft_ok AND tpot_ok AND e2e_ok) AS slo_met,
        coalesce(sum(output_tokens) FILTER (WHERE ttft_ok AND tpot_ok AND e2e_ok), 0) AS slo_met_tokens
    FROM judged
    GROUP BY run_id, shard_id
)
SELECT
    rs.*,  -- the shard's keys (run_shards): run_id, run_seq, run_name, shard_id, model, engine
    CAST(ttft_slo_s AS DOUBLE) AS ttft_slo_s,                    -- TTFT threshold (NULL: none)
    CAST(tpot_slo_s AS DOUBLE) AS tpot_slo_s,                    -- TPOT threshold (NULL: none)
    CAST(e2e_slo_s AS DOUBLE) AS e2e_slo_s,                      -- E2E threshold (NULL: none)
    met.requests,                                                -- requests replayed
    met.finished,                                                -- of those, finished
    met.ttft_met,                                                -- requests within the TTFT threshold
    met.tpot_met,                                                -- finished requests within the TPOT threshold
    met.slo_met,                                                 -- finished requests within every threshold
    met.slo_met / nullif(met.requests, 0) AS attainment,         -- share of requests meeting the SLO
    met.slo_met / nullif(sm.duration_s, 0) AS goodput_req_s,     -- SLO-meeting requests per second
    met.slo_met_tokens / nullif(sm.duration_s, 0) AS goodput_tok_s,  -- their output tokens per second
    sm.duration_s,                                               -- the shard's duration
    sm.throughput_req_s,                                         -- all finished requests per second
    sm.throughput_tok_s                                          -- all output tokens per second
FROM run_shards AS rs
JOIN met USING (run_id, shard_id)
JOIN summaries AS sm USING (run_id, shard_id);
