-- table: sweep_candidates
-- purpose: every candidate of a sweep, ranked or refused, next to the run's results.
-- grain:   one row per (run_id, candidate).
-- sources: aisim.sweep, after the sweep's pipeline run landed (runs.run_id; engine = candidate).
CREATE TABLE IF NOT EXISTS sweep_candidates (
    run_id          VARCHAR NOT NULL,   -- runs.run_id of the sweep's pipeline run (engine = candidate)
    candidate       VARCHAR NOT NULL,   -- c000, c001, ... in grid order
    knobs           VARCHAR NOT NULL,   -- JSON of the grid values of this candidate
    status          VARCHAR NOT NULL,   -- 'ranked' or 'refused'
    reason          VARCHAR,            -- why the configuration rules refused it
    rank            INTEGER,            -- 1 = best
    goodput_req_s   DOUBLE,             -- requests meeting every SLO threshold per second
    slo_attainment  DOUBLE,             -- share of requests meeting every threshold
    cost_tokens     BIGINT,             -- KV capacity in tokens (num_gpu_blocks * block_size)
    slo             VARCHAR NOT NULL,   -- JSON of the thresholds
    PRIMARY KEY (run_id, candidate)
);
