-- 011_reaper: the gateway's reaper (services/gateway/reaper.py) looks at the runs not yet
-- completed or failed every half minute; they are few among a year of runs.
CREATE INDEX runs_unanswered ON runs (id) WHERE status NOT IN ('completed', 'failed');
