-- macro: slo_attainment(ttft_slo_s, tpot_slo_s) -- a view with parameters (a DuckDB table macro)
-- purpose: SLO attainment and goodput for given TTFT and TPOT thresholds (seconds).  A request
--          meets the SLO when it finished, its TTFT is at most ttft_slo_s and its TPOT at most
--          tpot_slo_s (a one-token output has no TPOT and passes that half).  Goodput is the
--          rate of requests (and of their output tokens) that met it, over the shard's duration.
-- grain:   one row per (run_id, shard_id), i.e. per (run_id, model, engine).
-- sources: requests, summaries, run_shards (runs, shards).
-- usage:   SELECT * FROM slo_attainment(0.5, 0.05);
CREATE OR REPLACE MACRO slo_attainment(ttft_slo_s, tpot_slo_s) AS TABLE
WITH met AS (
    SELECT
        run_id, shard_id,
        count(*) AS requests,
        count(*) FILTER (WHERE status = 'finished') AS finished,
        count(*) FILTER (WHERE ttft_s <= ttft_slo_s) AS ttft_met,
        count(*) FILTER (WHERE status = 'finished' AND coalesce(tpot_s <= tpot_slo_s, true)) AS tpot_met,
        count(*) FILTER (WHERE status = 'finished' AND ttft_s <= ttft_slo_s
                         AND coalesce(tpot_s <= tpot_slo_s, true)) AS slo_met,
        coalesce(sum(output_tokens) FILTER (WHERE status = 'finished' AND ttft_s <= ttft_slo_s
                                            AND coalesce(tpot_s <= tpot_slo_s, true)), 0) AS slo_met_tokens
    FROM requests
    GROUP BY run_id, shard_id
)
SELECT
    rs.run_id,                                                   -- run key
    rs.run_seq,                                                  -- landing order
    rs.run_name,                                                 -- run name
    rs.shard_id,                                                 -- shard
    rs.model,                                                    -- model
    rs.engine,                                                   -- engine configuration
    CAST(ttft_slo_s AS DOUBLE) AS ttft_slo_s,                    -- TTFT threshold
    CAST(tpot_slo_s AS DOUBLE) AS tpot_slo_s,                    -- TPOT threshold
    met.requests,                                                -- requests replayed
    met.finished,                                                -- of those, finished
    met.ttft_met,                                                -- requests within the TTFT threshold
    met.tpot_met,                                                -- finished requests within the TPOT threshold
    met.slo_met,                                                 -- requests meeting both
    met.slo_met / nullif(met.requests, 0) AS attainment,         -- share of requests meeting both
    met.slo_met / nullif(sm.duration_s, 0) AS goodput_req_s,     -- SLO-meeting requests per second
    met.slo_met_tokens / nullif(sm.duration_s, 0) AS goodput_tok_s,  -- their output tokens per second
    sm.throughput_req_s,                                         -- all finished requests per second
    sm.throughput_tok_s                                          -- all output tokens per second
FROM run_shards AS rs
JOIN met USING (run_id, shard_id)
JOIN summaries AS sm USING (run_id, shard_id);
