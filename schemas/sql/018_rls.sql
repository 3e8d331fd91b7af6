-- 018_rls: row-level security on every table with a tenant_id, enforced on the services
-- (issue 20, F-S1 and item 7), and measured_history per tenant.
--
-- Who sees what
--  * The services never run as the tables' owner. Every connection of a service pool
--    (specplatform.db.create_pool) does SET ROLE specops_app as soon as it is opened:
--    specops_app owns nothing, has no BYPASSRLS, and (a superuser login included) is
--    bound by every policy below. Each table with a tenant_id has ROW LEVEL SECURITY
--    ENABLEd and FORCEd (FORCE binds the owner too, where it is not a superuser) and a
--    tenant_isolation policy for specops_app: a row is visible and writable only inside
--    a transaction whose app.tenant_id is its tenant. Outside one, current_tenant() is
--    NULL and a query sees nothing.
--  * Tenant context is always explicit: specplatform.db.tenant_transaction (HTTP
--    requests, the gateway's projectors, the reaper's per-run fix, `specops rebuild`),
--    and specbus.process_once, which scopes every consumed event's transaction to the
--    event's tenant (predictor, tuner, benchmark-runner, quality gate). The predictor
--    therefore reads and writes measured_history, benches, predictor_runs,
--    predictor_datastores and predictor_heads of one tenant per event.
--  * Work that must span tenants takes, for one transaction (SET LOCAL ROLE, through
--    specplatform.db.role_transaction), a NOLOGIN role granted exactly that:
--      specops_token_reader  SELECT live api_tokens: authentication looks a bearer
--                            token up by its hash before the tenant is known.
--      specops_run_monitor   SELECT runs and run_events: the gateway's reaper finds the
--                            stalled runs of every tenant (it then fails each one in a
--                            tenant_transaction) and the runs-by-status gauge counts
--                            them. Read only.
--      specops_key_purger    DELETE expired idempotency_keys of every tenant (the
--                            gateway's hourly purge); it sees no live key.
--      specops_tuner_ticker  SELECT the open tuner_sessions (ids and tenants): the
--                            budget ticker then handles each in a tenant_transaction.
--      specops_audit_writer  (008) INSERT into audit_log, and SELECT it (the RETURNING
--                            of the append), every tenant's events and tenant-less ones.
--      specops_audit_reader  SELECT audit_log: `specops audit verify` and the audit
--                            service's check against the stream read the whole chain.
--    The audit chain trigger (SECURITY DEFINER, 008) reads audit_log as its owner, the
--    migrating role: audit_chain gives that role SELECT on audit_log for it.
--  * winner_cache is keyed by cache_scope, which the gateway sets to the run's tenant
--    (specops_services.gateway.cache.key_columns): it is bound the same way on
--    cache_scope. Rows of the old 'shared' scope become invisible, i.e. a cache miss.
--  * Not tenant-scoped, and so without RLS: tenants, the bus's inbox and outbox (event
--    ids are global; the outbox relay publishes every tenant's rows), bench_results,
--    gate_results, tuner_trials (keyed by bench or session, written inside the event's
--    tenant transaction) and hardware_profiles.
--  * Operators' tools (migrations, `specops tokens create`, `specops rebuild`) run as the
--    migrating login. In the shipped deployments it is a superuser, which no policy
--    binds; were it a plain owner, FORCE binds it, and those tools use
--    tenant_transaction or the roles above, never the owner's bypass.
--  * A login that is not the migrating one (a service's own LOGIN role) needs
--    membership in specops_app and in the narrow roles its service takes:
--    GRANT specops_app, specops_token_reader, ... TO that_login.
--
-- measured_history gets a tenant_id: one tenant's measured acceptance must never move
-- another's predictions (the F-S1 leak of issue 20). Existing rows take the tenant of
-- their bench (benches), else of their run (predictor_runs, then runs); a row traceable
-- to none belongs to the deployment's only tenant if it has one, and is dropped
-- otherwise (history is a cache of measurements: dropping one costs a prior's precision,
-- giving it to the wrong tenant would leak). Single-tenant deployments lose nothing.
-- datastores/predictor_datastores and predictor_heads were per tenant already; they
-- are now bound by RLS as well.

ALTER TABLE measured_history ADD COLUMN tenant_id spec_id;
UPDATE measured_history h SET tenant_id = coalesce(
    (SELECT b.tenant_id FROM benches b WHERE b.bench_id = h.bench_id),
    (SELECT p.tenant_id FROM predictor_runs p WHERE p.run_id = h.run_id),
    (SELECT r.tenant_id FROM runs r WHERE r.id = h.run_id),
    (SELECT min(t.id) FROM tenants t HAVING count(*) = 1)
);
DELETE FROM measured_history WHERE tenant_id IS NULL;
ALTER TABLE measured_history ALTER COLUMN tenant_id SET NOT NULL;
DROP INDEX measured_history_recent;
CREATE INDEX measured_history_recent ON measured_history (tenant_id, fingerprint, created_at DESC);
DROP INDEX measured_history_prior;
CREATE INDEX measured_history_prior ON measured_history (tenant_id, family, fingerprint, temperature_bucket, k);


-- The narrow roles ----------------------------------------------------------------------

DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['specops_token_reader', 'specops_run_monitor', 'specops_key_purger',
                             'specops_tuner_ticker', 'specops_audit_reader']
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN NOBYPASSRLS', r);
        END IF;
    END LOOP;
END
$$;
-- Roles made by 001/008 on an older server may predate NOBYPASSRLS being spelled out.
ALTER ROLE specops_app NOBYPASSRLS;
ALTER ROLE specops_audit_writer NOBYPASSRLS;
-- SET ROLE needs membership; a superuser has it implicitly, a plain owner role does not.
GRANT specops_token_reader, specops_run_monitor, specops_key_purger, specops_tuner_ticker,
      specops_audit_reader TO CURRENT_USER;
GRANT USAGE ON SCHEMA public TO specops_token_reader, specops_run_monitor, specops_key_purger,
      specops_tuner_ticker, specops_audit_reader;
GRANT SELECT ON api_tokens TO specops_token_reader;
GRANT SELECT ON runs, run_events TO specops_run_monitor;
GRANT SELECT, DELETE ON idempotency_keys TO specops_key_purger;
GRANT SELECT ON tuner_sessions TO specops_tuner_ticker;
GRANT SELECT ON audit_log, audit_chain_head TO specops_audit_reader;


-- Every table with a tenant_id: ENABLE + FORCE, and tenant_isolation for specops_app ----

DO $$
DECLARE
    t text;
BEGIN
    FOR t IN
        SELECT c.table_name FROM information_schema.columns c
        JOIN information_schema.tables USING (table_schema, table_name)
        WHERE c.table_schema = 'public' AND c.column_name = 'tenant_id' AND table_type = 'BASE TABLE'
    LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format('DROP POLICY IF EXISTS tenant_isolation ON %I', t);
        EXECUTE format('CREATE POLICY tenant_isolation ON %I TO specops_app '
                       'USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant())', t);
    END LOOP;
END
$$;

-- Tables keyed by a tenant-scoped parent (001, 013, 015) keep their policies through the
-- parent and are forced as well.
ALTER TABLE run_events FORCE ROW LEVEL SECURITY;
ALTER TABLE candidates FORCE ROW LEVEL SECURITY;
ALTER TABLE tune_session_events FORCE ROW LEVEL SECURITY;
ALTER TABLE head_events FORCE ROW LEVEL SECURITY;

ALTER TABLE winner_cache ENABLE ROW LEVEL SECURITY;
ALTER TABLE winner_cache FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON winner_cache TO specops_app
    USING (cache_scope = current_tenant()) WITH CHECK (cache_scope = current_tenant());


-- What the narrow roles may see ------------------------------------------------------------

CREATE POLICY token_lookup ON api_tokens FOR SELECT TO specops_token_reader
    USING (revoked_at IS NULL);
CREATE POLICY run_monitor ON runs FOR SELECT TO specops_run_monitor USING (true);
CREATE POLICY run_monitor ON run_events FOR SELECT TO specops_run_monitor USING (true);
CREATE POLICY expired_keys ON idempotency_keys FOR SELECT TO specops_key_purger
    USING (expires_at <= now());
CREATE POLICY expired_keys_purge ON idempotency_keys FOR DELETE TO specops_key_purger
    USING (expires_at <= now());
CREATE POLICY open_sessions ON tuner_sessions FOR SELECT TO specops_tuner_ticker
    USING (ended_at IS NULL);
CREATE POLICY audit_append ON audit_log FOR INSERT TO specops_audit_writer WITH CHECK (true);
CREATE POLICY audit_append_read ON audit_log FOR SELECT TO specops_audit_writer USING (true);
CREATE POLICY audit_read ON audit_log FOR SELECT TO specops_audit_reader USING (true);
DO $$
BEGIN
    EXECUTE format('CREATE POLICY audit_chain ON audit_log FOR SELECT TO %I USING (true)', current_user);
END
$$;
