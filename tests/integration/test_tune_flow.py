"""Issue 17's acceptance test: T2 as a user drives it, through the gateway, on a whole `specops up`.

One runtime (embedded NATS and PostgreSQL, every service its own process, TINY benches), one
tenant's token and the SDK: a T1 run on `code` completes measured; a tune session on it
(`client.tune_sessions`) streams to `tune.completed` with its trials, curve and PNG; the same
T1 request is then a winner-cache hit on the tuned winner, which `apply` turns into flags; bad
requests and another tenant are refused with problem+json; and a second session whose tuner is
killed (SIGKILL) while a trial's bench is in flight is finished by the restarted tuner with no
trial lost or measured twice, the restart counted as downtime.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import httpx
import nats
import pytest
import torch
from fixtures.runtime import TINY, Runtime, started
from pydantic import ValidationError

from specbus.subjects import STREAM
from specops.client import Run, SpecopsAPIError, SpeculativeClient, TuneSession
from specops.runtime.supervisor import status
from specops_schemas.api import API_PREFIX
from specops_schemas.catalog import Role
from specops_schemas.events import parse_event
from specops_schemas.tune import TuneStarted
from specops_services.gateway.http.tokens import issue_token

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="measures the cpu profile; this host has CUDA"),
]

TARGET = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"}
WORKLOAD = "code"
# Trials of 2 reps (a mean and a sigma) x 1 prompt x 8 tokens. The budget clock counts a
# heartbeat gap as downtime only past 3 ticks; a watcher's restart takes about a second, so
# the ticks are short enough for the kill's gap to count.
TUNE_ENV = {
    **TINY,
    "SPECOPS_TUNER_REPS": "2",
    "SPECOPS_TUNER_PROMPTS": "1",
    "SPECOPS_TUNER_NEW_TOKENS": "8",
    "SPECOPS_TUNER_TICK_S": "0.2",
}
# Three trials of ngram and the T1 winner's family: the seeded T1 point(s), then TPE's; both
# usually beat the baseline on code, so a winner is all but certain. The budget is far beyond
# what they take.
TRIALS = 3
BUDGET_MINUTES = 15.0
WAIT_S = 600.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_t2_through_the_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    start = time.monotonic()
    with started(monkeypatch, env=TUNE_ENV) as runtime:
        up_s = time.monotonic() - start
        acme = asyncio.run(issue_token(runtime.database_url, tenant_id="t2-acme", role=Role.DEVELOPER))
        globex = asyncio.run(issue_token(runtime.database_url, tenant_id="t2-globex", role=Role.DEVELOPER))
        with SpeculativeClient(runtime.url, acme.secret) as client:
            t1 = _t1_run(client)
            tuned = _tune(client, t1)
            _cached_and_applied(client, t1, tuned)
            _refused(runtime, client, acme.secret, globex.secret, t1, tuned)
            killed = _tuner_killed_mid_trial(runtime, client, t1)
    print(
        f"T2: stack up in {up_s:.0f} s; session of {len(tuned.trials)} trials "
        f"(winner {tuned.winner.candidate.candidate_id if tuned.winner else None}); "
        f"downtime {tuned.downtime_s:.1f} s, of the killed session {killed.downtime_s:.1f} s; "
        f"{time.monotonic() - start:.0f} s in all"
    )


def _t1_run(client: SpeculativeClient) -> Run:
    run = client.runs.create(target=TARGET, workload=WORKLOAD)
    assert run.status == "queued" and run.cache_hit is False
    done = client.runs.wait(run.id, timeout=WAIT_S)
    assert done.status == "completed" and done.measured is True and done.cache_hit is False, done
    return done


def _wait_session(client: SpeculativeClient, session_id: str) -> TuneSession:
    deadline = time.monotonic() + WAIT_S
    while (session := client.tune_sessions.get(session_id)).status not in ("completed", "failed"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"tune session {session_id} is still {session.status} after {WAIT_S:g} s")
        time.sleep(1.0)
    return session


def _families(t1: Run) -> list[str]:
    """ngram, and the T1 winner's family: a session that leaves the latter out keeps T1's answer
    cached (it never measured T1's winner next to its own), and this one must replace it."""
    return sorted({"ngram", *([t1.winner.candidate.family] if t1.winner is not None else [])})


def _tune(client: SpeculativeClient, t1: Run) -> TuneSession:
    """A session on the T1 run: its stream, trials, curve and PNG."""
    session = client.tune_sessions.create(
        t1.id, budget_minutes=BUDGET_MINUTES, max_trials=TRIALS, families=_families(t1)
    )
    assert session.status == "queued" and session.budget_s == BUDGET_MINUTES * 60
    done = _wait_session(client, session.id)
    events = list(client.tune_sessions.stream(session.id))
    types = [e.type for e in events]
    assert types[0] == "tune.requested" and types[1] == "tune.started" and types[-1] == "tune.completed", (
        types
    )
    assert types.count("tune.trial_completed") == TRIALS

    assert done.status == "completed" and done.error is None, done.error
    assert done.termination_reason == "max_trials reached" and not done.auto_terminated
    assert [t.trial for t in done.trials] == list(range(TRIALS))
    complete = [t for t in done.trials if t.state == "complete"]
    assert complete, [(t.trial, t.error_stage, t.error_message) for t in done.trials]
    for t in complete:
        assert t.value is not None and t.speedup is not None and t.speedup_stdev is not None
        assert t.measurement is not None and t.measurement.reps == 2
        assert t.candidate.family in _families(t1)
    # The T1 run's pareto points (and winner) of those families are re-measured first, marked seeded.
    started_event = events[1].payload
    assert isinstance(started_event, TuneStarted) and started_event.seeded >= 1
    seeded = min(started_event.seeded, TRIALS)
    assert [t.seeded for t in done.trials] == [True] * seeded + [False] * (TRIALS - seeded)

    assert [p.trial for p in done.curve] == [t.trial for t in done.trials]
    assert done.curve_png is not None
    png = client.request("GET", done.curve_png)
    assert png.headers["content-type"] == "image/png" and png.content.startswith(PNG_MAGIC)
    assert client.tune_sessions.curve_png(session.id).startswith(PNG_MAGIC)
    return done


def _cached_and_applied(client: SpeculativeClient, t1: Run, tuned: TuneSession) -> None:
    """The T1 request again: answered from the cache, with the tuned winner when there is one."""
    again = client.runs.create(target=TARGET, workload=WORKLOAD)
    assert again.id != t1.id and again.status == "completed" and again.cache_hit is True
    cached = again.winner.candidate if again.winner is not None else None
    if tuned.winner is None:
        # Allowed only when no complete trial beat the baseline; then T1's answer stays.
        assert all(t.speedup is None or t.speedup <= 1.0 for t in tuned.trials), tuned.trials
        assert cached == (t1.winner.candidate if t1.winner is not None else None)
        with pytest.raises(SpecopsAPIError) as refused:
            client.tune_sessions.apply(tuned.id)
        assert refused.value.status == 409
        return
    assert tuned.best is not None and tuned.winner.candidate == tuned.best.candidate
    assert cached == tuned.winner.candidate
    applied = client.tune_sessions.apply(tuned.id)
    assert applied.candidate_id == tuned.winner.candidate.candidate_id
    assert applied.family == tuned.winner.candidate.family
    assert applied.cli_args


def _refused(
    runtime: Runtime, client: SpeculativeClient, ours: str, theirs: str, t1: Run, tuned: TuneSession
) -> None:
    """Bad bodies (422), an unknown run (404) and another tenant's run and session (404), as problem+json."""
    with pytest.raises(ValidationError):
        client.tune_sessions.create(t1.id, budget_minutes=0)
    url = f"{runtime.url}{API_PREFIX}/tune-sessions"
    for budget in (0, 10_000):
        answer = httpx.post(
            url,
            json={"run_id": t1.id, "budget_minutes": budget},
            headers={"Authorization": f"Bearer {ours}"},
        )
        assert answer.status_code == 422, answer.text
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert answer.json()["errors"][0]["pointer"] == "#/budget_minutes"
    with pytest.raises(SpecopsAPIError) as unknown:
        client.tune_sessions.create("00000000-0000-4000-8000-000000000000", budget_minutes=1)
    assert unknown.value.status == 404
    with SpeculativeClient(runtime.url, theirs) as other:
        with pytest.raises(SpecopsAPIError) as their_run:
            other.tune_sessions.create(t1.id, budget_minutes=1)
        with pytest.raises(SpecopsAPIError) as their_session:
            other.tune_sessions.get(tuned.id)
        with pytest.raises(SpecopsAPIError) as their_apply:
            other.tune_sessions.apply(tuned.id)
    assert their_run.value.status == their_session.value.status == their_apply.value.status == 404


def _tuner_pid(runtime: Runtime) -> int | None:
    return next((p.pid for p in status(runtime.settings).processes if p.service == "tuner" and p.alive), None)


def _tuner_killed_mid_trial(runtime: Runtime, client: SpeculativeClient, t1: Run) -> TuneSession:
    """A second session, its tuner SIGKILLed while trial 1's bench is measured: restarted by
    the watcher, it finishes the session with every trial's bench requested and measured once."""
    before = asyncio.run(_subject_counts(runtime, "spec.bench.*.requested"))
    session = client.tune_sessions.create(
        t1.id, budget_minutes=BUDGET_MINUTES, max_trials=TRIALS, families=["ngram"]
    )
    killed = asyncio.run(_kill_tuner_once_requested(runtime, sum(before.values()) + 2))
    done = _wait_session(client, session.id)
    restarted = _tuner_pid(runtime)
    assert restarted not in (None, killed)

    assert done.status == "completed" and done.error is None, done.error
    assert [t.trial for t in done.trials] == list(range(TRIALS))
    assert all(t.state == "complete" for t in done.trials), done.trials
    requested = asyncio.run(_session_benches(runtime, session.id))
    assert sorted(requested) == sorted(t.bench_id for t in done.trials)
    counts = asyncio.run(_subject_counts(runtime, "spec.bench.*.>"))
    for bench_id in requested:
        assert counts.get(f"spec.bench.{bench_id}.requested") == 1, bench_id
        assert counts.get(f"spec.bench.{bench_id}.completed") == 1, bench_id
    assert done.downtime_s > 0.0  # the restart's gap counted against the budget
    return done


async def _kill_tuner_once_requested(runtime: Runtime, benches: int) -> int:
    """SIGKILL the tuner as soon as `benches` benches were requested in all (trial 1's is in flight)."""
    nc = await nats.connect(runtime.nats_url, nkeys_seed=runtime.admin_seed)
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + WAIT_S
        while True:
            info = await js.stream_info(STREAM, subjects_filter="spec.bench.*.requested")
            if sum((info.state.subjects or {}).values()) >= benches:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("trial 1 was never requested")
            await asyncio.sleep(0.2)
    finally:
        await nc.close()
    pid = _tuner_pid(runtime)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    return pid


async def _subject_counts(runtime: Runtime, subjects: str) -> dict[str, int]:
    nc = await nats.connect(runtime.nats_url, nkeys_seed=runtime.admin_seed)
    try:
        info = await nc.jetstream().stream_info(STREAM, subjects_filter=subjects)
        return dict(info.state.subjects or {})
    finally:
        await nc.close()


async def _session_benches(runtime: Runtime, session_id: str) -> list[str]:
    """bench_id of every bench.requested on the SPEC stream for the session."""
    nc = await nats.connect(runtime.nats_url, nkeys_seed=runtime.admin_seed)
    try:
        sub = await nc.jetstream().pull_subscribe("spec.bench.*.requested", stream=STREAM)
        msgs = await sub.fetch(200, timeout=5)
        events: list[Any] = [parse_event(m.data) for m in msgs]
    finally:
        await nc.close()
    return [e.payload.bench_id for e in events if e.payload.plan.run_id == session_id]
