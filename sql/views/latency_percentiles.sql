-- view: latency_percentiles
-- purpose: per-run, per-model latency percentiles (TTFT, TPOT, ITL, E2E and queueing delay), one row per
--          engine configuration the model was replayed on (the engines of a deployment are
--          alternatives: each replays the model's whole share of the trace).
-- grain:   one row per (run_id, model, engine), i.e. per (run_id, shard_id).
-- sources: requests, summaries (ITL), run_shards (runs, shards).
-- Percentiles are continuous (linear interpolation, as numpy's default) over requests that have
-- the value: TTFT needs a first token, TPOT a finished request with two or more output tokens.
-- ITL is no request's own value but every gap between two streamed outputs of a request, pooled
-- (vllm bench serve's ITL): the replay's summary computed it, the summaries table holds it.
CREATE OR REPLACE VIEW latency_percentiles AS
SELECT
    rs.*,  -- the shard's keys (run_shards): run_id, run_seq, run_name, shard_id, model, engine
    count(*) AS requests,                                        -- requests replayed
    count(*) FILTER (WHERE q.status = 'finished') AS finished,   -- of those, finished
    avg(q.ttft_s) AS ttft_mean_s,                                -- time to first token: mean
    quantile_cont(q.ttft_s, 0.50) AS ttft_p50_s,                 -- median
    quantile_cont(q.ttft_s, 0.90) AS ttft_p90_s,                 -- 90th percentile
    quantile_cont(q.ttft_s, 0.99) AS ttft_p99_s,                 -- 99th percentile
    avg(q.tpot_s) AS tpot_mean_s,                                -- time per output token: mean
    quantile_cont(q.tpot_s, 0.50) AS tpot_p50_s,                 -- median
    quantile_cont(q.tpot_s, 0.90) AS tpot_p90_s,                 -- 90th percentile
    quantile_cont(q.tpot_s, 0.99) AS tpot_p99_s,                 -- 99th percentile
    any_value(sm.itl_mean_s) AS itl_mean_s,                      -- inter-token latency: mean
    any_value(sm.itl_p50_s) AS itl_p50_s,                        -- median
    any_value(sm.itl_p90_s) AS itl_p90_s,                        -- 90th percentile
    any_value(sm.itl_p99_s) AS itl_p99_s,                        -- 99th percentile
    avg(q.e2e_s) AS e2e_mean_s,                                  -- end-to-end latency: mean
    quantile_cont(q.e2e_s, 0.50) AS e2e_p50_s,                   -- median
    quantile_cont(q.e2e_s, 0.90) AS e2e_p90_s,                   -- 90th percentile
    quantile_cont(q.e2e_s, 0.99) AS e2e_p99_s,                   -- 99th percentile
    quantile_cont(q.first_scheduled_s - q.arrival_s, 0.50) AS queue_p50_s,  -- wait before first scheduled: median
    quantile_cont(q.first_scheduled_s - q.arrival_s, 0.99) AS queue_p99_s   -- 99th percentile
FROM run_shards AS rs
JOIN requests AS q USING (run_id, shard_id)
LEFT JOIN summaries AS sm USING (run_id, shard_id)
GROUP BY rs.run_id, rs.run_seq, rs.run_name, rs.shard_id, rs.model, rs.engine;
