-- view: run_shards
-- purpose: every shard with its run's name and landing order; the join the other views start from.
-- grain:   one row per (run_id, shard_id).
-- sources: runs, shards.
CREATE OR REPLACE VIEW run_shards AS
SELECT
    r.run_id,              -- run key
    r.run_seq,             -- landing order in this database
    r.name AS run_name,    -- the spec's run name
    s.shard_id,            -- shard within the run
    s.model,               -- model replayed
    s.engine               -- engine configuration (name within the deployment)
FROM runs AS r
JOIN shards AS s USING (run_id);
