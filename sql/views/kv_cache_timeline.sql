-- view: kv_cache_timeline
-- purpose: KV-cache occupancy over simulated time, per shard: blocks referenced by requests
--          (active), free blocks still holding a reusable prefix (cached) and free empty ones, as
--          usage fractions (kv_usage is vLLM's: active blocks; physical usage counts cached blocks
--          too) and bytes, with the running and waiting queues beside them.
-- grain:   one row per (run_id, shard_id, replica, step); replica is NULL for a single engine.
-- sources: steps, run_shards (runs, shards).
CREATE OR REPLACE VIEW kv_cache_timeline AS
SELECT
    rs.*,  -- the shard's keys (run_shards): run_id, run_seq, run_name, shard_id, model, engine
    st.replica,                                                  -- replica of a deployment (NULL: one engine)
    st.step,                                                     -- engine iteration
    st.clock_s,                                                  -- start of the step (simulated seconds)
    st.duration_s,                                               -- step time
    st.running,                                                  -- requests running after the step
    st.waiting,                                                  -- requests waiting after the step
    st.active_blocks,                                            -- blocks referenced by requests
    st.cached_blocks,                                            -- free blocks holding a cached prefix
    st.empty_blocks,                                             -- free blocks holding nothing
    st.kv_usage,                                                 -- active / usable blocks (vLLM kv_usage)
    st.physical_usage,                                           -- (active + cached) / usable blocks
    st.physical_usage - st.kv_usage AS cached_usage,             -- cached / usable blocks
    st.kv_cache_active_bytes,                                    -- bytes of active blocks
    st.kv_cache_cached_bytes,                                    -- bytes of cached blocks
    st.kv_cache_active_bytes + st.kv_cache_cached_bytes AS kv_cache_physical_bytes  -- bytes holding data
FROM run_shards AS rs
JOIN steps AS st USING (run_id, shard_id);
