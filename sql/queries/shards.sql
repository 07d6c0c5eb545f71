-- query: shards
-- purpose: one run's shards with their headline results: requests, latency medians and tails,
--          throughput, prefix-cache hit rate, preemptions and peak KV-cache usage.
-- grain:   one row per shard of the run.
-- sources: shards, summaries, resolve_run (runs).
-- param run VARCHAR = NULL: run name, run id or id prefix (default: the latest run)
SELECT
    s.shard_id,                                       -- shard
    s.model,                                          -- model
    s.engine,                                         -- engine configuration
    sm.requests,                                      -- requests replayed
    sm.finished,                                      -- of those, finished
    round(sm.ttft_p50_s, 4) AS ttft_p50_s,            -- TTFT median
    round(sm.ttft_p99_s, 4) AS ttft_p99_s,            -- TTFT 99th percentile
    round(sm.tpot_p50_s, 5) AS tpot_p50_s,            -- TPOT median
    round(sm.throughput_tok_s, 1) AS throughput_tok_s,  -- output tokens per second
    round(sm.prefix_hit_rate, 4) AS prefix_hit_rate,  -- prefix-cache hit rate
    sm.preemptions,                                   -- preemptions
    round(sm.kv_usage_max, 4) AS kv_usage_max         -- peak KV-cache usage (vLLM kv_usage)
FROM shards AS s
JOIN summaries AS sm USING (run_id, shard_id)
WHERE s.run_id = resolve_run($run)
ORDER BY s.shard_id;
