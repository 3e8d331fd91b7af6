-- 006_dead_letters: the predictor fails a run whose event a service gave up on and
-- parked on the dead-letter queue (spec.dlq.<service>), since nothing would carry the
-- run on from there. failed_at marks a bench whose run it failed that way: the run is
-- answered, so a bench.completed or a verdict that still arrives answers nothing more.
-- (finalized_at stays the mark of the measured answer, which needs a completed bench.)
ALTER TABLE benches ADD COLUMN failed_at timestamptz;
