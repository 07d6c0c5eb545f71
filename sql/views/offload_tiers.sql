-- view: offload_tiers
-- purpose: each shard's KV cache tiers side by side: the GPU prefix cache (vLLM's PrefixCacheStats)
--          and the KV offload CPU tier behind it (vLLM's connector_prefix_cache_stats, the
--          OffloadingConnector's loads, stores and evictions), the disk tier behind the CPU tier when
--          there is one (vLLM's tiering manager with an fs tier), with TTFT.  A shard replayed without a
--          tier has cpu_chunks = 0 and NULL CPU rates; without a disk tier the disk columns are NULL.
-- grain:   one row per (run_id, shard_id).
-- sources: run_shards (runs, shards), summaries, steps.
-- The CPU tier's hit rate is tokens the tier offered over tokens asked of it, as vLLM reports it;
-- both rates count prompt tokens, so gpu_hit_rate + cpu_hit_rate is the share served from a cache.
CREATE OR REPLACE VIEW offload_tiers AS
WITH st AS (
    SELECT
        run_id, shard_id,
        max(offload_cpu_used) AS cpu_used_max,
        max(offload_remote_wait) AS remote_wait_max,
        sum(offload_disk_queries) AS disk_queries,
        sum(offload_disk_hits) AS disk_hits,
        sum(offload_disk_read_chunks) AS disk_read_chunks,
        sum(offload_disk_read_bytes) AS disk_read_bytes,
        sum(offload_disk_write_chunks) AS disk_write_chunks,
        sum(offload_disk_write_bytes) AS disk_write_bytes,
        max(offload_disk_chunks) AS disk_chunks
    FROM steps
    GROUP BY run_id, shard_id
)
SELECT
    rs.run_id,                                                             -- run key
    rs.run_seq,                                                            -- landing order
    rs.run_name,                                                           -- run name
    rs.shard_id,                                                           -- shard
    rs.model,                                                              -- model
    rs.engine,                                                             -- engine configuration
    s.requests,                                                            -- requests replayed
    s.prefix_queries AS gpu_queries,                                       -- tokens looked up in the GPU prefix cache
    s.prefix_hits AS gpu_hits,                                             -- of those, hits
    s.prefix_hits / nullif(s.prefix_queries, 0) AS gpu_hit_rate,          -- GPU tier hit rate
    s.offload_cpu_chunks AS cpu_chunks,                                    -- CPU tier size, offloaded blocks (0: none)
    s.offload_queries AS cpu_queries,                                      -- tokens asked of the CPU tier
    s.offload_hits AS cpu_hits,                                            -- of those, offered by it
    s.offload_hits / nullif(s.offload_queries, 0) AS cpu_hit_rate,        -- CPU tier hit rate
    s.offload_loads AS loads,                                              -- load jobs (CPU to GPU)
    s.offload_load_tokens AS load_tokens,                                  -- tokens loaded
    s.offload_load_bytes AS load_bytes,                                    -- bytes read from the CPU tier
    s.offload_stores AS stores,                                            -- store jobs (GPU to CPU)
    s.offload_store_chunks AS store_chunks,                                -- offloaded blocks written
    s.offload_store_bytes AS store_bytes,                                  -- bytes written to the CPU tier
    s.offload_cpu_evicted AS cpu_evicted,                                  -- offloaded blocks evicted
    st.cpu_used_max,                                                       -- CPU tier blocks holding data, peak
    st.remote_wait_max,                                                    -- requests waiting for a load, peak
    st.disk_queries,                                                       -- chunk lookups that reached the disk tier
    st.disk_hits,                                                          -- of those, found on disk
    st.disk_hits / nullif(st.disk_queries, 0) AS disk_hit_rate,           -- disk tier hit rate (per chunk lookup)
    st.disk_read_chunks,                                                   -- offloaded blocks read back from disk
    st.disk_read_bytes,                                                    -- bytes read from disk
    st.disk_write_chunks,                                                  -- offloaded blocks written to disk
    st.disk_write_bytes,                                                   -- bytes written to disk
    st.disk_chunks,                                                        -- offloaded blocks on disk at the end
    s.ttft_p50_s,                                                          -- TTFT median
    s.ttft_p99_s                                                           -- TTFT 99th percentile
FROM run_shards AS rs
JOIN summaries AS s USING (run_id, shard_id)
LEFT JOIN st USING (run_id, shard_id);
