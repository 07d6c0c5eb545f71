-- view: spec_acceptance
-- purpose: speculative decoding per shard: draft tokens verified and accepted, the acceptance rate
--          and its distribution over requests, the steps that verified drafts, and TPOT.  A shard
--          replayed without speculative decoding has draft_tokens = 0 and NULL rates.
-- grain:   one row per (run_id, shard_id).
-- sources: run_shards (runs, shards), requests, steps.
-- A request's acceptance rate is spec_accepted / spec_drafts over requests that verified drafts;
-- vLLM's -1 padding of a one-token admission counts as drafts, never accepted.
CREATE OR REPLACE VIEW spec_acceptance AS
WITH per_request AS (
    SELECT
        run_id,
        shard_id,
        count(*) AS requests,
        count(*) FILTER (WHERE spec_drafts > 0) AS spec_requests,
        sum(spec_drafts) AS draft_tokens,
        sum(spec_accepted) AS accepted_tokens,
        sum(output_tokens) AS output_tokens,
        quantile_cont(spec_accepted / spec_drafts, 0.10) FILTER (WHERE spec_drafts > 0) AS rate_p10,
        quantile_cont(spec_accepted / spec_drafts, 0.50) FILTER (WHERE spec_drafts > 0) AS rate_p50,
        quantile_cont(spec_accepted / spec_drafts, 0.90) FILTER (WHERE spec_drafts > 0) AS rate_p90,
        quantile_cont(tpot_s, 0.50) AS tpot_p50_s,
        quantile_cont(tpot_s, 0.90) AS tpot_p90_s
    FROM requests
    GROUP BY run_id, shard_id
),
per_step AS (
    SELECT
        run_id,
        shard_id,
        count(*) FILTER (WHERE spec_tokens > 0) AS spec_steps,
        sum(spec_tokens) AS step_draft_tokens
    FROM steps
    GROUP BY run_id, shard_id
)
SELECT
    rs.*,  -- the shard's keys (run_shards): run_id, run_seq, run_name, shard_id, model, engine
    q.requests,                                                         -- requests replayed
    q.spec_requests,                                                    -- of those, requests that verified drafts
    q.draft_tokens,                                                     -- draft tokens scheduled for verification
    q.accepted_tokens,                                                  -- of those, accepted
    q.accepted_tokens / nullif(q.draft_tokens, 0) AS acceptance_rate,  -- accepted / drafted, whole shard
    q.rate_p10 AS acceptance_rate_p10,                                  -- per-request acceptance rate: 10th percentile
    q.rate_p50 AS acceptance_rate_p50,                                  -- median
    q.rate_p90 AS acceptance_rate_p90,                                  -- 90th percentile
    coalesce(st.spec_steps, 0) AS spec_steps,                           -- steps that verified drafts
    q.output_tokens,                                                    -- output tokens, all requests
    q.tpot_p50_s,                                                       -- TPOT median
    q.tpot_p90_s                                                        -- TPOT 90th percentile
FROM run_shards AS rs
JOIN per_request AS q USING (run_id, shard_id)
LEFT JOIN per_step AS st USING (run_id, shard_id);
