-- 005_predictor: what the predictor keeps between planning a measured T1 run and
-- answering it, and the measured_history columns its refinement reads back.
--
-- A measured run is finalized when its bench is completed and every measured
-- candidate has a final gate verdict (gate_results). bench.completed and the
-- gate.evaluated events arrive in any order and on any replica: each handler locks
-- the bench row (SELECT ... FOR UPDATE) before it stores what it got and checks, so
-- the last one sees everything and finalized_at makes the answer happen once.

-- One per T1 run that is measured here. run_id has no foreign key, as in
-- bench_results: the row is the predictor's, whoever owns the run row.
-- request: RunCreateRequest; plan: BenchPlan; baseline: Measurement; results:
-- list[Measurement]; failures: list[CandidateFailure] (all of bench.completed).
CREATE TABLE benches (
    bench_id     spec_id PRIMARY KEY,
    run_id       spec_id NOT NULL UNIQUE,
    tenant_id    spec_id NOT NULL,
    request      jsonb NOT NULL,
    plan         jsonb NOT NULL,
    baseline     jsonb,
    results      jsonb,
    failures     jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz,
    finalized_at timestamptz,
    CHECK ((completed_at IS NULL) = (baseline IS NULL)),
    CHECK ((completed_at IS NULL) = (results IS NULL)),
    CHECK (finalized_at IS NULL OR completed_at IS NOT NULL)
);

-- The predictor's HistoryRow needs the exact temperature (its bucket is derived), the
-- tree shape (a tree's accepted / drafted cannot be turned back into a chain
-- acceptance) and how much a row counts (the reps behind it).
ALTER TABLE measured_history
    ADD COLUMN temperature double precision NOT NULL DEFAULT 0 CHECK (temperature >= 0),
    ADD COLUMN tree integer[],
    ADD COLUMN weight double precision NOT NULL DEFAULT 1 CHECK (weight >= 0);
-- Planning reads the newest rows of one fingerprint.
CREATE INDEX measured_history_recent ON measured_history (fingerprint, created_at DESC);
