-- query: runs
-- purpose: the runs in the database, latest first: name, key, size and how long each took.
-- grain:   one row per run.
-- sources: runs.
SELECT
    run_seq,                                   -- landing order
    name,                                      -- run name
    run_id,                                    -- run key
    shards,                                    -- shards (model x engine)
    requests,                                  -- request rows
    steps,                                     -- step rows
    rows_skipped,                              -- trace rows of models without a deployment
    strftime(landed_at, '%Y-%m-%d %H:%M:%S') AS landed_at,  -- when it landed (UTC)
    round(wall_s, 2) AS wall_s,                -- wall time of the run
    scheduler,                                 -- where it ran
    workers                                    -- how many Dask workers
FROM runs
ORDER BY run_seq DESC;
