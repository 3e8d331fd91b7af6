"""Intake dedup is per tenant: a tenant that publishes with another tenant's Nats-Msg-Id
(and event_id) gets its own run, and the other's request is untouched; a tenant's own
re-publish is still one run, answered `accepted` again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import Any

import nats
from fixtures.gateway import run_body, running_gateway
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

from specbus.broker import INTAKE_DUPLICATE_WINDOW_S, upstream_stream_configs
from specbus.subjects import INTAKE_STREAM, intake_answer_subject, intake_subject
from specops.runtime.stream import StreamLimits, apply_stream_config

ANSWER_TIMEOUT_S = 30.0


async def _as_an_older_deployment_left_it(nats_url: str) -> None:
    """SPEC_INTAKE as it was before: the stream-wide 2-minute Nats-Msg-Id dedup."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(INTAKE_STREAM)
        old = StreamConfig.from_response(upstream_stream_configs()[0].as_dict())
        old.duplicate_window = 120.0
        await js.add_stream(old)
    finally:
        await nc.close()
    # What `specops up` / `specops deploy init` do on start.
    await apply_stream_config(nats_url, limits=StreamLimits())


async def test_another_tenants_msg_id_does_not_suppress_a_request(db: str, own_nats_url: str) -> None:
    # A server of its own: the start-up configuration makes SPEC deny purges.
    nats_url = own_nats_url
    await _as_an_older_deployment_left_it(nats_url)
    async with running_gateway(db, nats_url):
        nc = await nats.connect(nats_url)
        try:
            info = await nc.jetstream().stream_info(INTAKE_STREAM)
            assert info.config.duplicate_window == INTAKE_DUPLICATE_WINDOW_S
            accepted = {
                tenant: await nc.subscribe(intake_answer_subject(tenant, "accepted"))
                for tenant in ("acme", "globex")
            }
            rejected = await nc.subscribe("specops.results.*.intake.rejected")
            msg_id, event_id = f"shared-{uuid.uuid4()}", str(uuid.uuid4())
            body = json.dumps({"event_id": event_id, "request": run_body()}).encode()

            async def publish(tenant: str) -> dict[str, Any]:
                ack = await nc.jetstream().publish(
                    intake_subject(tenant), body, headers={"Nats-Msg-Id": msg_id}
                )
                assert not ack.duplicate
                answer = await accepted[tenant].next_msg(timeout=ANSWER_TIMEOUT_S)
                return dict(json.loads(answer.data))

            first = await publish("acme")
            await asyncio.sleep(2 * INTAKE_DUPLICATE_WINDOW_S)
            # globex reuses acme's msg id and event_id: processed, as globex's own run.
            other = await publish("globex")
            await asyncio.sleep(2 * INTAKE_DUPLICATE_WINDOW_S)
            again = await publish("acme")  # acme's retry: the same run, accepted again
        finally:
            await nc.close()
    assert first["tenant_id"] == "acme" and other["tenant_id"] == "globex"
    assert other["event_id"] == first["event_id"] == event_id
    assert other["run_id"] != first["run_id"]
    assert again["run_id"] == first["run_id"]
    assert rejected.pending_msgs == 0
