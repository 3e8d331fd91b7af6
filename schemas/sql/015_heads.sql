-- 015_heads: the T3 head registry (schemas/heads.py). The gateway is its one writer:
-- POST heads/data records an upload (`head_data`), POST heads/train opens a head with its
-- head.requested (`heads`), its heads projector folds the trainer's and the quality gate's
-- head.* events in and every head.transitioned it publishes (`head_events`, the head's SSE
-- stream), and a `uat -> production` move writes its sign-off (`speculative_head_approvals`).
-- services/gateway/heads_projection.py is the code that writes them, live and in a rebuild.
--
-- head: the HeadResponse as folded so far (its timestamps are the row's, filled in on read).

CREATE TABLE head_data (
    tenant_id  spec_id NOT NULL REFERENCES tenants (id),
    sha256     text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size_bytes bigint NOT NULL CHECK (size_bytes > 0),
    examples   integer NOT NULL CHECK (examples > 0),
    path       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, sha256)
);

CREATE TABLE heads (
    id         spec_id PRIMARY KEY,
    tenant_id  spec_id NOT NULL REFERENCES tenants (id),
    state      text NOT NULL DEFAULT 'training' CHECK (
        state IN ('training', 'validated', 'rejected', 'failed', 'uat', 'production', 'deprecated')
    ),
    target     text NOT NULL,
    family     text NOT NULL,
    head       jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX heads_tenant_created ON heads (tenant_id, created_at DESC);
CREATE TRIGGER heads_updated_at BEFORE UPDATE ON heads
    FOR EACH ROW EXECUTE FUNCTION touch_updated_at();

-- The SSE stream of a head, as run_events is a run's: seq is the SSE id.
CREATE TABLE head_events (
    head_id     spec_id NOT NULL REFERENCES heads (id) ON DELETE CASCADE,
    seq         integer NOT NULL CHECK (seq >= 1),
    event_id    uuid NOT NULL UNIQUE,
    type        text NOT NULL,
    payload     jsonb NOT NULL,
    occurred_at timestamptz NOT NULL,
    PRIMARY KEY (head_id, seq)
);

-- Who signed a head off to production, and why (one row per uat -> production move).
CREATE TABLE speculative_head_approvals (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    head_id     spec_id NOT NULL REFERENCES heads (id),
    tenant_id   spec_id NOT NULL REFERENCES tenants (id),
    event_id    uuid NOT NULL UNIQUE,
    from_state  text NOT NULL,
    to_state    text NOT NULL,
    actor       text NOT NULL,
    role        text NOT NULL,
    rationale   text NOT NULL,
    approved_at timestamptz NOT NULL
);
CREATE INDEX speculative_head_approvals_head ON speculative_head_approvals (head_id);

ALTER TABLE head_data ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON head_data TO specops_app
    USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());

ALTER TABLE heads ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON heads TO specops_app
    USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());

ALTER TABLE head_events ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON head_events TO specops_app
    USING (EXISTS (SELECT 1 FROM heads h WHERE h.id = head_events.head_id))
    WITH CHECK (EXISTS (SELECT 1 FROM heads h WHERE h.id = head_events.head_id));

ALTER TABLE speculative_head_approvals ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON speculative_head_approvals TO specops_app
    USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());

-- Open event streams wake on a new event, on the runs' channel (003_gateway): its payload
-- is the id of the stream that moved.
CREATE OR REPLACE FUNCTION head_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('run_events', NEW.head_id);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER head_events_notify
    AFTER INSERT ON head_events
    FOR EACH ROW EXECUTE FUNCTION head_events_notify();
