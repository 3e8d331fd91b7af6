-- 003_gateway: what the HTTP gateway needs beyond 001_core.
--
-- A replayed POST must repeat its headers as well as its status and body (the
-- `Location` of a created run), so the stored response keeps them.
ALTER TABLE idempotency_keys ADD COLUMN IF NOT EXISTS response_headers jsonb NOT NULL DEFAULT '{}';

-- Open event streams wake on a new run event instead of waiting for their next poll.
CREATE OR REPLACE FUNCTION run_events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('run_events', NEW.run_id);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER run_events_notify
    AFTER INSERT ON run_events
    FOR EACH ROW EXECUTE FUNCTION run_events_notify();
