-- schema: the six tables a pipeline run lands in (aisim.pipeline.landing).
--
-- purpose: keep every run's replay results, keyed by run and shard, for SQL analysis.
-- grain:   runs (run_id); shards, summaries (run_id, shard_id); replicas (run_id, shard_id, replica);
--          requests (run_id, shard_id, request_index); steps (run_id, shard_id, replica, step).
-- sources: the shard tasks of aisim.pipeline.shards (Arrow tables), landed in one
--          transaction per run; run_id is the run key (spec + input fingerprints).
--
-- Keys of the two large tables are enforced by the loader, not by indexes (an index
-- would slow landing several-fold); rows are landed sorted by their key.  Every column
-- is deterministic for a given spec and inputs except the bookkeeping columns marked
-- "bookkeeping" (wall-clock times, scheduler, workers), which differ between runs of
-- the same work.  Times are seconds of simulated time unless a name says otherwise;
-- NULL means "does not apply" (e.g. TTFT of a request that never got a token).
--
-- The columns are declared once, in aisim/columns.py (with their units and Arrow types);
-- the statements below are generated from it.

-- Generated from aisim/columns.py by `python -m aisim.columns --write`; do not edit below.

CREATE TABLE IF NOT EXISTS runs (
    run_id          VARCHAR NOT NULL,  -- run key: SHA-256 of spec, input and engine fingerprints, version (16 hex)
    run_seq         BIGINT NOT NULL,   -- landing order in this database (1, 2, ...); a --force rerun gets a new one
    name            VARCHAR NOT NULL,  -- the spec's run name
    description     VARCHAR,           -- the spec's description
    spec_path       VARCHAR,           -- the spec file (absolute), NULL for a spec built in Python
    spec            VARCHAR NOT NULL,  -- canonical spec as JSON (what the run key hashes)
    inputs          VARCHAR NOT NULL,  -- JSON list of input files: source, path, format, size, sha256
    aisim_version   VARCHAR NOT NULL,  -- aisim release that replayed the run
    shards          INTEGER NOT NULL,  -- number of shards (model x engine configuration)
    requests        BIGINT NOT NULL,   -- request rows landed, all shards
    steps           BIGINT NOT NULL,   -- step rows landed, all shards
    rows_read       BIGINT NOT NULL,   -- trace rows read from the inputs
    rows_in_window  BIGINT NOT NULL,   -- of those, inside the time window
    rows_skipped    BIGINT NOT NULL,   -- rows inside the window whose model has no deployment
    rows_bad        BIGINT NOT NULL,   -- malformed rows the readers skipped (reader option skip_bad_rows)
    skipped_models  VARCHAR NOT NULL,  -- JSON: model -> skipped rows ("" = rows without a model)
    started_at      TIMESTAMPTZ,       -- bookkeeping: when the run started
    landed_at       TIMESTAMPTZ,       -- bookkeeping: when the landing transaction ran
    wall_s          DOUBLE,            -- bookkeeping: wall time from start to landing
    scheduler       VARCHAR,           -- bookkeeping: sync, local or the scheduler address
    workers         INTEGER,           -- bookkeeping: Dask workers used (1 for sync)
    PRIMARY KEY (run_id)
);

