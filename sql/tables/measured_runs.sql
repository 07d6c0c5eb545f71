-- table: measured_runs
-- purpose: vllm bench serve runs as their result files recorded them, beside the simulated runs, so
--          that the named query sim_vs_real can put each next to the shards that replayed its
--          model, GPU, rate and concurrency.  Latencies in seconds like the summaries' columns.
-- grain:   one row per (source, run_index).
-- sources: the --save-result JSON files `aisim calibrate --db` reads (aisim.calibrate.measured),
--          landed in one transaction; a file landed again replaces its rows.
CREATE TABLE IF NOT EXISTS measured_runs (
    source              VARCHAR NOT NULL,  -- the result file (absolute path)
    run_index           INTEGER NOT NULL,  -- the run's place in the file (0, 1, ... in an --append-result file)
    file_sha256         VARCHAR NOT NULL,  -- SHA-256 of the file's bytes
    model               VARCHAR,           -- aisim's model of the engine the runs ran (time_model.model, else model)
    model_id            VARCHAR,           -- the served model as the file names it
    gpu                 VARCHAR,           -- the engine's time_model.gpu (NULL: not a roofline engine)
    tp                  INTEGER,           -- its time_model.tp
    num_prompts         INTEGER NOT NULL,  -- requests sent (every one completed)
    request_rate        DOUBLE,            -- requests per second; NULL: every request at once (rate inf)
    burstiness          DOUBLE NOT NULL,   -- gamma shape of the gaps between sends (1: Poisson)
    max_concurrency     INTEGER,           -- the client's cap on requests in flight; NULL: none
    total_input_tokens  BIGINT NOT NULL,   -- prompt tokens, all requests
    total_output_tokens BIGINT NOT NULL,   -- output tokens, all requests
    duration_s          DOUBLE NOT NULL,   -- from the benchmark's start to the last response
    throughput_req_s    DOUBLE,            -- completed requests / duration_s (request_throughput)
    throughput_tok_s    DOUBLE,            -- output tokens / duration_s (output_throughput)
    ttft_mean_s         DOUBLE,            -- time to first token: mean
    ttft_p50_s          DOUBLE,            -- median
    ttft_p99_s          DOUBLE,            -- 99th percentile
    tpot_mean_s         DOUBLE,            -- time per output token after the first: mean
    tpot_p50_s          DOUBLE,            -- median
    tpot_p99_s          DOUBLE,            -- 99th percentile
    itl_mean_s          DOUBLE,            -- inter-token latency: mean
    itl_p50_s           DOUBLE,            -- median
    itl_p99_s           DOUBLE,            -- 99th percentile
    e2e_mean_s          DOUBLE,            -- end-to-end latency: mean
    e2e_p50_s           DOUBLE,            -- median
    e2e_p99_s           DOUBLE,            -- 99th percentile
    calibration         VARCHAR,           -- the calibration the run fed (its record's name); NULL: none
    PRIMARY KEY (source, run_index)
);
