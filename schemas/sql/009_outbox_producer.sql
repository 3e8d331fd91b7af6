-- Each service's relay publishes only the events its own service wrote (its NATS user may
-- publish those subjects only). Rows written before this column existed have no
-- producer and are published by whichever relay comes first, as before.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS producer text;

DROP INDEX IF EXISTS outbox_unpublished;
CREATE INDEX IF NOT EXISTS outbox_unpublished_by_producer ON outbox (producer, seq) WHERE published_at IS NULL;
