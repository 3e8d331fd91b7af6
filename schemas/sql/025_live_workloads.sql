-- 025_live_workloads: the gateway's read model of the tenants' live workloads (issue 44).
--
-- An engine server with ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT publishes each tenant's rolling
-- summary of its requests (workload.summarized: fingerprint probabilities summed over the
-- window, no text); the gateway keeps the latest per (tenant, served model). A run asking for
-- `"fingerprint": "auto"` without samples takes its fingerprint from its own tenant's row for
-- its target. Several servers of one model and tenant write one row: the latest summary wins.

CREATE TABLE gateway_live_workloads (
    tenant_id     spec_id NOT NULL,
    model_ref     text NOT NULL,
    server_id     spec_id NOT NULL,
    summary       jsonb NOT NULL,
    summarized_at timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, model_ref)
);

-- Bound as every table with a tenant_id (018_rls): visible only in its tenant's transaction.
ALTER TABLE gateway_live_workloads ENABLE ROW LEVEL SECURITY;
ALTER TABLE gateway_live_workloads FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON gateway_live_workloads TO specops_app
    USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());
