"""Issue 20 on a whole `specops up` stack, each service as its own process under its own NATS
user: an admin's policy change travels gateway -> security service -> gateway, predictor and
audit log; a developer's attempt is refused (403); the opted-out tenant's run completes as
`speculation_disabled` with no bench requested. Nothing here measures, so the services that
measure are not started."""

from __future__ import annotations

import asyncio
import time

import httpx
import psycopg
import pytest
from fixtures.runtime import TINY, started

from specops.runtime.supervisor import SERVICES
from specops_schemas.api import API_PREFIX
from specops_schemas.catalog import Role
from specops_schemas.security import OPT_OUT_REASON
from specops_services.gateway.http.tokens import issue_token

pytestmark = pytest.mark.slow

TENANT = "isolated"
REQUEST = {
    "target": {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"},
    "workload": {"fingerprint": "chat"},
    "goal": {"quality_gate": "topk5"},
}
WAIT_S = 120.0


def _audited(database_url: str) -> list[str]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT type FROM audit_log WHERE tenant_id = %s AND type LIKE 'security.%%' ORDER BY seq",
            (TENANT,),
        ).fetchall()
    return [t for (t,) in rows]


def test_a_policy_change_crosses_the_stack_and_an_opted_out_run_is_not_speculated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    idle = {"benchmark-runner": 0, "quality-gate": 0, "head-trainer": 0, "tuner": 0}
    with started(monkeypatch, replicas=dict.fromkeys(SERVICES, 1) | idle, env=TINY) as runtime:
        admin = asyncio.run(issue_token(runtime.database_url, tenant_id=TENANT, role=Role.ADMIN)).secret
        dev = asyncio.run(issue_token(runtime.database_url, tenant_id=TENANT, role=Role.DEVELOPER)).secret
        with httpx.Client(base_url=runtime.url, timeout=WAIT_S) as client:
            policy = f"{API_PREFIX}/security/policy"
            refused = client.put(policy, json={"tier": "shared"}, headers={"Authorization": f"Bearer {dev}"})
            assert refused.status_code == 403
            put = client.put(
                policy,
                json={"tier": "multi_tenant_isolated", "speculation_opt_out": True},
                headers={"Authorization": f"Bearer {admin}"},
            )
            assert put.status_code == 200, put.text + runtime.logs()
            assert put.json()["version"] == 1 and put.json()["speculation_opt_out"] is True

            # Right after the 200: the run's request carries the opt-out the gateway now has.
            deadline = time.monotonic() + WAIT_S
            auth = {"Authorization": f"Bearer {dev}"}
            created = client.post(f"{API_PREFIX}/runs", json=REQUEST, headers=auth)
            assert created.status_code == 202, created.text
            run_id = created.json()["id"]
            while (run := client.get(f"{API_PREFIX}/runs/{run_id}", headers=auth).json())["status"] not in (
                "completed",
                "failed",
            ):
                assert time.monotonic() < deadline + WAIT_S, runtime.logs()
                time.sleep(0.2)
            events = client.get(f"{API_PREFIX}/runs/{run_id}/events", headers=auth).text
        while len(audited := _audited(runtime.database_url)) < 3:
            assert time.monotonic() < deadline + 2 * WAIT_S, runtime.logs()
            time.sleep(0.2)

    assert run["status"] == "completed" and run["speculation_disabled"] == OPT_OUT_REASON, run
    assert run["winner"] is None and run["candidates"] == []
    assert "bench.requested" not in events and "run.predicted" not in events
    assert sorted(audited) == ["security.policy_changed", "security.policy_requested", "security.refused"]
