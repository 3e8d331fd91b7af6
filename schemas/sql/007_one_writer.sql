-- 007_one_writer: every table is written by one service (services/README.md, "Table
-- ownership"). Until now the predictor also wrote the quality gate's gate_results and the
-- winner_cache the gateway answers from, and read the gateway's runs to decide whether a
-- dead letter may still fail a run. It now keeps what it learns in tables of its own:
--  * benches.verdicts: the gate.evaluated verdicts of a bench as they arrived
--    (candidate_id -> GateOutcome), written under the bench's row lock like the rest of it;
--  * predictor_runs: the runs it was asked to answer (run.requested) and whether they have
--    ended, by its own answer or by the run.failed of another service.
-- The gateway's projector now writes winner_cache when it records a run.completed.

ALTER TABLE benches ADD COLUMN verdicts jsonb NOT NULL DEFAULT '{}';

-- Benches still open when this ships keep the verdicts they have received.
UPDATE benches SET verdicts = g.verdicts
FROM (
    SELECT bench_id,
           jsonb_object_agg(candidate_id, jsonb_build_object(
               'method', method, 'passed', passed, 'score', score, 'threshold', threshold,
               'details', details)) AS verdicts
    FROM gate_results GROUP BY bench_id
) g
WHERE benches.bench_id = g.bench_id;

-- run_id has no foreign key, as in benches: the row is the predictor's, whoever owns the
-- run row. ended_at: the run's run.completed or run.failed is out, so a dead letter of one
-- of its events fails nothing more.
CREATE TABLE predictor_runs (
    run_id       spec_id PRIMARY KEY,
    tenant_id    spec_id NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now(),
    ended_at     timestamptz
);

-- The runs the predictor knew through the runs table until now, ended as that table or
-- their bench says (an answered bench may not have been projected yet).
INSERT INTO predictor_runs (run_id, tenant_id, requested_at, ended_at)
SELECT runs.id, runs.tenant_id, runs.created_at,
       CASE WHEN runs.status IN ('completed', 'failed') THEN runs.updated_at
            ELSE coalesce(benches.finalized_at, benches.failed_at) END
FROM runs LEFT JOIN benches ON benches.run_id = runs.id;
