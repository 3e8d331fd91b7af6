-- 012_tuner: the tuner's T2 sessions (services/tuner). Optuna's own tables (its RDB
-- storage: studies, trials, params, values) live in the schema `optuna`, created here
-- and filled by Optuna itself on the tuner's first start; a study is named after its
-- session id.
--
-- A session's handlers lock its row (SELECT ... FOR UPDATE), so bench.completed,
-- gate.evaluated, run.failed, dead letters and the budget ticker, on any replica and
-- in any order, change a session one at a time.
CREATE SCHEMA IF NOT EXISTS optuna;

-- request: the whole tune.requested payload (the T1 run's request, candidates, pareto
-- front); space: list[Dimension]; dropped: dimension -> fixed value; curve:
-- list[CurvePoint]. deadline = started_at + budget_s: downtime (heartbeat gaps the
-- ticker found) counts against the budget and is reported. stop_reason is set when no
-- more trials are asked (budget, max_trials, auto-termination, space exhausted);
-- ended_at once tune.completed or tune.failed is queued.
CREATE TABLE tuner_sessions (
    session_id      spec_id PRIMARY KEY,
    tenant_id       spec_id NOT NULL,
    request         jsonb NOT NULL,
    space           jsonb NOT NULL,
    seeded          integer NOT NULL CHECK (seeded >= 0),
    budget_s        double precision NOT NULL CHECK (budget_s > 0),
    started_at      timestamptz NOT NULL,
    deadline        timestamptz NOT NULL,
    heartbeat_at    timestamptz NOT NULL,
    downtime_s      double precision NOT NULL DEFAULT 0 CHECK (downtime_s >= 0),
    dropped         jsonb NOT NULL DEFAULT '{}',
    importances     jsonb NOT NULL DEFAULT '{}',
    rule_checked    boolean NOT NULL DEFAULT false,
    auto_terminated boolean NOT NULL DEFAULT false,
    curve           jsonb NOT NULL DEFAULT '[]',
    stop_reason     text,
    ended_at        timestamptz,
    failed          boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CHECK (ended_at IS NULL OR stop_reason IS NOT NULL)
);
-- The ticker visits the sessions still running.
CREATE INDEX tuner_sessions_running ON tuner_sessions (session_id) WHERE ended_at IS NULL;

-- One per Optuna trial the tuner asked and committed (trial = Optuna's number). A
-- RUNNING Optuna trial without a row was asked by a tuner that died before its commit:
-- it is told FAIL before the next ask. bench_id is derived from (session, trial), so a
-- re-ask can never measure twice. candidate: Candidate; params: the sampler's;
-- baseline / measurement: Measurement; gate: GateOutcome.
CREATE TABLE tuner_trials (
    session_id    spec_id NOT NULL REFERENCES tuner_sessions (session_id),
    trial         integer NOT NULL CHECK (trial >= 0),
    bench_id      spec_id NOT NULL UNIQUE,
    candidate     jsonb NOT NULL,
    params        jsonb NOT NULL,
    seeded        boolean NOT NULL,
    state         text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'complete', 'failed')),
    value         double precision,
    baseline      jsonb,
    measurement   jsonb,
    gate          jsonb,
    error_stage   text,
    error_message text,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    PRIMARY KEY (session_id, trial),
    CHECK ((state = 'complete') = (value IS NOT NULL)),
    CHECK ((state = 'failed') = (error_stage IS NOT NULL)),
    CHECK ((state = 'running') = (finished_at IS NULL))
);
