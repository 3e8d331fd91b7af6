"""The T3 head registry: training data and `POST heads/train`, the head-trainer's and quality
gate's `head.*` events folded into `heads` and `head_events`, each head's lifecycle moves and the
artifact paths a winner's flags name.

The names below are what other parts of the gateway may use; the modules inside are this
resource's own (an import-linter contract in pyproject.toml holds that).
"""

from specops_services.gateway.heads.db import artifact_paths
from specops_services.gateway.heads.logic import FINAL_STATES, RATIONALE_REQUIRED, transition_refusal
from specops_services.gateway.heads.service import event_feed, list_heads, read_head

__all__ = [
    "FINAL_STATES",
    "RATIONALE_REQUIRED",
    "artifact_paths",
    "event_feed",
    "list_heads",
    "read_head",
    "transition_refusal",
]
