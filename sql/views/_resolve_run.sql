-- macro: resolve_run(sel)
-- purpose: the run_id a user means by `sel`: a run id, else the latest run of that name, else the
--          one run whose id starts with `sel`; NULL means the latest run of all.  An id prefix that
--          several runs share is an error naming them (no silent pick).  Named queries filter with
--          `run_id = resolve_run($run)`; the report picks its run with it too.
-- grain:   a scalar (one run_id, or NULL when nothing matches).
-- sources: runs.
CREATE OR REPLACE MACRO resolve_run(sel) AS (
    WITH hit AS (
        SELECT run_id, name, run_seq,                      -- a candidate run
               CASE WHEN sel IS NULL OR run_id = sel THEN 0 WHEN name = sel THEN 1 ELSE 2 END AS how  -- matched by
        FROM runs
        WHERE sel IS NULL OR run_id = sel OR name = sel OR starts_with(run_id, sel)
    ), best AS (
        SELECT * FROM hit WHERE how = (SELECT min(how) FROM hit)
    )
    SELECT CASE
        WHEN min(how) = 2 AND count(*) > 1 THEN error(
            'run id prefix ''' || sel || ''' is ambiguous: ' || count(*) || ' run ids start with it: '
            || string_agg(run_id || ' (''' || name || ''', #' || run_seq || ')', ', ' ORDER BY run_seq DESC)
            || '; give more of the id')
        ELSE arg_max(run_id, run_seq) END                   -- the chosen run
    FROM best
);
