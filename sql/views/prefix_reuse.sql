-- view: prefix_reuse
-- purpose: how much of each shard's prompt work the prefix cache saved: vLLM's PrefixCacheStats
--          (lookup and hit tokens, also for resumed requests), cached tokens at admission, the share
--          of requests that hit at all, and the cached (evictable, reusable) blocks held over time.
-- grain:   one row per (run_id, shard_id).
-- sources: requests, steps, run_shards (runs, shards).
CREATE OR REPLACE VIEW prefix_reuse AS
WITH req AS (
    SELECT
        run_id, shard_id,
        count(*) AS requests,
        count(*) FILTER (WHERE cached_tokens > 0) AS requests_with_hit,
        sum(prompt_tokens) AS prompt_tokens,
        sum(cached_tokens) AS cached_tokens,
        sum(cached_tokens_all_admissions) AS cached_tokens_all_admissions
    FROM requests
    GROUP BY run_id, shard_id
), st AS (
    SELECT
        run_id, shard_id,
        sum(prefix_queries) AS prefix_queries,
        sum(prefix_hits) AS prefix_hits,
        sum(preempted_prefix_queries) AS preempted_prefix_queries,
        sum(preempted_prefix_hits) AS preempted_prefix_hits,
        avg(cached_blocks) AS cached_blocks_mean,
        max(cached_blocks) AS cached_blocks_max
    FROM steps
    GROUP BY run_id, shard_id
)
SELECT
    rs.*,  -- the shard's keys (run_shards): run_id, run_seq, run_name, shard_id, model, engine
    coalesce(req.requests, 0) AS requests,                       -- requests replayed
    coalesce(req.requests_with_hit, 0) AS requests_with_hit,     -- requests with cached tokens at admission
    req.requests_with_hit / nullif(req.requests, 0) AS request_hit_share,  -- their share
    req.prompt_tokens,                                           -- prompt tokens
    req.cached_tokens,                                           -- cached tokens at first admission
    req.cached_tokens / nullif(req.prompt_tokens, 0) AS cached_token_share,  -- share of prompt tokens cached
    req.cached_tokens_all_admissions,                            -- cached tokens over every admission
    st.prefix_queries,                                           -- tokens looked up (PrefixCacheStats.queries)
    st.prefix_hits,                                              -- of those, hits
    st.prefix_hits / nullif(st.prefix_queries, 0) AS prefix_hit_rate,  -- hit rate as vLLM reports it
    st.preempted_prefix_queries,                                 -- lookups of resumed requests
    st.preempted_prefix_hits,                                    -- of those, hits
    st.cached_blocks_mean,                                       -- cached blocks held, mean over steps
    st.cached_blocks_max                                         -- cached blocks held, peak
FROM run_shards AS rs
LEFT JOIN req USING (run_id, shard_id)
LEFT JOIN st USING (run_id, shard_id);
