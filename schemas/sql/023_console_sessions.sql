-- 023_console_sessions: the console's sessions live on the server (issue 41, finding 9).
--
-- The session cookie used to hold the API token itself, so signing out revoked nothing and
-- a stolen cookie was the token. Now the cookie holds a random session id; only its sha256
-- is kept here, with the token the session was opened with and its clock:
--  * signing out deletes the row, so the cookie stops working at once;
--  * a session answers only while its token is live (revoked_at IS NULL), and goes with it
--    when the token row is deleted (ON DELETE CASCADE);
--  * it ends after `idle` seconds without a request (last_seen_at) and at expires_at
--    (absolute), whatever its use.
--
-- Who sees what (as 018_rls.sql): the row is tenant-scoped, so tenant_isolation binds
-- specops_app (sign-in writes it in the token's tenant transaction). A cookie is looked up
-- before the tenant is known, so that lookup, its last_seen_at touch and sign-out's delete
-- run, for one transaction, as
--   specops_session_keeper  SELECT, UPDATE last_seen_at and DELETE console_sessions by
--                           their hash, and SELECT live api_tokens (the session's token
--                           must be live), every tenant's rows.

CREATE TABLE console_sessions (
    id_sha256     text PRIMARY KEY CHECK (id_sha256 ~ '^[0-9a-f]{64}$'),
    token_id      spec_id NOT NULL REFERENCES api_tokens (id) ON DELETE CASCADE,
    tenant_id     spec_id NOT NULL REFERENCES tenants (id),
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);
CREATE INDEX console_sessions_token ON console_sessions (token_id);
CREATE INDEX console_sessions_expiry ON console_sessions (tenant_id, expires_at);

ALTER TABLE console_sessions ENABLE ROW LEVEL SECURITY;
ALTER TABLE console_sessions FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON console_sessions TO specops_app
    USING (tenant_id = current_tenant()) WITH CHECK (tenant_id = current_tenant());

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'specops_session_keeper') THEN
        CREATE ROLE specops_session_keeper NOLOGIN NOBYPASSRLS;
    END IF;
END
$$;
GRANT specops_session_keeper TO CURRENT_USER;
GRANT USAGE ON SCHEMA public TO specops_session_keeper;
GRANT SELECT, DELETE ON console_sessions TO specops_session_keeper;
GRANT UPDATE (last_seen_at) ON console_sessions TO specops_session_keeper;
GRANT SELECT ON api_tokens TO specops_session_keeper;

CREATE POLICY session_keeper ON console_sessions TO specops_session_keeper USING (true) WITH CHECK (true);
CREATE POLICY session_token ON api_tokens FOR SELECT TO specops_session_keeper USING (revoked_at IS NULL);
