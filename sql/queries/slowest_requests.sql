-- query: slowest_requests
-- purpose: the requests of one run with the longest time to first token, with what they waited
--          for: queueing, prompt length, cache hits and preemptions.
-- grain:   one row per request (the `limit` slowest of the run).
-- sources: requests, run_shards (runs, shards), resolve_run (runs).
-- param run VARCHAR = NULL: run name, run id or id prefix (default: the latest run)
-- param limit INTEGER = 20: how many requests
SELECT
    rs.model,                                                   -- model
    rs.engine,                                                  -- engine configuration
    q.request_id,                                               -- request
    round(q.arrival_s, 4) AS arrival_s,                         -- arrival
    round(q.ttft_s, 4) AS ttft_s,                               -- time to first token
    round(q.first_scheduled_s - q.arrival_s, 4) AS queue_s,     -- wait before first scheduled
    q.prompt_tokens,                                            -- prompt length
    q.cached_tokens,                                            -- cached at admission
    q.preemptions,                                              -- times preempted
    q.status                                                    -- final status
FROM requests AS q
JOIN run_shards AS rs USING (run_id, shard_id)
WHERE q.run_id = resolve_run($run)
ORDER BY q.ttft_s DESC NULLS FIRST, rs.shard_id, q.request_index
LIMIT $limit;
