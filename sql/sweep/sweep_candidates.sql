-- table: sweep_candidates
-- purpose: every candidate of a sweep, ranked or refused, next to the run's results.
-- grain:   one row per (run_id, candidate).
-- sources: aisim.sweep, after the sweep's pipeline run landed (runs.run_id; engine = candidate).
CREATE TABLE IF NOT EXISTS sweep_candidates (
    run_id          VARCHAR NOT NULL,   -- runs.run_id of the pipeline run of its load level (engine = candidate);
                                        -- a level whose every candidate was refused: the sweep's first run
    candidate       VARCHAR NOT NULL,   -- c000, c001, ... in grid order
    knobs           VARCHAR NOT NULL,   -- JSON of its grid values ("unset": the base's key removed; deployment
                                        -- knobs too) and load level
    status          VARCHAR NOT NULL,   -- 'ranked' or 'refused'
    reason          VARCHAR,            -- why it was refused: a configuration rule, or a request it cannot hold
    rank            INTEGER,            -- 1 = best
    goodput_req_s   DOUBLE,             -- requests meeting every SLO threshold per second
    slo_attainment  DOUBLE,             -- share of requests meeting every threshold
    cost_tokens     BIGINT,             -- KV capacity in tokens (num_gpu_blocks * block_size)
    slo             VARCHAR NOT NULL,   -- JSON of the thresholds
    gpus            INTEGER,            -- GPUs of the deployment (time_model.tp of every replica, both pools)
    rejected        BIGINT,             -- requests rejected for a prompt of max_model_len tokens or more
    ttft_p99_s      DOUBLE,             -- p99 TTFT of the requests that got a first token
    tpot_p99_s      DOUBLE,             -- p99 TPOT of the finished requests
    deployment      VARCHAR,            -- JSON of its deployment, every key resolved (NULL: the engine alone
                                        -- or refused); its knobs are in knobs
    sweep_run_id    VARCHAR,            -- the sweep's first run (its first load level's): every candidate of one
                                        -- sweep carries it, whatever its own level's run
    capacity_rate_req_s DOUBLE,         -- the highest rate within the [capacity] SLO, what the candidates are
                                        -- ranked by (capacity_points; NULL: no [capacity], refused, or no rate
                                        -- tried met it)
    capacity_band_low_req_s DOUBLE,     -- the band of capacity_rate_req_s: the highest rate with every step time
                                        -- at the high end of the calibration's held-out errors (NULL: none met it)
    capacity_band_high_req_s DOUBLE,    -- ... and at their low end
    calibration     VARCHAR,            -- the calibration of the candidate's time model (its record's name, else
                                        -- the defaults'): whose held-out errors give the band
    PRIMARY KEY (run_id, candidate)
);
-- A table made by an earlier aisim gains the columns it lacks.
ALTER TABLE sweep_candidates ADD COLUMN IF NOT EXISTS gpus INTEGER;
ALTER TABLE sweep_candidates ADD COLUMN IF NOT EXISTS rejected BIGINT;
ALTER TABLE sweep_candidates ADD COLUMN IF NOT EXISTS ttft_p99_s DOUBLE;
ALTER TABLE sweep_candidates ADD COLUMN IF NOT EXISTS tpot_p99_s DOUBLE;
ALTER TABLE sweep_candidates ADD COLUMN IF NOT EXISTS deployment VARCHAR;
ALTER TABLE sweep_candidates ADD COLUMN IF NOT EXISTS sweep_run_id VARCHAR;
ALTER TABLE sweep_candidates ADD COLUMN IF NOT EXISTS capacity_rate_req_s DOUBLE;
ALTER TABLE sweep_candidates ADD COLUMN IF NOT EXISTS capacity_band_low_req_s DOUBLE;
ALTER TABLE sweep_candidates ADD COLUMN IF NOT EXISTS capacity_band_high_req_s DOUBLE;
ALTER TABLE sweep_candidates ADD COLUMN IF NOT EXISTS calibration VARCHAR;
