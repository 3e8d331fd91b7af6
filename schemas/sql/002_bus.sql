-- The bus's effectively-once tables (DESIGN.md §5): consumer inbox and transactional outbox.
-- Neither is tenant-scoped (no RLS): the relay reads every tenant's rows and event ids are
-- globally unique. specops_app may write them through 001_core's default privileges.

-- event_ids a consumer has processed, inserted in the same transaction as its side
-- effects: a redelivered or re-published event finds its row and is skipped.
CREATE TABLE IF NOT EXISTS inbox (
    consumer     text        NOT NULL,
    event_id     uuid        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- Events written in the same transaction as the state change that caused them; the
-- relay publishes each with Nats-Msg-Id = id and then sets published_at.
CREATE TABLE IF NOT EXISTS outbox (
    id           uuid        PRIMARY KEY,
    -- Publish order: rows of one transaction share created_at, so order by this instead.
    seq          bigint      GENERATED ALWAYS AS IDENTITY,
    subject      text        NOT NULL,
    body         bytea       NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);

-- The relay only ever scans unpublished rows, in the order they were written.
CREATE INDEX IF NOT EXISTS outbox_unpublished ON outbox (seq) WHERE published_at IS NULL;

-- Wake relays as soon as the writing transaction commits (NOTIFY is delivered on commit);
-- the relays still poll, so a missed notification only delays a publish.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox', '');
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER outbox_notify
    AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

