"""What each heads endpoint does: validation, transactions, events (the runs service's counterpart for T3).

The routes call these; SQL lives in this resource's db.py, decisions in its logic.py,
what an event writes in its projection.py. POSTs of heads/train and heads/{id}/transition
go through `idempotency.keyed` (Idempotency-Key, one tenant transaction); POST heads/data is
content-addressed like POST datastores, so a retried upload is safe without a key.
"""

from __future__ import annotations

import json
from pathlib import Path

from specbus.envelope import new_event
from specbus.wire import utc_now
from speccatalog import artifacts
from specops_schemas.heads import (
    HeadDataResponse,
    HeadList,
    HeadRequested,
    HeadResponse,
    HeadTrainRequest,
    HeadTransitionRequest,
)
from specops_services.gateway import db, idempotency, results, security
from specops_services.gateway.heads import db as heads_db
from specops_services.gateway.heads import logic as heads_logic
from specops_services.gateway.heads import projection as heads_projection
from specops_services.gateway.http import model_refs, params, sse
from specops_services.gateway.http.auth import Principal
from specops_services.gateway.http.problems import ProblemError, not_found, problem
from specops_services.gateway.idempotency import keyed
from specops_services.gateway.results import PRODUCER
from specplatform.db import Connection, Pool, tenant_transaction

INVALID_DATA = "urn:specops:problem:invalid-head-data"
ILLEGAL_TRANSITION = "urn:specops:problem:illegal-head-transition"
_REFUSAL_TYPES = {409: ILLEGAL_TRANSITION, 422: "urn:specops:problem:rationale-required"}


# --- POST heads/data -------------------------------------------------------------------------


class HeadDataError(ValueError):
    """The upload is not a JSONL of `{"prompt", "completion"}` lines; the message says where."""


def count_examples(path: Path) -> int:
    """`{"prompt", "completion"}` lines of a JSONL file; HeadDataError if it is not one or holds none."""
    examples = 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise HeadDataError(f"line {lineno}: not UTF-8 text") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise HeadDataError(f"line {lineno}: not valid JSON ({exc.msg})") from None
            if not (
                isinstance(record, dict)
                and isinstance(record.get("prompt"), str)
                and isinstance(record.get("completion"), str)
                and record["completion"].strip()
            ):
                raise HeadDataError(
                    f'line {lineno}: need an object with string "prompt" and non-empty "completion"'
                )
            examples += 1
    if examples == 0:
        raise HeadDataError("the upload holds no examples")
    return examples


def invalid_data(detail: str) -> ProblemError:
    return problem(422, detail, type=INVALID_DATA)


async def record_data(
    pool: Pool, principal: Principal, *, sha256: str, size_bytes: int, examples: int
) -> tuple[HeadDataResponse, bool]:
    """The upload's row (and whether it is new)."""
    tenant = principal.tenant_id
    async with pool.connection() as conn, tenant_transaction(conn, tenant):
        created = await heads_db.insert_data(
            conn,
            tenant_id=tenant,
            sha256=sha256,
            size_bytes=size_bytes,
            examples=examples,
            path=artifacts.head_data_path(tenant, sha256),
        )
        row = await heads_db.find_data(conn, tenant, sha256)
    if row is None:
        raise RuntimeError(f"head data {sha256} was not recorded")
    return row, created


# --- POST heads/train ------------------------------------------------------------------------


