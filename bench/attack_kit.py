"""What bench/attack.py's attacks share: the target they are played on, the registry they
are played from (`@attack`), and small helpers of what they observe."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx
from common import fresh_token
from live_stack import (
    TARGET,
    Stack,
)

from specops_schemas.api import API_PREFIX
from specops_schemas.catalog import Role

RUN_BODY = {"target": TARGET, "workload": {"fingerprint": "chat"}, "goal": {"quality_gate": "topk5"}}
PROBLEM = "application/problem+json"
MB = 1024 * 1024


@dataclass
class Outcome:
    """One row of bench/results/attack.json."""

    name: str
    expected: str
    observed: str
    held: bool
    duration_s: float = 0.0


@dataclass
class Target:
    stack: Stack
    engine_url: str
    engine_pid: int
    outage_s: float

    def api(self, path: str) -> str:
        return f"{self.stack.url}{API_PREFIX}{path}"

    def token(self, prefix: str, role: Role = Role.DEVELOPER, tenant: str | None = None) -> str:
        return fresh_token(self.stack.database_url, prefix, name=f"attack-{prefix}", role=role, tenant=tenant)

    def tenant_token(self, tenant: str, role: Role = Role.DEVELOPER) -> str:
        return self.token(tenant, role, tenant)


Observed = tuple[str, bool]
"""What an attack saw, and whether that is what was expected."""


@dataclass(frozen=True)
class Attack:
    name: str
    expected: str
    run: Callable[[Target], Observed]


ATTACKS: dict[str, Attack] = {}


def attack(
    name: str, expected: str
) -> Callable[[Callable[[Target], Observed]], Callable[[Target], Observed]]:
    """Register an attack under `name`, with what must happen when it is played."""

    def register(run: Callable[[Target], Observed]) -> Callable[[Target], Observed]:
        ATTACKS[name] = Attack(name, expected, run)
        return run

    return register


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def is_problem(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").startswith(PROBLEM)


def short(text: str | bytes, limit: int = 160) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def last_line(text: str) -> str:
    """What a traceback ends with: the error."""
    return next((line for line in reversed(text.splitlines()) if line.strip()), "")
