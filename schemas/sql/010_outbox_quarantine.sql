-- A row that NATS keeps refusing (too large, a subject its stream or the relay's user may
-- not take) must not hold back every row behind it. The relay counts each refusal of a
-- row while connected (attempts, last_error) and after a few sets quarantined_at: the row
-- is kept, never published nor purged, until an operator fixes and releases it
-- (UPDATE outbox SET quarantined_at = NULL, attempts = 0 WHERE id = ...).
ALTER TABLE outbox
    ADD COLUMN IF NOT EXISTS attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS last_error text,
    ADD COLUMN IF NOT EXISTS quarantined_at timestamptz;

-- The relay scans only rows it may still publish.
DROP INDEX IF EXISTS outbox_unpublished_by_producer;
CREATE INDEX IF NOT EXISTS outbox_pending_by_producer ON outbox (producer, seq)
    WHERE published_at IS NULL AND quarantined_at IS NULL;
