-- query: capacity_rate
-- purpose: what aisim sweep ranks its candidates by when its spec has a [capacity] section: per
--          engine configuration (candidate) of one run, the highest rate within the section's SLO,
--          the answer of the capacity search the run made on its shard (NULL: no rate tried met it),
--          with its band and the calibration that gave it (aisim.capacity.search.rate_band).
-- grain:   one row per engine of the run (one shard per candidate).
-- sources: shards, capacity_points (the run's [capacity] section).
-- param run VARCHAR: the sweep's run id
SELECT
    sh.engine,                                                           -- the candidate
    max(cp.rate_req_s) FILTER (WHERE cp.answer) AS capacity_rate_req_s,  -- its highest rate within the SLO
    max(cp.band_low_req_s) FILTER (WHERE cp.answer) AS capacity_band_low_req_s,    -- its band: low end
    max(cp.band_high_req_s) FILTER (WHERE cp.answer) AS capacity_band_high_req_s,  -- high end
    max(cp.calibration) FILTER (WHERE cp.answer) AS calibration          -- whose held-out errors gave it
FROM shards AS sh
LEFT JOIN capacity_points AS cp ON cp.run_id = sh.run_id AND cp.shard_id = sh.shard_id
WHERE sh.run_id = $run
GROUP BY sh.engine
ORDER BY sh.engine;
