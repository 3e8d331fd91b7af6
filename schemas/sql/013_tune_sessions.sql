-- 013_tune_sessions: what the gateway shows of T2 tune sessions (schemas/tune.py). The
-- gateway owns both tables: POST tune-sessions opens a session with its tune.requested,
-- and its tune projector folds the tuner's tune.* events in (services/gateway/tune_projection.py).
-- The tuner keeps its own state in 012_tuner's tables; these are the client's view.
--
-- session: the TuneSessionResponse as folded so far (id, timestamps and curve_png are
-- filled in on read). source: what tune.requested carried of the T1 run (its request,
-- candidates, pareto front and winner), from which the tuned winner is cached.
CREATE TABLE tune_sessions (
    id         spec_id PRIMARY KEY,
    tenant_id  spec_id NOT NULL REFERENCES tenants (id),
    run_id     spec_id NOT NULL REFERENCES runs (id),
    status     text NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'running', 'completed', 'failed')),
    session    jsonb NOT NULL,
    source     jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tune_sessions_tenant_created ON tune_sessions (tenant_id, created_at DESC);
CREATE INDEX tune_sessions_run ON tune_sessions (run_id);
CREATE TRIGGER tune_sessions_updated_at BEFORE UPDATE ON tune_sessions
    FOR EACH ROW EXECUTE FUNCTION touch_updated_at();

-- The SSE stream of a session, as run_events is a run's: seq is the SSE id.
CREATE TABLE tune_session_events (
    session_id  spec_id NOT NULL REFERENCES tune_sessions (id) ON DELETE CASCADE,
    seq         integer NOT NULL CHECK (seq >= 1),
    event_id    uuid NOT NULL UNIQUE,
    type        text NOT NULL,
    payload     jsonb NOT NULL,
    occurred_at timestamptz NOT NULL,
    PRIMARY KEY (session_id, seq)
);

ALTER TABLE tune_sessions ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tune_sessions TO specops_app
    USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());

ALTER TABLE tune_session_events ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tune_session_events TO specops_app
    USING (EXISTS (SELECT 1 FROM tune_sessions s WHERE s.id = tune_session_events.session_id))
    WITH CHECK (EXISTS (SELECT 1 FROM tune_sessions s WHERE s.id = tune_session_events.session_id));

-- Open event streams wake on a new event. The channel is the runs' (003_gateway): its
-- payload is the id of the stream that moved, and session ids are uuid4s as run ids are.
CREATE OR REPLACE FUNCTION tune_session_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('run_events', NEW.session_id);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER tune_session_events_notify
    AFTER INSERT ON tune_session_events
    FOR EACH ROW EXECUTE FUNCTION tune_session_events_notify();
