"""The tenant's security policy: GET/PUT `security/policy`, the read model the security
service's events keep, and the checks every measuring or applying POST makes against it.

The names below are what other parts of the gateway may use; the modules inside are this
resource's own (an import-linter contract in pyproject.toml holds that).
"""

from specops_services.gateway.security.service import (
    read_policy,
    require_budget,
    require_speculation,
    speculation_disabled,
    tenant_policy,
)

__all__ = [
    "read_policy",
    "require_budget",
    "require_speculation",
    "speculation_disabled",
    "tenant_policy",
]
