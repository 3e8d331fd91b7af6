"""Issue 16's acceptance: a run in flight survives a Postgres outage longer than the retry
budget a failing message used to get, on a whole `specops up` stack.

Before, each failed attempt counted toward the 5 deliveries of `RetryPolicy()`: one
attempt of a handler waits out the pool's 30 s timeout, then 1, 5, 30 and 120 s of
backoff, so an outage beyond about five minutes parked every message in flight and the
predictor failed those runs as `dead_letter`. Now an outage is retried within the
delivery for as long as it lasts.
"""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
import torch
from fixtures.runtime import TINY, started

from specops.client import SpeculativeClient
from specops.runtime import postgres_server
from specops.runtime.state import StateDir
from specops_schemas.catalog import Role
from specops_services.gateway.tokens import issue_token

pytestmark = [
    pytest.mark.slow,
    # On a CUDA host the `cpu` profile is predicted, not measured: the run would not wait on the runner.
    pytest.mark.skipif(torch.cuda.is_available(), reason="measures the cpu profile; this host has CUDA"),
]

TARGET = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"}
POOL_TIMEOUT_S = 30.0  # psycopg_pool's default, which specplatform.db.create_pool keeps
OLD_BUDGET_S = 5 * POOL_TIMEOUT_S + 1 + 5 + 30 + 120
OUTAGE_S = OLD_BUDGET_S + 30
WAIT_S = 600.0
BUS_SERVICES = ("predictor", "benchmark-runner", "quality-gate", "audit")


async def _dead_letters(nats_url: str, seed: str) -> int:
    nc = await nats.connect(nats_url, nkeys_seed=seed)
    try:
        info = await nc.jetstream().stream_info("SPEC", subjects_filter="spec.dlq.>")
        return sum((info.state.subjects or {}).values())
    finally:
        await nc.close()


def test_a_run_survives_a_postgres_outage_longer_than_the_old_retry_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with started(monkeypatch, env=TINY) as runtime:
        token = asyncio.run(issue_token(runtime.database_url, tenant_id="outage", role=Role.DEVELOPER))
        state_dir = StateDir(runtime.settings.state_dir)
        deadline = time.monotonic() + WAIT_S
        # Every service up first: one still starting would exit on finding no database.
        while not all("app started successfully" in runtime.log(service) for service in BUS_SERVICES):
            assert time.monotonic() < deadline, "the services did not start"
            time.sleep(0.5)
        with SpeculativeClient(runtime.url, token.secret) as client:
            run = client.runs.create(target=TARGET, workload="chat", mode="interactive")
            # Mid-run: predicted, so the benchmark runner and the projector have work in flight.
            while (status := client.runs.get(run.id).status) in ("queued", "running"):
                assert time.monotonic() < deadline, "the run was not predicted"
                time.sleep(0.2)
            assert status == "predicted"
            state = state_dir.load()
            postgres_server.stop(state.servers["postgres"])
            try:
                time.sleep(OUTAGE_S)
            finally:
                # Recorded, so that `specops down` stops this server too.
                state.servers["postgres"] = postgres_server.start(state_dir.pgdata)
                state_dir.save(state)
            final = client.runs.wait(run.id, timeout=WAIT_S)
        parked = asyncio.run(_dead_letters(runtime.nats_url, runtime.admin_seed))

    assert final.status == "completed", final.error
    assert parked == 0
