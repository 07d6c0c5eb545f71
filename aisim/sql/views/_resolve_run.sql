-- macro: resolve_run(sel)
-- purpose: the run_id a user means by `sel`: a run id, else the latest run of that name, else the
--          latest run whose id starts with `sel`; NULL means the latest run of all.  Named queries
--          filter with `run_id = resolve_run($run)`.
-- grain:   a scalar (one run_id, or NULL when nothing matches).
-- sources: runs.
CREATE OR REPLACE MACRO resolve_run(sel) AS (
    SELECT run_id                                          -- the chosen run
    FROM runs
    WHERE sel IS NULL OR run_id = sel OR name = sel OR starts_with(run_id, sel)
    ORDER BY CASE WHEN run_id = sel THEN 0 WHEN name = sel THEN 1 ELSE 2 END, run_seq DESC
    LIMIT 1
);
