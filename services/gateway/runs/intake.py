"""The intake: run requests that upstream systems publish on NATS, made into gateway runs.

An upstream system publishes an `IntakeRequest` on `specops.intake.<tenant>.run.requested`
(stream SPEC_INTAKE) with its tenant's NATS user, which may publish on that subject only.
The tenant is the one the subject names, never one the body claims. From here on the
request is exactly a `POST runs` from a developer of that tenant (`runs.create_run`):
same checks, same quota, same winner cache, same events and audit trail, readable with
any of the tenant's API tokens. Its `event_id` is the idempotency key (kept
`INTAKE_KEY_TTL`), so a request published again, 50 times or after a crash, is one run;
each message is answered on `specops.results.<tenant>.intake.accepted` with its run.
That key is the tenant's own (idempotency keys are per tenant), and the stream's
stream-wide Nats-Msg-Id dedup is as short as the server allows (specbus.broker), so no
tenant can have another's request dropped by reusing its msg id or its event_id.

A request it cannot accept (not an IntakeRequest, an unknown model or GPU, a tenant
without a record, over the quota, an event_id reused with another request) is refused
on `specops.results.<tenant>.intake.rejected` with the problem, as the HTTP API would
state it, and the message is parked on the gateway's dead-letter subject at once.
Anything else that fails (the database is down) is retried like any handler's error.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from faststream.nats import NatsBroker
from pydantic import ValidationError

from specbus import RawMessage, RetryPolicy, Unprocessable, raw_subscriber
from specbus.subjects import INTAKE_STREAM, intake_pattern, intake_tenant
from specbus.wire import utc_now
from specops_schemas.api import Problem
from specops_schemas.catalog import Role
from specops_schemas.intake import IntakeAccepted, IntakeRejected, IntakeRequest
from specops_services.gateway import idempotency, projecting, results
from specops_services.gateway.http import db as http_db
from specops_services.gateway.http.auth import Principal
from specops_services.gateway.http.problems import ProblemError
from specops_services.gateway.runs import service as runs
from specplatform.db import Pool

log = logging.getLogger(__name__)

SERVICE = projecting.SERVICE
CONSUMER = "intake"
# Longer than the intake stream keeps a message (a week), so a redelivery or a re-publish
# of anything the stream still holds finds its run.
INTAKE_KEY_TTL = timedelta(days=30)


def principal_of(tenant_id: str) -> Principal:
    """Who an intake request acts as: a developer of the subject's tenant."""
    return Principal(token_id=f"nats:{tenant_id}", tenant_id=tenant_id, role=Role.DEVELOPER)


async def receive(
    pool: Pool, message: RawMessage, *, max_active_runs: int, live_fingerprint: bool = False
) -> str:
    """Make the run of one intake message; its run id. Raises Unprocessable once refused."""
    try:
        tenant = intake_tenant(message.subject)
    except ValueError as exc:
        raise Unprocessable(str(exc)) from None
    try:
        body = IntakeRequest.model_validate_json(message.data)
    except ValidationError as exc:
        await _refuse(pool, tenant, message, Problem.validation(exc.errors()), event_id=None)
        raise Unprocessable(f"not an IntakeRequest: {exc.error_count()} errors") from None
    async with pool.connection() as conn:
        known = await http_db.tenant_exists(conn, tenant)
    if not known:
        unknown = Problem(title="Unknown tenant", status=403, detail=f"tenant {tenant!r} has no record here")
        await _refuse(pool, tenant, message, unknown, event_id=body.event_id)
        raise Unprocessable(f"unknown tenant {tenant!r}")
    digest = idempotency.hash_request("INTAKE", tenant, body.request.model_dump_json().encode())
    try:
        reply = await runs.create_run(
            pool,
            principal_of(tenant),
            body.request,
            f"intake:{body.event_id}",
            digest,
            max_active_runs=max_active_runs,
            key_ttl=INTAKE_KEY_TTL,
            live_fingerprint=live_fingerprint,
        )
    except ProblemError as exc:
        if exc.problem.type == idempotency.KEY_IN_FLIGHT:
            # Another replica holds this event_id right now: not a refusal; retried with
            # backoff, the other replica's run is the answer.
            raise
        await _refuse(pool, tenant, message, exc.problem, event_id=body.event_id)
        raise Unprocessable(exc.problem.detail or exc.problem.title) from None
    run_id = str(reply.body["id"])
    # As it is now: a replayed reply is the run as it was when first accepted.
    run = await runs.read_run(pool, principal_of(tenant), run_id)
    accepted = IntakeAccepted(
        tenant_id=tenant,
        event_id=body.event_id,
        run_id=run_id,
        run=run,
        stream_sequence=message.stream_sequence,
        accepted_at=utc_now(),
    )
    async with pool.connection() as conn, conn.transaction():
        await results.answer(conn, accepted)
    replayed = reply.headers.get("Idempotent-Replayed") == "true"
    log.info(
        "intake %s of tenant %s: run %s%s", body.event_id, tenant, run_id, " (again)" if replayed else ""
    )
    return run_id


async def _refuse(
    pool: Pool, tenant: str, message: RawMessage, problem: Problem, *, event_id: str | None
) -> None:
    notice = IntakeRejected(
        tenant_id=tenant,
        event_id=event_id,
        stream_sequence=message.stream_sequence,
        problem=problem,
        rejected_at=utc_now(),
    )
    async with pool.connection() as conn, conn.transaction():
        await results.answer(conn, notice)
    log.info("intake message %d of tenant %s refused: %s", message.stream_sequence, tenant, problem.detail)


def register(
    broker: NatsBroker,
    pool: Pool,
    *,
    max_active_runs: int,
    live_fingerprint: bool = False,
    retry: RetryPolicy | None = None,
) -> None:
    """Subscribe the intake on `broker` (before the broker starts): durable `gateway-intake`."""

    @raw_subscriber(
        broker,
        service=SERVICE,
        name=CONSUMER,
        subjects=intake_pattern(),
        stream=INTAKE_STREAM,
        retry=retry or RetryPolicy(),
    )
    async def intake(message: RawMessage) -> None:
        await receive(pool, message, max_active_runs=max_active_runs, live_fingerprint=live_fingerprint)
