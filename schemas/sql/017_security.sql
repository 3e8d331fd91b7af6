-- 017_security: the tenants' security policies (schemas/security.py) and their GPU budget.
--
-- The security service owns `security_policies` (one row per tenant that has set one; a
-- tenant without a row has the default policy, version 0), `security_usage` (measurement
-- seconds per tenant and calendar month, UTC, fed by bench.rep_measured and head.trained). Every change is a security.policy_changed event; the others keep a read model
-- of what they need from those events: the gateway `gateway_security_policies` (GET
-- policy, the opt-out and the budget of POSTs) with `gateway_budget_exhaustions` (from
-- security.budget_exhausted), the predictor `predictor_policies` and the tuner
-- `tuner_policies` (F-S3 opt-out).
--
-- The security service's tables are bound for their owner too (FORCE): it reads and writes
-- them inside a tenant transaction only, so a query without a tenant context sees nothing.

CREATE TABLE security_policies (
    tenant_id  spec_id PRIMARY KEY,
    version    integer NOT NULL CHECK (version >= 1),
    policy     jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE security_usage (
    tenant_id          spec_id NOT NULL,
    month              date NOT NULL CHECK (extract(day FROM month) = 1),
    used_s             double precision NOT NULL DEFAULT 0 CHECK (used_s >= 0),
    -- The budget a security.budget_exhausted was published for this month (once per budget).
    exhausted_budget_s double precision,
    PRIMARY KEY (tenant_id, month)
);

CREATE TABLE gateway_security_policies (
    tenant_id          spec_id PRIMARY KEY,
    version            integer NOT NULL CHECK (version >= 1),
    policy             jsonb NOT NULL,
    requested_event_id uuid
);

CREATE TABLE gateway_budget_exhaustions (
    tenant_id spec_id NOT NULL,
    month     date NOT NULL,
    budget_s  double precision NOT NULL,
    used_s    double precision NOT NULL,
    resets_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, month)
);

CREATE TABLE predictor_policies (
    tenant_id            spec_id PRIMARY KEY,
    version              integer NOT NULL,
    speculation_disabled boolean NOT NULL
);

CREATE TABLE tuner_policies (
    tenant_id            spec_id PRIMARY KEY,
    version              integer NOT NULL,
    speculation_disabled boolean NOT NULL
);

ALTER TABLE security_policies ENABLE ROW LEVEL SECURITY;
ALTER TABLE security_policies FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON security_policies TO specops_app
    USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());

ALTER TABLE security_usage ENABLE ROW LEVEL SECURITY;
ALTER TABLE security_usage FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON security_usage TO specops_app
    USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());

-- The read models: tenant-scoped as the other tables of their services (015_heads' pattern).
ALTER TABLE gateway_security_policies ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON gateway_security_policies TO specops_app
    USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());

ALTER TABLE gateway_budget_exhaustions ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON gateway_budget_exhaustions TO specops_app
    USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());

ALTER TABLE predictor_policies ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON predictor_policies TO specops_app
    USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());

ALTER TABLE tuner_policies ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tuner_policies TO specops_app
    USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());
