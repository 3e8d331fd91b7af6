"""The engine's policy feed: `spec.security.<tenant>.policy_changed` events (the security
service's, issue 20) applied to the server's read model (security.py) as they come.

With `--nats-url` the server reads the SPEC stream from its last `policy_changed` per tenant
(an ordered, ephemeral JetStream consumer: a restarted server starts from every tenant's
current policy, then follows the changes). `start` returns once every tenant's current
policy has been applied, so the server takes no request under a default policy that a
tenant has changed (an opted-out tenant speculated, an isolated tenant drafting from the
shared pool); it fails if they do not arrive within ``CATCH_UP_S``. The connection never
stops reconnecting. An event that does not decode is logged and skipped: the read model
keeps the policy it has. Callbacks run on the server's event loop, where requests read the
read model, so no lock is needed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from nats.js.api import DeliverPolicy

from specbus.broker import inbox_prefix
from specbus.envelope import decode_event
from specbus.subjects import STREAM, pattern
from specops_schemas.security import PolicyChanged
from specops_services.engine.security import SecurityPolicies
from specplatform.settings import ENGINE_USER

log = logging.getLogger(__name__)

POLICY_SUBJECT = pattern("security", "policy_changed")
CATCH_UP_S = 60.0  # how long start waits for the tenants' current policies


class PolicyFeed:
    def __init__(
        self,
        policies: SecurityPolicies,
        nats_url: str,
        name: str,
        credentials: Mapping[str, str] | None = None,
    ) -> None:
        self.policies = policies
        self.nats_url = nats_url
        self.name = name
        self.credentials = dict(credentials or {})
        self._nc: Any = None
        self._seen = 0  # policy events handled
        self._backlog = 0  # tenants with a policy when the feed started
        self._caught_up = asyncio.Event()

    async def start(self) -> None:
        import nats

        self._nc = await nats.connect(
            self.nats_url,
            name=f"engine-{self.name}-policies",
            max_reconnect_attempts=-1,
            inbox_prefix=inbox_prefix(ENGINE_USER),
            **self.credentials,
        )
        js = self._nc.jetstream()
        # One message per tenant is delivered first (the last of its subject).
        info = await js.stream_info(STREAM, subjects_filter=POLICY_SUBJECT)
        self._backlog = len(info.state.subjects or {})
        if self._backlog == 0:
            self._caught_up.set()
        await js.subscribe(
            POLICY_SUBJECT,
            stream=STREAM,  # named: its user may not look streams up by subject
            cb=self._on_message,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        )
        try:
            await asyncio.wait_for(self._caught_up.wait(), CATCH_UP_S)
        except TimeoutError:
            await self.stop()
            raise RuntimeError(
                f"{self._seen} of the {self._backlog} tenants' security policies arrived from "
                f"{self.nats_url} in {CATCH_UP_S:g} s; not serving under default policies"
            ) from None
        log.info(
            "security policies of %d tenants applied; following %s on %s",
            self._backlog,
            POLICY_SUBJECT,
            self.nats_url,
        )

    async def stop(self) -> None:
        if self._nc is not None:
            await self._nc.drain()

    async def _on_message(self, msg: Any) -> None:
        self._seen += 1
        if self._seen >= self._backlog:
            self._caught_up.set()
        try:
            event = decode_event(msg.data, {PolicyChanged.event_type: PolicyChanged})
        except ValueError as exc:
            log.error("skipping a policy event on %s that does not decode: %s", msg.subject, exc)
            return
        policy = event.payload.policy
        if self.policies.apply(policy):
            log.info(
                "tenant %s's security policy is now version %d: tier %s, jitter %s",
                policy.tenant_id,
                policy.version,
                policy.tier,
                policy.jitter.mode,
            )
