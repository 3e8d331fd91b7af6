-- 008_audit_role: the audit log is written by a role that can only insert, and its
-- duplicate check cannot be poisoned by a forged event id.
--
--  * specops_audit_writer (NOLOGIN) may INSERT into audit_log and read it back (the
--    append's RETURNING seq), nothing else: no UPDATE, DELETE or TRUNCATE of audit_log,
--    no write to audit_chain_head. The audit service takes this role for each append
--    (SET LOCAL ROLE, services/audit/db.py), whichever login it connected with. The
--    chain trigger is SECURITY DEFINER (004), so the head still moves, as its owner.
--  * A message is a duplicate when its SPEC stream sequence is recorded already (one
--    message, one row), no longer when its event_id is: a message carrying the id of
--    an event still to come made the audit skip the real event when it came. event_id
--    stays a column (indexed, no longer unique); an entry without a stream sequence
--    (written outside the stream, e.g. by hand) is still a duplicate by its event_id.
--
-- The row hash (004) is unchanged, so existing rows verify as before.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'specops_audit_writer') THEN
        CREATE ROLE specops_audit_writer NOLOGIN;
    END IF;
END
$$;
-- SET ROLE needs membership; a superuser has it implicitly, a plain owner role does not.
GRANT specops_audit_writer TO CURRENT_USER;
GRANT USAGE ON SCHEMA public TO specops_audit_writer;
REVOKE ALL ON audit_log, audit_chain_head FROM specops_audit_writer;
GRANT SELECT, INSERT ON audit_log TO specops_audit_writer;

ALTER TABLE audit_log DROP CONSTRAINT audit_log_event_id_key;
CREATE INDEX audit_log_event_id ON audit_log (event_id);
CREATE UNIQUE INDEX audit_log_stream_seq ON audit_log (stream_seq);

CREATE OR REPLACE FUNCTION audit_log_chain() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
    AS $$
DECLARE
    head audit_chain_head%ROWTYPE;
BEGIN
    IF NEW.seq IS NOT NULL OR NEW.prev_hash IS NOT NULL OR NEW.hash IS NOT NULL THEN
        RAISE EXCEPTION 'audit_log: seq, prev_hash and hash are set by the chain, not by writers'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    SELECT * INTO head FROM audit_chain_head FOR UPDATE;
    -- A new statement, so a new snapshot: it sees a duplicate committed while we waited.
    IF NEW.stream_seq IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM audit_log WHERE stream_seq = NEW.stream_seq) THEN
            RETURN NULL;
        END IF;
    ELSIF EXISTS (SELECT 1 FROM audit_log WHERE event_id = NEW.event_id AND stream_seq IS NULL) THEN
        RETURN NULL;
    END IF;
    NEW.seq := nextval('audit_log_seq');
    -- The database's clock, not the writer's: an audit row cannot be backdated.
    NEW.recorded_at := now();
    NEW.prev_hash := head.hash;
    NEW.hash := audit_row_hash(NEW.prev_hash, NEW.seq, NEW.event_id, NEW.subject, NEW.type,
                               NEW.tenant_id, NEW.stream_seq, NEW.recorded_at, NEW.payload);
    -- Moved here rather than in an AFTER trigger, which would fire only at the end of a
    -- multi-row INSERT, after later rows had chained onto the old head.
    UPDATE audit_chain_head SET seq = NEW.seq, hash = NEW.hash, updated_at = now();
    RETURN NEW;
END
$$;
