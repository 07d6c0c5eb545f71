-- view: replica_balance
-- purpose: how evenly each deployment shard's router spread its load: per replica the requests it
--          got and their share, its prefix-cache hit rate, busy time and utilisation, beside the
--          shard's imbalance (max over mean across its replicas, of requests and of busy time;
--          1.0 is a perfect balance).  A disaggregated deployment's replicas are compared within
--          their pool (prefill or decode): shares and imbalances are the pool's.  Shards replayed on
--          a single engine have no rows.
-- grain:   one row per (run_id, shard_id, replica).
-- sources: replicas, shards, run_shards (runs, shards).
CREATE OR REPLACE VIEW replica_balance AS
SELECT
    rs.*,  -- the shard's keys (run_shards): run_id, run_seq, run_name, shard_id, model, engine
    s.router,                                                        -- the deployment's router
    s.replicas AS replica_count,                                     -- replicas behind it
    rp.replica,                                                      -- replica (0, 1, ...)
    rp.pool,                                                         -- disaggregated: prefill or decode; else NULL
    rp.requests,                                                     -- requests routed to it
    rp.requests / nullif(sum(rp.requests) OVER w, 0) AS request_share,  -- its share of the shard's (pool's)
    rp.finished,                                                     -- of its requests, finished
    rp.prefix_hit_rate,                                              -- its prefix-cache hit rate (vLLM's)
    rp.busy_s,                                                       -- its step time, summed
    rp.utilisation,                                                  -- busy_s over the deployment's span
    rp.kv_usage_max,                                                 -- its peak kv_usage
    rp.ttft_p50_s,                                                   -- TTFT median of its requests
    rp.ttft_p99_s,                                                   -- TTFT 99th percentile
    max(rp.requests) OVER w / nullif(avg(rp.requests) OVER w, 0) AS request_imbalance,  -- shard (pool): max / mean requests
    max(rp.busy_s) OVER w / nullif(avg(rp.busy_s) OVER w, 0) AS busy_imbalance  -- shard (pool): max / mean busy time
FROM run_shards AS rs
JOIN shards AS s USING (run_id, shard_id)
JOIN replicas AS rp USING (run_id, shard_id)
WINDOW w AS (PARTITION BY rp.run_id, rp.shard_id, rp.pool);
