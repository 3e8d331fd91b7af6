-- 004_audit: the audit chain commits to every column of a row, not only its payload,
-- and keeps a chain head, so that (see services/audit/logic.py, which verifies it):
--  * altering subject, type, tenant_id, recorded_at or seq is detected, not only the
--    payload (001 hashed prev_hash || payload, so a row's subject or time could be
--    rewritten without a trace);
--  * deleting the newest rows is detected: the head still names the last seq and hash;
--  * dead letters (spec.dlq.<service>) and malformed messages, which are not envelopes
--    and may carry no tenant, are recorded with tenant_id NULL rather than a made-up one;
--  * stream_seq ties a row to its message in the SPEC stream, so `specops audit replay`
--    output and the table can be matched, and stream order recovered with replicas.
--
-- Row hash (sha256; each field is \x00 for NULL, else \x01 || 8-byte big-endian length
-- || UTF-8 bytes; recorded_at as UTC 'YYYY-MM-DDTHH:MM:SS.ffffff+00:00'):
--   sha256('specops-audit-row-v1' || f(prev_hash) || f(seq) || f(event_id) || f(subject)
--          || f(type) || f(tenant_id) || f(stream_seq) || f(recorded_at) || f(payload))
--
-- The chain head row is also the writers' lock (SELECT ... FOR UPDATE, held to commit),
-- which makes seq order commit order and chain order with any number of audit replicas.
-- An event already in the log is skipped inside that lock (the insert affects 0 rows),
-- so a redelivery is recorded once and leaves neither a seq gap nor a stale head.
--
-- Rows written under 001's formula would fail verification; none exist outside tests
-- when this migration ships.

ALTER TABLE audit_log ALTER COLUMN tenant_id DROP NOT NULL;
ALTER TABLE audit_log ADD COLUMN stream_seq bigint CHECK (stream_seq >= 1);

CREATE TABLE audit_chain_head (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    seq        bigint NOT NULL CHECK (seq >= 0),
    hash       bytea NOT NULL CHECK (octet_length(hash) = 32),
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO audit_chain_head (seq, hash)
SELECT coalesce(max(seq), 0),
       coalesce((SELECT hash FROM audit_log ORDER BY seq DESC LIMIT 1), '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea)
FROM audit_log;

CREATE FUNCTION audit_field(value bytea) RETURNS bytea
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT CASE WHEN value IS NULL THEN '\x00'::bytea
                      ELSE '\x01'::bytea || int8send(octet_length(value)::bigint) || value END $$;

CREATE FUNCTION audit_row_hash(
    p_prev_hash bytea, p_seq bigint, p_event_id uuid, p_subject text, p_type text,
    p_tenant_id text, p_stream_seq bigint, p_recorded_at timestamptz, p_payload bytea
) RETURNS bytea
    LANGUAGE sql STABLE
    AS $$
    SELECT sha256(
        convert_to('specops-audit-row-v1', 'UTF8')
        || audit_field(p_prev_hash)
        || audit_field(convert_to(p_seq::text, 'UTF8'))
        || audit_field(convert_to(p_event_id::text, 'UTF8'))
        || audit_field(convert_to(p_subject, 'UTF8'))
        || audit_field(convert_to(p_type, 'UTF8'))
        || audit_field(convert_to(p_tenant_id, 'UTF8'))
        || audit_field(convert_to(p_stream_seq::text, 'UTF8'))
        || audit_field(convert_to(
               to_char(p_recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US') || '+00:00', 'UTF8'))
        || audit_field(p_payload))
    $$;

-- SECURITY DEFINER: a writer needs INSERT on audit_log only; the head moves as the owner.
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
    IF EXISTS (SELECT 1 FROM audit_log WHERE event_id = NEW.event_id) THEN
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

CREATE FUNCTION audit_chain_head_forward_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.seq > OLD.seq THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'audit_chain_head only moves forward (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER audit_chain_head_forward_only BEFORE UPDATE OR DELETE ON audit_chain_head
    FOR EACH ROW EXECUTE FUNCTION audit_chain_head_forward_only();
CREATE TRIGGER audit_chain_head_no_truncate BEFORE TRUNCATE ON audit_chain_head
    FOR EACH STATEMENT EXECUTE FUNCTION audit_chain_head_forward_only();

REVOKE ALL ON audit_chain_head FROM specops_app;
GRANT SELECT ON audit_chain_head TO specops_app;
