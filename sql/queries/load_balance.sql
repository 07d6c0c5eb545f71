-- query: load_balance
-- purpose: how a run's deployments spread their load over their replicas: per replica its requests
--          and their share, prefix-cache hit rate and utilisation, with each shard's max / mean
--          imbalance of requests and of busy time (1.0: perfectly even); a disaggregated deployment's
--          replicas name their pool, and are compared within it.
-- grain:   one row per (deployment shard, replica) of the run; single-engine shards have none.
-- sources: replica_balance (replicas, runs, shards), resolve_run (runs).
-- param run VARCHAR = NULL: run name, run id or id prefix (default: the latest run)
SELECT
    shard_id,                                              -- shard
    model,                                                 -- model
    engine,                                                -- engine configuration
    router,                                                -- the deployment's router
    replica,                                               -- replica
    pool,                                                  -- disaggregated: prefill or decode; else NULL
    requests,                                              -- requests routed to it
    round(request_share, 4) AS request_share,              -- their share of the shard's
    round(prefix_hit_rate, 4) AS prefix_hit_rate,          -- its prefix-cache hit rate
    round(utilisation, 4) AS utilisation,                  -- busy time over the deployment's span
    round(ttft_p99_s, 4) AS ttft_p99_s,                    -- TTFT 99th percentile of its requests
    round(request_imbalance, 4) AS request_imbalance,      -- shard: max / mean requests per replica
    round(busy_imbalance, 4) AS busy_imbalance             -- shard: max / mean busy time per replica
FROM replica_balance
WHERE run_id = resolve_run($run)
ORDER BY shard_id, replica;
