-- query: sim_vs_real
-- purpose: how far off the simulator is on measured hardware: every measured vllm bench serve run
--          beside every simulated shard of the same model, GPU, tensor parallelism, request rate and
--          concurrency cap, with the relative errors (simulated / measured - 1) of mean TTFT, TPOT,
--          ITL and E2E latency and of output throughput.  A measured run no shard matches shows NULLs.  The
--          shard's rate and cap are its run's replay.poisson_rate and replay.max_concurrency; a measured
--          run at rate inf (NULL) matches no shard.
-- grain:   one row per (measured run, matching shard); a measured run without a match once.
-- sources: measured_runs, run_shards (runs, shards), shards.engine_config, runs.spec, summaries.
-- param run VARCHAR = NULL: only shards of this run (name, id or id prefix; default: every run)
WITH sim AS (
    SELECT rs.run_id, rs.run_name, rs.shard_id,
           coalesce(json_extract_string(sh.engine_config, '$.model'),
                    json_extract_string(sh.engine_config, '$.time_model.model'), sh.model) AS model,
           json_extract_string(sh.engine_config, '$.time_model.gpu') AS gpu,
           CAST(json_extract(sh.engine_config, '$.time_model.tp') AS INTEGER) AS tp,
           CAST(json_extract(r.spec, '$.replay.poisson_rate') AS DOUBLE) AS request_rate,
           CAST(json_extract(r.spec, '$.replay.max_concurrency') AS INTEGER) AS max_concurrency,
           sm.ttft_mean_s, sm.tpot_mean_s, sm.itl_mean_s, sm.e2e_mean_s, sm.throughput_tok_s
    FROM run_shards AS rs
    JOIN runs AS r USING (run_id)
    JOIN shards AS sh USING (run_id, shard_id)
    JOIN summaries AS sm USING (run_id, shard_id)
    WHERE $run IS NULL OR rs.run_id = resolve_run($run)
)
SELECT
    m.model,                                                                    -- model
    m.gpu,                                                                      -- GPU
    m.tp,                                                                       -- tensor parallelism
    m.request_rate,                                                             -- requests per second (NULL: inf)
    m.max_concurrency,                                                          -- client's cap (NULL: none)
    m.source,                                                                   -- measured result file
    m.run_index,                                                                -- its run
    s.run_name,                                                                 -- simulated run (NULL: no match)
    s.run_id,                                                                   -- its id
    s.shard_id,                                                                 -- its shard
    round(1e3 * m.ttft_mean_s, 2) AS measured_ttft_ms,                          -- mean TTFT, measured
    round(1e3 * s.ttft_mean_s, 2) AS sim_ttft_ms,                               -- simulated
    round(s.ttft_mean_s / m.ttft_mean_s - 1, 4) AS ttft_error,                  -- simulated / measured - 1
    round(1e3 * m.tpot_mean_s, 3) AS measured_tpot_ms,                          -- mean TPOT, measured
    round(1e3 * s.tpot_mean_s, 3) AS sim_tpot_ms,                               -- simulated
    round(s.tpot_mean_s / m.tpot_mean_s - 1, 4) AS tpot_error,                  -- simulated / measured - 1
    round(1e3 * m.itl_mean_s, 3) AS measured_itl_ms,                            -- mean ITL, measured
    round(1e3 * s.itl_mean_s, 3) AS sim_itl_ms,                                 -- simulated
    round(s.itl_mean_s / m.itl_mean_s - 1, 4) AS itl_error,                     -- simulated / measured - 1
    round(1e3 * m.e2e_mean_s, 2) AS measured_e2e_ms,                            -- mean E2E latency, measured
    round(1e3 * s.e2e_mean_s, 2) AS sim_e2e_ms,                                 -- simulated
    round(s.e2e_mean_s / m.e2e_mean_s - 1, 4) AS e2e_error,                     -- simulated / measured - 1
    round(m.throughput_tok_s, 1) AS measured_tok_s,                             -- output tokens/s, measured
    round(s.throughput_tok_s, 1) AS sim_tok_s,                                  -- simulated
    round(s.throughput_tok_s / m.throughput_tok_s - 1, 4) AS throughput_error   -- simulated / measured - 1
FROM measured_runs AS m
LEFT JOIN sim AS s
    ON s.model = m.model AND s.gpu = m.gpu AND s.tp = m.tp AND s.request_rate = m.request_rate
   AND s.max_concurrency IS NOT DISTINCT FROM m.max_concurrency
ORDER BY m.model, m.gpu, m.tp, m.request_rate, m.max_concurrency, m.source, m.run_index, s.run_id, s.shard_id;
