"""How each workload fingerprint is served when it is measured: its sampling temperature.

Chat and creative endpoints sample (0.7 and 1.0), the others decode greedily. The
temperature selects the predictor's acceptance prior bucket and every bench's sampling,
T1's and T2's alike, so a tuned winner is measured as its T1 run was.
"""

from __future__ import annotations

FINGERPRINT_TEMPERATURE: dict[str, float] = {"chat": 0.7, "creative": 1.0}


def temperature(fingerprint: str) -> float:
    """The sampling temperature a fingerprint's endpoint is measured at (0: greedy)."""
    return FINGERPRINT_TEMPERATURE.get(str(fingerprint), 0.0)
