"""Workloads: the fingerprints, the prompt sets measured for each, and how each is sampled.

Every fingerprint has a prompt set of its own name (specprompts builds them); a few
more sets measure a fingerprint from another side and name the fingerprint they
stand for in ``EXTRA_WORKLOADS``: ``agentic`` (an agent's repetitive tool calls and
code edits) is ``structured`` traffic. The catalog's priors, pruning and sampling
are per fingerprint, so a workload reaches them through :func:`fingerprint_of`.

Chat and creative endpoints sample (0.7 and 1.0), the others decode greedily. The
temperature selects the predictor's acceptance prior bucket and every bench's sampling,
T1's and T2's alike (``Sampling.for_fingerprint`` on the wire), so a tuned winner is
measured as its T1 run was.
"""

from __future__ import annotations

# The same names as specops_schemas.catalog.Fingerprint (the wire's vocabulary), which
# this bottom layer cannot import; a unit test holds them equal.
FINGERPRINTS = ("chat", "code", "rag", "summarization", "structured", "reasoning", "creative", "long_context")
EXTRA_WORKLOADS: dict[str, str] = {"agentic": "structured"}
WORKLOADS = (*FINGERPRINTS, *EXTRA_WORKLOADS)

FINGERPRINT_TEMPERATURE: dict[str, float] = {"chat": 0.7, "creative": 1.0}


class UnknownWorkload(ValueError):
    """A workload name that is neither a fingerprint nor one of the extra prompt sets."""


def fingerprint_of(workload: str) -> str:
    """The fingerprint a workload's prompt set measures (a fingerprint's own set: itself)."""
    if workload not in WORKLOADS:
        raise UnknownWorkload(f"unknown workload {workload!r}; valid workloads: {', '.join(WORKLOADS)}")
    return EXTRA_WORKLOADS.get(workload, workload)


def temperature(fingerprint: str) -> float:
    """The sampling temperature a fingerprint's endpoint is measured at (0: greedy)."""
    return FINGERPRINT_TEMPERATURE.get(str(fingerprint), 0.0)
