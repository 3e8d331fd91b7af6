"""When the watcher restarts a dead process (specops.runtime.backoff)."""

from __future__ import annotations

from specops.runtime.backoff import Backoff, RestartPolicy

POLICY = RestartPolicy(base_s=1.0, cap_s=8.0, stable_s=60.0)


def test_a_process_that_ran_long_is_restarted_at_once() -> None:
    backoff = Backoff(POLICY)
    assert backoff.due("predictor[0]", uptime_s=3600.0, now=100.0)


def test_a_crash_loop_backs_off_doubling_up_to_the_cap() -> None:
    backoff = Backoff(POLICY)
    now = 0.0
    waits = []
    for _ in range(6):
        start = now
        while not backoff.due("audit[0]", uptime_s=0.5, now=now):
            now += 0.25
        waits.append(now - start)
        backoff.started("audit[0]")
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    # Once it has run long enough, the next death is restarted at once again.
    assert backoff.due("audit[0]", uptime_s=120.0, now=now)


def test_a_failed_start_counts_as_a_quick_death_of_that_component_only() -> None:
    backoff = Backoff(POLICY)
    assert backoff.due("nats", uptime_s=600.0, now=0.0)
    assert backoff.failed("nats", now=0.0) == 1.0
    assert not backoff.due("nats", uptime_s=600.0, now=0.5)
    assert backoff.due("nats", uptime_s=600.0, now=1.0)
    assert backoff.failed("nats", now=1.0) == 2.0
    assert backoff.due("postgres", uptime_s=600.0, now=1.0)
