"""The tenants' live workloads: the latest summary each engine server with
ENABLE_L4_AUTO_WORKLOAD_FINGERPRINT published per (tenant, served model), which a run asking for
`"fingerprint": "auto"` without samples is inferred from.

The names below are what other parts of the gateway may use; the modules inside are this
resource's own (an import-linter contract in pyproject.toml holds that).
"""

from specops_services.gateway.live_workload.db import LiveSummary, latest

__all__ = ["LiveSummary", "latest"]
