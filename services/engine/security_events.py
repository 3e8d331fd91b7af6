"""The engine's policy feed: `spec.security.<tenant>.policy_changed` events (the security
service's, issue 20) applied to the server's read model (security.py) as they come.

With `--nats-url` the server reads the SPEC stream from its last `policy_changed` per tenant
(an ordered, ephemeral JetStream consumer: a restarted server starts from every tenant's
current policy, then follows the changes). An event that does not decode is logged and
skipped: the read model keeps the policy it has. Callbacks run on the server's event loop,
where requests read the read model, so no lock is needed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from nats.js.api import DeliverPolicy

from specbus.broker import ensure_stream
from specbus.envelope import decode_event
from specbus.subjects import pattern
from specops_schemas.security import PolicyChanged
from specops_services.engine.security import SecurityPolicies

log = logging.getLogger(__name__)

POLICY_SUBJECT = pattern("security", "policy_changed")


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

    async def start(self) -> None:
        import nats

        self._nc = await nats.connect(self.nats_url, name=f"engine-{self.name}-policies", **self.credentials)
        js = self._nc.jetstream()
        await ensure_stream(js)
        await js.subscribe(
            POLICY_SUBJECT,
            cb=self._on_message,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        )
        log.info("security policies follow %s on %s", POLICY_SUBJECT, self.nats_url)

    async def stop(self) -> None:
        if self._nc is not None:
            await self._nc.drain()

    async def _on_message(self, msg: Any) -> None:
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
