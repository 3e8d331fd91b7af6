-- 019_head_usage: the training seconds the security service has counted per head (issue 20,
-- GPU budget). It counts each head.epoch_completed's seconds so far and then the rest at
-- head.trained, so a head that fails after some epochs has them counted and an epoch a
-- resumed head reports again adds nothing. Tenant-scoped like every table with a tenant_id
-- (018_rls): ENABLEd, FORCEd, and visible to specops_app inside its tenant's transaction only.

CREATE TABLE security_head_usage (
    tenant_id spec_id NOT NULL,
    head_id   text NOT NULL,
    counted_s double precision NOT NULL CHECK (counted_s >= 0),
    PRIMARY KEY (tenant_id, head_id)
);

ALTER TABLE security_head_usage ENABLE ROW LEVEL SECURITY;
ALTER TABLE security_head_usage FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON security_head_usage TO specops_app
    USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());