async def train(
    pool: Pool,
    principal: Principal,
    request: HeadTrainRequest,
    key: str | None,
    request_hash: str,
    *,
    models_dir: Path | None = None,
) -> idempotency.Reply:
    """A new head of the caller's tenant, `training`; head.requested queued for the head-trainer.
    Refused (403) when its policy opts out of speculation (a head exists only to speculate
    with), and (429) while the tenant's GPU budget is spent; an idempotent replay is answered
    before either."""
    if model_refs.looks_local(request.target) and model_refs.inside(request.target, models_dir) is None:
        raise model_refs.refused("#/target")
    refusal = heads_logic.train_refusal(request, eagle3=heads_logic.eagle3_enabled())
    if refusal is not None:
        raise problem(422, refusal, type="urn:specops:problem:invalid-head-request")
    nul = params.nul_pointer(request.model_dump(mode="json"))
    if nul is not None:
        raise problem(422, f"text must not contain the NUL character (U+0000): {nul}")

    async def work(conn: Connection) -> idempotency.Reply:
        await security.require_speculation(conn, principal, "head.train", status=403)
        await security.require_budget(conn, principal, "head.train")
        tenant = principal.tenant_id
        for field, sha in (("train_data", request.train_data), ("heldout_data", request.heldout_data)):
            if sha is not None and await heads_db.find_data(conn, tenant, sha) is None:
                raise problem(
                    422, f"{field}: no upload {sha} in this tenant (POST heads/data first)", type=INVALID_DATA
                )
        head_id = artifacts.new_head_id()
        requested = new_event(
            HeadRequested(
                head_id=head_id,
                request=request,
                train_path=artifacts.head_data_path(tenant, request.train_data),
                heldout_path=(
                    artifacts.head_data_path(tenant, request.heldout_data) if request.heldout_data else None
                ),
                requested_by=principal.token_id,
            ),
            tenant_id=tenant,
            correlation_id=head_id,
            producer=PRODUCER,
        )
        # Written from the event itself, as a rebuild from the stream writes it.
        await heads_projection.open_head(conn, requested)
        row = await heads_projection.publish(conn, requested)
        if row is None:
            raise RuntimeError(f"head {head_id} was not created")
        await results.repeat(conn, requested)
        return idempotency.Reply(
            202, row.head.model_dump(mode="json"), {"Location": heads_logic.head_location(head_id)}
        )

    return await keyed(pool, principal, key, request_hash, work)


# --- GET heads[/{id}] -------------------------------------------------------------------------


async def list_heads(pool: Pool, principal: Principal) -> HeadList:
    async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
        rows = await heads_db.list_heads(conn, principal.tenant_id)
    return HeadList(heads=[r.head for r in rows])


async def read_head(pool: Pool, principal: Principal, head_id: str) -> HeadResponse:
    if not artifacts.is_head_id(head_id):
        raise not_found("head", head_id)
    async with pool.connection() as conn, tenant_transaction(conn, principal.tenant_id):
        row = await heads_db.get_head(conn, principal.tenant_id, head_id)
    if row is None:
        raise not_found("head", head_id)
    return row.head


# --- POST heads/{id}/transition ------------------------------------------------------------------


async def transition(
    pool: Pool,
    principal: Principal,
    head_id: str,
    body: HeadTransitionRequest,
    key: str | None,
    request_hash: str,
) -> idempotency.Reply:
    """Move the head as a person asks; head.transitioned published (an approval row for production)."""

    async def work(conn: Connection) -> idempotency.Reply:
        row = None
        if artifacts.is_head_id(head_id):
            row = await heads_db.get_head(conn, principal.tenant_id, head_id, for_update=True)
        if row is None:
            raise not_found("head", head_id)
        refusal = heads_logic.transition_refusal(row.head.state, body.to, principal.role, body.rationale)
        if refusal is not None:
            kind = _REFUSAL_TYPES.get(refusal.status)
            raise problem(refusal.status, refusal.detail, **({"type": kind} if kind else {}))
        moved = new_event(
            heads_logic.person_transition(
                row.head,
                body.to,
                actor=principal.token_id,
                role=principal.role,
                rationale=body.rationale,
                at=utc_now(),
            ),
            tenant_id=principal.tenant_id,
            correlation_id=head_id,
            producer=PRODUCER,
        )
        after = await heads_projection.publish(conn, moved)
        if after is None:
            raise RuntimeError(f"head {head_id} did not move")
        await results.repeat(conn, moved)
        return idempotency.Reply(
            200, after.head.model_dump(mode="json"), {"Location": heads_logic.head_location(head_id)}
        )

    return await keyed(pool, principal, key, request_hash, work)


# --- GET heads/{id}/events ------------------------------------------------------------------------


async def require_head(pool: Pool, principal: Principal, head_id: str) -> None:
    await read_head(pool, principal, head_id)


def event_feed(head_id: str) -> sse.Feed:
    """The head's events, as `sse.follow` reads them, until it reaches a final state."""

    async def read(conn: Connection, after: int) -> tuple[bool, list[db.EventRow]]:
        state = await heads_db.head_state(conn, head_id)
        rows = await heads_db.EVENTS.after(conn, head_id, after)
        return state is None or state in heads_logic.FINAL_STATES, rows

    return sse.Feed(head_id, heads_logic.head_location(head_id), read, frozenset())
