"""What the bench scripts that drive a running stack share: a fresh tenant's token, and the
facts about the machine a result was measured on."""

from __future__ import annotations

import asyncio
import os
import platform
import sys
import time
import uuid
from typing import Any

from specops_schemas.catalog import Role
from specops_services.gateway.http.tokens import issue_token


def fresh_token(
    dsn: str, prefix: str, *, name: str, role: Role = Role.DEVELOPER, tenant: str | None = None
) -> str:
    """A token of a new tenant (`<prefix>-<random>`), or of `tenant`, issued straight into the
    stack's database: no winner cache, datastore or head of another run interferes."""
    tenant_id = tenant or f"{prefix}-{uuid.uuid4().hex[:12]}"
    return asyncio.run(issue_token(dsn, tenant_id=tenant_id, role=role, name=name)).secret


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": sys.version.split()[0],
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
