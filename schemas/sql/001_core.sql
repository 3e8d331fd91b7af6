-- 001_core: tenants and tokens, the T1 run flow (runs, their SSE events, candidates,
-- bench and gate results), the winner cache, the predictor's measured history,
-- hardware profiles and the hash-chained audit log. The bus tables (inbox/outbox)
-- are 002_bus.sql.
--
-- Conventions:
--  * Run, bench and candidate ids travel as NATS subject tokens, so they are text of
--    the subject id grammar (specops_schemas.subjects.ID_PATTERN); event ids are uuid.
--  * Bodies are jsonb holding the pydantic models of specops_schemas, which stay the
--    contract; a value gets its own column only where SQL filters, joins or
--    constrains on it.
--  * Tenant-facing tables have row-level security for the role specops_app, which
--    specops.db.tenant_transaction switches to. The migrating role owns every table
--    and so bypasses RLS: back-end services that work across tenants keep using it.

CREATE DOMAIN spec_id AS text CHECK (VALUE ~ '^[A-Za-z0-9_-]{1,128}$');

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'specops_app') THEN
        CREATE ROLE specops_app NOLOGIN;
    END IF;
END
$$;
-- SET ROLE needs membership; a superuser has it implicitly, a plain owner role does not.
GRANT specops_app TO CURRENT_USER;
GRANT USAGE ON SCHEMA public TO specops_app;
-- Tables of later migrations (002_bus's outbox) must be writable inside the same
-- tenant-scoped transaction as the business rows they accompany.
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO specops_app;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO specops_app;

-- The tenant a tenant_transaction runs as; NULL outside one, which matches no row.
CREATE FUNCTION current_tenant() RETURNS text
    LANGUAGE sql STABLE
    AS $$ SELECT nullif(current_setting('app.tenant_id', true), '') $$;

CREATE FUNCTION touch_updated_at() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END
$$;


-- Tenants and API tokens -----------------------------------------------------------

CREATE TABLE tenants (
    id         spec_id PRIMARY KEY,
    name       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Only a hash of the secret is kept, so a database leak yields no usable token. No
-- RLS: the gateway looks a token up by its hash before it knows the tenant.
CREATE TABLE api_tokens (
    id            spec_id PRIMARY KEY,
    tenant_id     spec_id NOT NULL REFERENCES tenants (id),
    role          text NOT NULL CHECK (role IN ('viewer', 'developer', 'admin', 'head_reviewer')),
    secret_sha256 text NOT NULL UNIQUE CHECK (secret_sha256 ~ '^[0-9a-f]{64}$'),
    name          text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);
CREATE INDEX api_tokens_tenant ON api_tokens (tenant_id);


-- Runs and what the gateway streams about them --------------------------------------

-- request: RunCreateRequest as accepted (defaults filled in). result: winner,
-- candidates and pareto_front of run.completed. error: RunError of run.failed.
CREATE TABLE runs (
    id         spec_id PRIMARY KEY,
    tenant_id  spec_id NOT NULL REFERENCES tenants (id),
    status     text NOT NULL DEFAULT 'queued'
               CHECK (status IN ('queued', 'running', 'predicted', 'completed', 'failed')),
    request    jsonb NOT NULL,
    result     jsonb,
    error      jsonb,
    cache_hit  boolean NOT NULL DEFAULT false,
    measured   boolean,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK (status <> 'failed' OR error IS NOT NULL),
    CHECK (status <> 'completed' OR result IS NOT NULL)
);
CREATE INDEX runs_tenant_created ON runs (tenant_id, created_at DESC);
CREATE TRIGGER runs_updated_at BEFORE UPDATE ON runs
    FOR EACH ROW EXECUTE FUNCTION touch_updated_at();

-- The SSE stream of a run; seq is the SSE id a client resumes from (Last-Event-ID).
-- Writers insert max(seq) + 1: the primary key makes a concurrent writer fail and
-- retry rather than commit out of order, so `seq > last_seen` never skips a row.
-- event_id makes a redelivered bus event a no-op (ON CONFLICT DO NOTHING).
CREATE TABLE run_events (
    run_id      spec_id NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq         integer NOT NULL CHECK (seq >= 1),
    event_id    uuid NOT NULL UNIQUE,
    type        text NOT NULL,
    payload     jsonb NOT NULL,
    occurred_at timestamptz NOT NULL,
    PRIMARY KEY (run_id, seq)
);

-- IETF Idempotency-Key: replay the stored response; a different request_hash under
-- the same key is a 422, a key still in_flight a 409. expires_at is the published
-- retention after which the key may be reused.
CREATE TABLE idempotency_keys (
    tenant_id       spec_id NOT NULL REFERENCES tenants (id),
    key             text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    request_hash    text NOT NULL,
    status          text NOT NULL DEFAULT 'in_flight' CHECK (status IN ('in_flight', 'completed')),
    response_status integer CHECK (response_status BETWEEN 100 AND 599),
    response_body   jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL DEFAULT now() + interval '24 hours',
    PRIMARY KEY (tenant_id, key),
    CHECK (status <> 'completed' OR response_status IS NOT NULL)
);
CREATE INDEX idempotency_keys_expires ON idempotency_keys (expires_at);


-- Candidates, measurements and verdicts ---------------------------------------------

-- The predictor's ranked list (RankedCandidate: candidate + prediction), per run.
CREATE TABLE candidates (
    run_id       spec_id NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    candidate_id spec_id NOT NULL,
    rank         integer NOT NULL CHECK (rank >= 1),
    family       text NOT NULL,
    candidate    jsonb NOT NULL,
    prediction   jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, candidate_id)
);

-- One row per measured rep (bench.rep_measured); candidate_id 'baseline' is the
-- no-speculation reference. The key is what lets a restarted benchmark-runner skip
-- reps already stored and never count one twice. run_id has no foreign key: a bench
-- may serve a tune session as well as a run.
CREATE TABLE bench_results (
    bench_id     spec_id NOT NULL,
    candidate_id spec_id NOT NULL,
    rep          integer NOT NULL CHECK (rep >= 0),
    run_id       spec_id NOT NULL,
    metrics      jsonb NOT NULL,
    tokens_per_s double precision NOT NULL CHECK (tokens_per_s >= 0),
    speedup      double precision CHECK (speedup > 0),
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT bench_results_one_per_rep UNIQUE (bench_id, candidate_id, rep)
);
CREATE INDEX bench_results_run ON bench_results (run_id);

-- One verdict per candidate of a bench (gate.evaluated); a re-evaluation replaces it.
CREATE TABLE gate_results (
    bench_id     spec_id NOT NULL,
    candidate_id spec_id NOT NULL,
    run_id       spec_id NOT NULL,
    method       text NOT NULL,
    passed       boolean,
    score        double precision,
    threshold    double precision,
    details      jsonb NOT NULL DEFAULT '{}',
    evaluated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (bench_id, candidate_id),
    CHECK ((method = 'pending') = (passed IS NULL))
);
CREATE INDEX gate_results_run ON gate_results (run_id);


-- What the predictor knows before measuring -----------------------------------------

-- The 30-day winner cache: a hit answers a run in under a second with cache_hit=true.
-- cache_scope is 'shared' in single-tenant deployments and the tenant id where F-S1
-- (per-tenant caches) is on, so one tenant's winners never reveal another's workload.
-- engine_version is the resolved version ('' when the engine has none), as a key
-- column cannot be NULL. winner is NULL when no candidate beat the baseline: that is
-- an answer worth caching too.
CREATE TABLE winner_cache (
    cache_scope    text NOT NULL DEFAULT 'shared',
    model_ref      text NOT NULL,
    gpu            text NOT NULL,
    engine         text NOT NULL,
    engine_version text NOT NULL DEFAULT '',
    fingerprint    text NOT NULL,
    mode           text NOT NULL,
    quality_gate   text NOT NULL,
    winner         jsonb,
    candidates     jsonb NOT NULL,
    pareto_front   jsonb NOT NULL DEFAULT '[]',
    measured       boolean NOT NULL,
    source_run_id  spec_id,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL DEFAULT now() + interval '30 days',
    PRIMARY KEY (cache_scope, model_ref, gpu, engine, engine_version, fingerprint, mode, quality_gate)
);
CREATE INDEX winner_cache_expires ON winner_cache (expires_at);

-- Acceptance actually measured, which the predictor blends into its priors.
-- temperature_bucket is the predictor's label for a sampling regime (e.g. 'greedy').
CREATE TABLE measured_history (
    id                     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    family                 text NOT NULL,
    draft                  text,
    fingerprint            text NOT NULL,
    temperature_bucket     text NOT NULL,
    k                      integer NOT NULL CHECK (k >= 1),
    acceptance_rate        double precision NOT NULL CHECK (acceptance_rate BETWEEN 0 AND 1),
    mean_acceptance_length double precision CHECK (mean_acceptance_length >= 0),
    speedup                double precision CHECK (speedup > 0),
    model_ref              text NOT NULL,
    gpu                    text NOT NULL,
    run_id                 spec_id,
    bench_id               spec_id,
    created_at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX measured_history_prior ON measured_history (family, fingerprint, temperature_bucket, k);

-- Feasibility (does the draft fit next to the target?) and the memory-bandwidth bound
-- of plain decoding. memory_bytes is the total nvidia-smi reports; bandwidth and
-- flops are datasheet values (SXM parts, dense bf16). The cpu row is nominal (the
-- ~16 GB/s read bandwidth measured on the development hosts); the runner measures
-- the host it runs on.
CREATE TABLE hardware_profiles (
    name                     text PRIMARY KEY,
    kind                     text NOT NULL CHECK (kind IN ('gpu', 'cpu')),
    memory_bytes             bigint NOT NULL CHECK (memory_bytes > 0),
    memory_bandwidth_bytes_s double precision NOT NULL CHECK (memory_bandwidth_bytes_s > 0),
    peak_bf16_flops          double precision CHECK (peak_bf16_flops > 0),
    description              text NOT NULL
);
INSERT INTO hardware_profiles VALUES
    ('H100-80GB', 'gpu', 81559::bigint * 1048576, 3.35e12, 989e12, 'NVIDIA H100 SXM5 80 GB HBM3'),
    ('H200', 'gpu', 143771::bigint * 1048576, 4.8e12, 989e12, 'NVIDIA H200 SXM 141 GB HBM3e'),
    ('A100-80GB', 'gpu', 81920::bigint * 1048576, 2.039e12, 312e12, 'NVIDIA A100 SXM4 80 GB HBM2e'),
    ('L40S', 'gpu', 46068::bigint * 1048576, 864e9, 362e12, 'NVIDIA L40S 48 GB GDDR6'),
    ('cpu', 'cpu', 16::bigint * 1073741824, 16e9, NULL, 'CPU host (nominal: 16 GiB, ~16 GB/s read)');


-- Audit log (F-S4) -------------------------------------------------------------------

-- Every spec.> event, append-only and hash-chained:
--   hash = sha256(prev_hash || payload), prev_hash = hash of the row before (32 zero
--   bytes for the first row), payload = the envelope's canonical JSON bytes
--   (Envelope.to_json_bytes), kept as bytea because jsonb would not round-trip them.
-- The insert trigger chains rows itself under a lock, so writers may leave prev_hash
-- and hash NULL (or pass them, and have them checked), and seq order is chain order
-- even with several audit replicas. `specops audit verify` recomputes the chain.
CREATE SEQUENCE audit_log_seq AS bigint;
CREATE TABLE audit_log (
    seq         bigint PRIMARY KEY,
    event_id    uuid NOT NULL UNIQUE,
    subject     text NOT NULL,
    type        text NOT NULL,
    tenant_id   text NOT NULL,
    payload     bytea NOT NULL,
    prev_hash   bytea NOT NULL UNIQUE CHECK (octet_length(prev_hash) = 32),
    hash        bytea NOT NULL UNIQUE CHECK (octet_length(hash) = 32),
    recorded_at timestamptz NOT NULL DEFAULT now()
);
ALTER SEQUENCE audit_log_seq OWNED BY audit_log.seq;
CREATE INDEX audit_log_tenant ON audit_log (tenant_id, seq);

CREATE FUNCTION audit_log_chain() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    last_hash bytea;
BEGIN
    -- Held to commit: the next writer (READ COMMITTED, the default) then reads this
    -- row as its predecessor.
    PERFORM pg_advisory_xact_lock(hashtext('specops.audit_log'));
    SELECT hash INTO last_hash FROM audit_log ORDER BY seq DESC LIMIT 1;
    last_hash := coalesce(last_hash, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea);
    IF NEW.prev_hash IS NULL THEN
        NEW.prev_hash := last_hash;
    ELSIF NEW.prev_hash <> last_hash THEN
        RAISE EXCEPTION 'audit_log: prev_hash is not the hash of the last row'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.hash IS NULL THEN
        NEW.hash := sha256(NEW.prev_hash || NEW.payload);
    ELSIF NEW.hash <> sha256(NEW.prev_hash || NEW.payload) THEN
        RAISE EXCEPTION 'audit_log: hash is not sha256(prev_hash || payload)'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    -- Numbered under the lock, so seq order is commit order is chain order.
    NEW.seq := nextval('audit_log_seq');
    RETURN NEW;
END
$$;
CREATE TRIGGER audit_log_chain BEFORE INSERT ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_chain();

CREATE FUNCTION audit_log_append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER audit_log_no_update_delete BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();
REVOKE UPDATE, DELETE, TRUNCATE ON audit_log FROM specops_app;


-- Row-level security on tenant-facing tables -----------------------------------------

ALTER TABLE runs ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON runs TO specops_app
    USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());

ALTER TABLE idempotency_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON idempotency_keys TO specops_app
    USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());

-- Rows keyed by run are visible exactly when their run is (the subquery is itself
-- filtered by the runs policy).
ALTER TABLE run_events ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON run_events TO specops_app
    USING (EXISTS (SELECT 1 FROM runs WHERE runs.id = run_events.run_id))
    WITH CHECK (EXISTS (SELECT 1 FROM runs WHERE runs.id = run_events.run_id));

ALTER TABLE candidates ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON candidates TO specops_app
    USING (EXISTS (SELECT 1 FROM runs WHERE runs.id = candidates.run_id))
    WITH CHECK (EXISTS (SELECT 1 FROM runs WHERE runs.id = candidates.run_id));
