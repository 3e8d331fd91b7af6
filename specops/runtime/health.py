"""What a service replica says of itself: its /healthz (specplatform.ops), read by `specops status`."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from specops.runtime.replicas import OPS_HOST

PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Health:
    healthy: bool
    checks: dict[str, bool] = field(default_factory=dict)
    """Each check of its /healthz (`nats`, `database`, ...); empty when it did not answer."""
    error: str | None = None
    """Why there is no answer (still starting, hung), when there is none."""

    def describe(self) -> str:
        if self.error is not None:
            return f"no health answer ({self.error})"
        failing = sorted(name for name, ok in self.checks.items() if not ok)
        return "healthy" if not failing else "cannot reach " + ", ".join(failing)


def ops_url(port: int, path: str) -> str:
    return f"http://{OPS_HOST}:{port}{path}"


def probe(port: int, *, timeout_s: float = PROBE_TIMEOUT_S) -> Health:
    """GET /healthz on `port`: 200 and 503 both carry the checks."""
    try:
        with urllib.request.urlopen(ops_url(port, "/healthz"), timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return Health(healthy=False, error=str(reason) or type(exc).__name__)
    try:
        answer = json.loads(body)
        checks = {str(name): bool(ok) for name, ok in answer["checks"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return Health(healthy=False, error="unreadable /healthz answer")
    return Health(healthy=answer.get("status") == "ok" and all(checks.values()), checks=checks)