CREATE TABLE IF NOT EXISTS shards (
    run_id             VARCHAR NOT NULL,  -- runs.run_id
    shard_id           INTEGER NOT NULL,  -- 0, 1, ... in (model, engine) order
    model              VARCHAR NOT NULL,  -- the model whose requests this shard replays
    engine             VARCHAR NOT NULL,  -- the engine configuration's name in the deployment
    engine_path        VARCHAR,           -- the configuration file as the spec names it; NULL when inline
    engine_sha256      VARCHAR NOT NULL,  -- SHA-256 of engine_config
    engine_config      VARCHAR NOT NULL,  -- resolved engine configuration (JSON, every default filled in)
    replicas           INTEGER,           -- deployment: engines behind the router (disaggregated: both pools'); NULL for a single engine
    router             VARCHAR,           -- deployment: its router (aisim.config.deployment.ROUTERS; disaggregated: the prefill pool's, deployment_config has both); NULL for a single engine
    deployment_config  VARCHAR,           -- deployment: its resolved settings (JSON, every default filled in); NULL for a single engine
    vllm_version       VARCHAR,           -- vLLM release whose rules were replayed
    clock              VARCHAR,           -- 'step' or 'time' arrivals; NULL for a shard without requests
    sources            VARCHAR NOT NULL,  -- JSON list of input files and their row counts for this model
    requests           BIGINT NOT NULL,   -- requests replayed
    steps              BIGINT NOT NULL,   -- step rows
    task_s             DOUBLE,            -- bookkeeping: wall time of the shard task
    PRIMARY KEY (run_id, shard_id)
);

CREATE TABLE IF NOT EXISTS summaries (
    run_id                          VARCHAR NOT NULL,  -- runs.run_id
    shard_id                        INTEGER NOT NULL,  -- shards.shard_id
    requests                        BIGINT,            -- requests in the trace share
    finished                        BIGINT,            -- requests that finished
    unfinished                      BIGINT,            -- requests that did not
    steps                           BIGINT,            -- engine steps (not drain lines)
    empty_steps                     BIGINT,            -- steps that scheduled nothing
    preemptions                     BIGINT,            -- preemptions, all requests
    scheduled_tokens                BIGINT,            -- prefill + decode tokens scheduled
    scheduled_req_steps             BIGINT,            -- (request, step) pairs scheduled
    prompt_tokens                   BIGINT,            -- prompt tokens, all requests
    output_tokens                   BIGINT,            -- output tokens, all requests
    prefix_hit_tokens_at_admission  BIGINT,            -- cached tokens at first admission, all requests
    prefix_hit_rate                 DOUBLE,            -- prefix_hits / prefix_queries
    clock_end_s                     DOUBLE,            -- end of the last step
    duration_s                      DOUBLE,            -- from the first send to the last response (vllm bench serve's duration)
    throughput_req_s                DOUBLE,            -- finished requests / duration_s (request_throughput)
    throughput_tok_s                DOUBLE,            -- finished requests' output tokens / duration_s (output_throughput)
    prefix_queries                  BIGINT,            -- tokens looked up in the prefix cache (vLLM PrefixCacheStats)
    prefix_hits                     BIGINT,            -- of those, hits
    preempted_prefix_queries        BIGINT,            -- lookups of resumed (preempted) requests
    preempted_prefix_hits           BIGINT,            -- of those, hits
    ttft_mean_s                     DOUBLE,            -- time to first token: mean
    ttft_p50_s                      DOUBLE,            -- median
    ttft_p90_s                      DOUBLE,            -- 90th percentile
    ttft_p99_s                      DOUBLE,            -- 99th percentile
    tpot_mean_s                     DOUBLE,            -- time per output token after the first: mean
    tpot_p50_s                      DOUBLE,            -- median
    tpot_p90_s                      DOUBLE,            -- 90th percentile
    tpot_p99_s                      DOUBLE,            -- 99th percentile
    e2e_mean_s                      DOUBLE,            -- end-to-end latency: mean
    e2e_p50_s                       DOUBLE,            -- median
    e2e_p90_s                       DOUBLE,            -- 90th percentile
    e2e_p99_s                       DOUBLE,            -- 99th percentile
    itl_mean_s                      DOUBLE,            -- inter-token latency (every gap between two streamed outputs of a request, pooled): mean
    itl_p50_s                       DOUBLE,            -- median
    itl_p90_s                       DOUBLE,            -- 90th percentile
    itl_p99_s                       DOUBLE,            -- 99th percentile
    kv_usage_mean                   DOUBLE,            -- vLLM's kv_usage (active / usable blocks), mean over steps
    kv_usage_max                    DOUBLE,            -- its peak
    kv_physical_usage_max           DOUBLE,            -- peak of active + cached blocks over usable blocks
    offload_cpu_chunks              BIGINT,            -- KV offload: the CPU tier's size in offloaded blocks (0 without a tier)
    offload_queries                 BIGINT,            -- KV offload: tokens the connector was asked for (vLLM's connector_prefix_cache_stats.queries) (0 without a tier)
    offload_hits                    BIGINT,            -- KV offload: of those, tokens the CPU tier offered (0 without a tier)
    offload_loads                   BIGINT,            -- KV offload: load jobs (CPU tier to GPU) (0 without a tier)
    offload_load_tokens             BIGINT,            -- KV offload: tokens they loaded (0 without a tier)
    offload_load_bytes              BIGINT,            -- KV offload: bytes they read (0 without a tier)
    offload_stores                  BIGINT,            -- KV offload: store jobs (GPU to CPU tier) (0 without a tier)
    offload_store_chunks            BIGINT,            -- KV offload: offloaded blocks they wrote (0 without a tier)
    offload_store_bytes             BIGINT,            -- KV offload: bytes they wrote (0 without a tier)
    offload_cpu_evicted             BIGINT,            -- KV offload: offloaded blocks the CPU tier evicted (0 without a tier)
    summary_json                    VARCHAR,           -- the replay summary as JSON, every field
    PRIMARY KEY (run_id, shard_id)
);

CREATE TABLE IF NOT EXISTS replicas (
    run_id                          VARCHAR NOT NULL,  -- runs.run_id
    shard_id                        INTEGER NOT NULL,  -- shards.shard_id
    replica                         INTEGER NOT NULL,  -- replica within the deployment (0, 1, ...; disaggregated: the prefill pool's first, then the decode pool's)
    pool                            VARCHAR,           -- disaggregated: 'prefill' or 'decode', the replica's pool; NULL for replicas of one engine
    requests                        BIGINT,            -- requests in the trace share
    finished                        BIGINT,            -- requests that finished
    unfinished                      BIGINT,            -- requests that did not
    steps                           BIGINT,            -- engine steps (not drain lines)
    preemptions                     BIGINT,            -- preemptions, all requests
    scheduled_tokens                BIGINT,            -- prefill + decode tokens scheduled
    prompt_tokens                   BIGINT,            -- prompt tokens, all requests
    output_tokens                   BIGINT,            -- output tokens, all requests
    prefix_hit_tokens_at_admission  BIGINT,            -- cached tokens at first admission, all requests
    prefix_hit_rate                 DOUBLE,            -- prefix_hits / prefix_queries
    prefix_queries                  BIGINT,            -- tokens looked up in the prefix cache (vLLM PrefixCacheStats)
    prefix_hits                     BIGINT,            -- of those, hits
    clock_end_s                     DOUBLE,            -- end of the last step
    duration_s                      DOUBLE,            -- from the first send to the last response (vllm bench serve's duration)
    throughput_tok_s                DOUBLE,            -- finished requests' output tokens / duration_s (output_throughput)
    ttft_mean_s                     DOUBLE,            -- time to first token: mean
    ttft_p50_s                      DOUBLE,            -- median
    ttft_p99_s                      DOUBLE,            -- 99th percentile
    tpot_p50_s                      DOUBLE,            -- median
    e2e_p50_s                       DOUBLE,            -- median
    e2e_p99_s                       DOUBLE,            -- 99th percentile
    kv_usage_mean                   DOUBLE,            -- vLLM's kv_usage (active / usable blocks), mean over steps
    kv_usage_max                    DOUBLE,            -- its peak
    kv_physical_usage_max           DOUBLE,            -- peak of active + cached blocks over usable blocks
    offload_cpu_chunks              BIGINT,            -- KV offload: the CPU tier's size in offloaded blocks (0 without a tier)
    offload_hits                    BIGINT,            -- KV offload: of those, tokens the CPU tier offered (0 without a tier)
    offload_loads                   BIGINT,            -- KV offload: load jobs (CPU tier to GPU) (0 without a tier)
    offload_load_tokens             BIGINT,            -- KV offload: tokens they loaded (0 without a tier)
    offload_store_chunks            BIGINT,            -- KV offload: offloaded blocks they wrote (0 without a tier)
    offload_cpu_evicted             BIGINT,            -- KV offload: offloaded blocks the CPU tier evicted (0 without a tier)
    busy_s                          DOUBLE,            -- the replica's step time, summed
    utilisation                     DOUBLE,            -- busy_s over the deployment's duration_s
    PRIMARY KEY (run_id, shard_id, replica)
);

CREATE TABLE IF NOT EXISTS requests (
    run_id                        VARCHAR NOT NULL,  -- runs.run_id
    shard_id                      INTEGER NOT NULL,  -- shards.shard_id
    request_index                 INTEGER NOT NULL,  -- position in the shard's trace (arrival order)
    request_id                    VARCHAR NOT NULL,  -- the trace's id (with the source's request_id_prefix)
    session_id                    VARCHAR,           -- multi-turn session, if the trace has one
    turn                          INTEGER,           -- turn within the session (0 = first)
    priority                      INTEGER,           -- lower runs first (priority policy)
    replica                       INTEGER,           -- replica the router sent the request to (disaggregated: where it finished); NULL without a deployment
    prefill_replica               INTEGER,           -- replica that ran its prefill (aggregated: its replica); NULL without a deployment
    decode_replica                INTEGER,           -- replica that ran its decode (aggregated: its replica; null: no decode phase); NULL without a deployment
    routed_s                      DOUBLE,            -- when the router placed the request: its arrival; disaggregated, when the decode router placed it (its first token); NULL without a deployment
    transfer_s                    DOUBLE,            -- prefill-to-decode KV transfer time (null: aggregated replicas); NULL without a deployment
    arrival_s                     DOUBLE,            -- when the client sent it (time-clocked: its trace arrival, the release of the client's cap or a closed-loop turn's send; step-clocked: picked_up_s)
    picked_up_s                   DOUBLE,            -- when the engine added it: the start of the iteration that picked it up (after the API server's queue)
    first_scheduled_s             DOUBLE,            -- first scheduled (start of that step)
    first_token_s                 DOUBLE,            -- first output token
    finish_s                      DOUBLE,            -- finish
    ttft_s                        DOUBLE,            -- first_token_s - arrival_s
    tpot_s                        DOUBLE,            -- (finish_s - first_token_s) / (output_tokens - 1)
    e2e_s                         DOUBLE,            -- finish_s - arrival_s
    prompt_tokens                 INTEGER,           -- prompt length
    output_tokens                 INTEGER,           -- tokens generated
    cached_tokens                 INTEGER,           -- prefix-cache hit tokens at first admission
    cached_tokens_all_admissions  INTEGER,           -- summed over every admission (after preemptions too)
    preemptions                   INTEGER,           -- times preempted
    status                        VARCHAR,           -- finished, running, waiting, preempted, pending or rejected at the end
    spec_drafts                   INTEGER,           -- speculative decoding: draft tokens scheduled for verification (vLLM's -1 padding included; 0 without it)
    spec_accepted                 INTEGER,           -- of those, accepted by the target model (acceptance rate: spec_accepted / spec_drafts)
    offload_hit_tokens            INTEGER,           -- tokens loaded from the CPU tier at its first admission; NULL without a KV offload tier
    offload_loaded_tokens         INTEGER,           -- tokens loaded from the CPU tier over every admission; NULL without a KV offload tier
    offload_loads                 INTEGER,           -- its load jobs; NULL without a KV offload tier
    offload_store_chunks          BIGINT,            -- CPU-tier blocks its stores wrote; NULL without a KV offload tier
    offload_disk_read_chunks      BIGINT             -- blocks its lookups read back from the disk tier; NULL without a disk tier
);

CREATE TABLE IF NOT EXISTS steps (
    run_id                     VARCHAR NOT NULL,  -- runs.run_id
    shard_id                   INTEGER NOT NULL,  -- shards.shard_id
    replica                    INTEGER,           -- replica that ran the step; NULL without a deployment
    step                       BIGINT NOT NULL,   -- engine iteration (unique within a shard's engine or replica)
    kind                       VARCHAR,           -- 'step', or 'drain' (async scheduling's last output)
    updated_step               BIGINT,            -- the step whose output this line applied
    clock_s                    DOUBLE,            -- start of the step
    duration_s                 DOUBLE,            -- step time from the engine's time model
    num_reqs                   INTEGER,           -- requests scheduled
    prefill_tokens             BIGINT,            -- prefill tokens scheduled
    decode_tokens              BIGINT,            -- decode tokens scheduled
    num_new                    INTEGER,           -- requests admitted from waiting
    num_resumed                INTEGER,           -- preempted requests resumed
    num_preempted              INTEGER,           -- requests preempted
    num_finished               INTEGER,           -- requests finished
    running                    INTEGER,           -- requests running after the step
    waiting                    INTEGER,           -- requests waiting after the step
    free_blocks_sched          INTEGER,           -- free blocks after schedule()
    free_blocks                INTEGER,           -- free blocks after the step's update
    cached_blocks              INTEGER,           -- free blocks that still hold a cached prefix
    prefix_queries             BIGINT,            -- prefix-cache lookup tokens this step
    prefix_hits                BIGINT,            -- of those, hits
    preempted_prefix_queries   BIGINT,            -- lookups of resumed requests
    preempted_prefix_hits      BIGINT,            -- of those, hits
    active_blocks              INTEGER,           -- blocks referenced by requests
    empty_blocks               INTEGER,           -- free blocks holding nothing
    kv_usage                   DOUBLE,            -- vLLM's kv_usage: active / usable blocks
    physical_usage             DOUBLE,            -- (active + cached) / usable blocks
    kv_cache_active_bytes      BIGINT,            -- bytes of active blocks
    kv_cache_cached_bytes      BIGINT,            -- bytes of cached blocks
    spec_tokens                BIGINT,            -- speculative decoding: draft tokens verified in this step (counted in decode_tokens)
    spec_accepted              BIGINT,            -- of those, accepted
    offload_lookups            INTEGER,           -- connector lookups (get_num_new_matched_tokens) this step; NULL without a KV offload tier
    offload_lookup_hits        INTEGER,           -- of those, offering CPU-tier tokens; NULL without a KV offload tier
    offload_lookups_deferred   INTEGER,           -- of those, answered 'ask again' (None); NULL without a KV offload tier
    offload_loads              INTEGER,           -- load jobs issued (CPU tier to GPU); NULL without a KV offload tier
    offload_load_tokens        BIGINT,            -- tokens those loads bring; NULL without a KV offload tier
    offload_load_chunks        BIGINT,            -- CPU-tier blocks they read; NULL without a KV offload tier
    offload_load_bytes         BIGINT,            -- bytes they read; NULL without a KV offload tier
    offload_stores             INTEGER,           -- store jobs issued (GPU to CPU tier); NULL without a KV offload tier
    offload_store_chunks       BIGINT,            -- CPU-tier blocks they write; NULL without a KV offload tier
    offload_store_bytes        BIGINT,            -- bytes they write; NULL without a KV offload tier
    offload_flushed            INTEGER,           -- jobs flushed (jobs_to_flush); NULL without a KV offload tier
    offload_cpu_evicted        BIGINT,            -- CPU-tier blocks evicted by this step's stores; NULL without a KV offload tier
    offload_completed          INTEGER,           -- jobs the worker reported finished; NULL without a KV offload tier
    offload_recving            INTEGER,           -- loads reported finished (finished_recving); NULL without a KV offload tier
    offload_remote_wait        INTEGER,           -- requests in WAITING_FOR_REMOTE_KVS after schedule(); NULL without a KV offload tier
    offload_cpu_used           BIGINT,            -- CPU-tier blocks holding data after the step; NULL without a KV offload tier
    offload_cpu_evictable      BIGINT,            -- of those, evictable (stored, not being read); NULL without a KV offload tier
    offload_disk_queries       INTEGER,           -- chunk lookups that reached the disk tier (CPU misses); NULL without a disk tier
    offload_disk_hits          INTEGER,           -- of those, found on disk (each read back into the CPU tier); NULL without a disk tier
    offload_disk_read_chunks   BIGINT,            -- blocks this step's reads bring from disk to the CPU tier; NULL without a disk tier
    offload_disk_read_bytes    BIGINT,            -- bytes they read; NULL without a disk tier
    offload_disk_write_chunks  BIGINT,            -- blocks written from the CPU tier to disk (not on disk yet); NULL without a disk tier
    offload_disk_write_bytes   BIGINT,            -- bytes they write; NULL without a disk tier
    offload_disk_chunks        BIGINT             -- blocks on disk after the step (the tier never evicts); NULL without a disk tier
);
