-- 022_rls_children: row-level security on the tenant tables 018 left open, a reader role for
-- `specops audit replay --rebuild` and `specops audit diff`, and an unused index dropped.
--
-- What this changes of 018_rls.sql's comment (an applied migration cannot be edited):
--  * bench_results, gate_results and tuner_trials hold a tenant's measurements and were
--    readable by any service connection in any tenant's context. They are now bound
--    through their parent, as candidates are through runs (001): a rep row or a verdict is
--    visible and writable exactly when the run or tune session it measures is (its run_id
--    is a runs.id for a T1 run, a tune_sessions.id for a tune trial's bench), a trial when
--    its tuner_sessions row is. The benchmark-runner and the quality gate therefore write
--    a bench's rows only once the gateway has opened its run or session, which the flow
--    guarantees and the rebuild keeps (it projects the gateway's events first), and only
--    acting for the bench's tenant. 018 says specbus.process_once scoped their work: it
--    scoped only the bench's last event; their reps and verdicts are now read and written
--    in the bench's tenant_transaction. Every table of public now has RLS but tenants,
--    hardware_profiles, inbox, outbox, audit_chain_head and schema_migrations.
--  * `specops audit replay --rebuild` (its check that --into is fresh) and
--    `specops audit diff` read the state tables of every tenant. They did so with no
--    tenant context and no role: under a plain-owner login (no superuser, no BYPASSRLS)
--    FORCE made them see no row, so a non-fresh --into passed and the diff found nothing.
--    They now read, for one transaction (specplatform.db.role_transaction), as
--      specops_rebuild_reader  SELECT the tables the rebuild writes and the diff compares
--                              (specops.runtime.table_diff.TABLES), every tenant's rows.
--    The rebuild's writes run in the event's tenant_transaction (018), as before.
--  * A plain-owner login applies 018 only while it has BYPASSRLS: ALTER ROLE ...
--    NOBYPASSRLS is refused to a role without it. Migrate with such a login (or a
--    superuser), then take BYPASSRLS away; the operators' tools need none of it after.
--  * measured_history_prior, rebuilt by 018, serves no query: the predictor reads a
--    tenant's newest rows of a fingerprint (measured_history_recent). Dropped.

DROP INDEX measured_history_prior;


-- bench_results, gate_results, tuner_trials: through the parent --------------------------

-- Whether the run or tune session `id` is visible: the subqueries are themselves filtered
-- by the runs and tune_sessions policies (a SQL function runs as its caller). The tables
-- are schema-qualified so that no caller's search_path can put another `runs` first.
CREATE FUNCTION measured_run_visible(id text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$ SELECT EXISTS (SELECT 1 FROM public.runs r WHERE r.id = $1)
              OR EXISTS (SELECT 1 FROM public.tune_sessions s WHERE s.id = $1) $$;

ALTER TABLE bench_results ENABLE ROW LEVEL SECURITY;
ALTER TABLE bench_results FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON bench_results TO specops_app
    USING (measured_run_visible(run_id)) WITH CHECK (measured_run_visible(run_id));

ALTER TABLE gate_results ENABLE ROW LEVEL SECURITY;
ALTER TABLE gate_results FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON gate_results TO specops_app
    USING (measured_run_visible(run_id)) WITH CHECK (measured_run_visible(run_id));

ALTER TABLE tuner_trials ENABLE ROW LEVEL SECURITY;
ALTER TABLE tuner_trials FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tuner_trials TO specops_app
    USING (EXISTS (SELECT 1 FROM tuner_sessions s WHERE s.session_id = tuner_trials.session_id))
    WITH CHECK (EXISTS (SELECT 1 FROM tuner_sessions s WHERE s.session_id = tuner_trials.session_id));


-- specops_rebuild_reader ----------------------------------------------------------------------

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'specops_rebuild_reader') THEN
        CREATE ROLE specops_rebuild_reader NOLOGIN NOBYPASSRLS;
    END IF;
END
$$;
-- SET ROLE needs membership; a superuser has it implicitly, a plain owner role does not.
-- INHERIT FALSE: the login may take the role for a transaction, but its own queries do not
-- see every tenant's rows through the role's policies (the roles of 018 are inherited).
GRANT specops_rebuild_reader TO CURRENT_USER WITH INHERIT FALSE, SET TRUE;
GRANT USAGE ON SCHEMA public TO specops_rebuild_reader;

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['runs', 'run_events', 'tune_sessions', 'tune_session_events', 'candidates',
                             'bench_results', 'gate_results', 'datastores', 'heads', 'head_events',
                             'speculative_head_approvals', 'winner_cache']
    LOOP
        EXECUTE format('GRANT SELECT ON %I TO specops_rebuild_reader', t);
        EXECUTE format('CREATE POLICY rebuild_read ON %I FOR SELECT TO specops_rebuild_reader USING (true)', t);
    END LOOP;
END
$$;
