"""T1 runs: `POST runs` and what follows it — the run's request published, its events folded into
`runs` and `run_events` (projection, projector), the stream of them (SSE), the winner applied, the
intake of runs that upstream systems ask for on NATS, and the reaper of stalled runs.

The names below are what other parts of the gateway may use; the modules inside are this
resource's own (an import-linter contract in pyproject.toml holds that).
"""

from specops_services.gateway.runs.db import RUN_MONITOR, count_runs_by_status, get_run
from specops_services.gateway.runs.logic import (
    TERMINAL_EVENT_TYPES,
    TERMINAL_STATUSES,
    RunState,
    apply_conflict,
)
from specops_services.gateway.runs.service import event_feed, list_runs, read_run

__all__ = [
    "RUN_MONITOR",
    "count_runs_by_status",
    "RunState",
    "TERMINAL_EVENT_TYPES",
    "TERMINAL_STATUSES",
    "apply_conflict",
    "event_feed",
    "get_run",
    "list_runs",
    "read_run",
]
