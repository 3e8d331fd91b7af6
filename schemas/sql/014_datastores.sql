-- 014_datastores: customer corpora for the rest family (POST datastores; schemas/registry.py).
--
-- The corpus file itself is in the artifact store (SPECOPS_ARTIFACT_DIR), at `path`;
-- the id is derived from (tenant, sha256), so an upload of the same bytes by the same
-- tenant finds its row. The gateway writes `datastores` and publishes
-- registry.datastore_registered; the predictor keeps what it learns from that event in
-- `predictor_datastores`, to offer each tenant's datastores in that tenant's runs only.

CREATE TABLE datastores (
    id           spec_id PRIMARY KEY,
    tenant_id    spec_id NOT NULL REFERENCES tenants (id),
    name         text NOT NULL,
    sha256       text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size_bytes   bigint NOT NULL CHECK (size_bytes > 0),
    format       text NOT NULL CHECK (format IN ('text', 'jsonl')),
    documents    integer NOT NULL CHECK (documents > 0),
    fingerprints text[] NOT NULL DEFAULT '{}',
    path         text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, sha256)
);
CREATE INDEX datastores_by_tenant ON datastores (tenant_id, created_at DESC);

ALTER TABLE datastores ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON datastores TO specops_app
    USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());

CREATE TABLE predictor_datastores (
    datastore_id text PRIMARY KEY,
    tenant_id    text NOT NULL,
    name         text NOT NULL,
    size_bytes   bigint NOT NULL,
    fingerprints text[] NOT NULL DEFAULT '{}',
    registered_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX predictor_datastores_by_tenant ON predictor_datastores (tenant_id);
