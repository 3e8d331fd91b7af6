"""T2 tune sessions: `POST tune-sessions` from a completed run, the tuner's events folded into
`tune_sessions` and `tune_session_events`, the session's stream, its best-so-far chart and its
winner applied.

The names below are what other parts of the gateway may use; the modules inside are this
resource's own (an import-linter contract in pyproject.toml holds that).
"""

from specops_services.gateway.tune.logic import TERMINAL_EVENT_TYPES, TERMINAL_STATUSES
from specops_services.gateway.tune.service import event_feed, list_sessions, read_session

__all__ = [
    "TERMINAL_EVENT_TYPES",
    "TERMINAL_STATUSES",
    "event_feed",
    "list_sessions",
    "read_session",
]
