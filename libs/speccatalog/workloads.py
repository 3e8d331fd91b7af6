"""Workloads: one :class:`WorkloadSpec` per prompt set specops measures, in :data:`WORKLOADS`.

A *fingerprint* is a workload a run declares on the wire (specops_schemas.catalog's
``Fingerprint`` is generated from :data:`FINGERPRINTS`); the catalog's priors, pruning and
sampling are per fingerprint. A few more workloads measure a fingerprint from another
side and name the one they stand for: ``agentic`` (an agent's repetitive tool calls and
code edits) is ``structured`` traffic, so it reaches them through :func:`fingerprint_of`.

Every workload's prompt set has the workload's name (specprompts builds them). Chat and
creative endpoints sample (0.7 and 1.0), the others decode greedily. The temperature
selects the predictor's acceptance prior bucket and every bench's sampling, T1's and
T2's alike (``Sampling.for_fingerprint`` on the wire), so a tuned winner is measured as
its T1 run was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


class UnknownWorkload(ValueError):
    """A workload name that is neither a fingerprint nor one of the extra prompt sets."""


@dataclass(frozen=True, slots=True)
class WizardAnswer:
    """The answer to one of the wizard's questions (speccatalog.fingerprint) that picks this fingerprint."""

    question: Literal["output", "input", "length"]
    value: str
    label: str


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """One workload; its prompt set in specprompts has its name."""

    name: str
    fingerprint: str  # the fingerprint its prompts measure: its own name for a fingerprint
    # Working context: the size the KV cache must hold per sequence (capped at the target's).
    context: int
    temperature: float = 0.0  # 0: greedy
    # The corpus of its built-in REST datastore (``builtin:<name>``, specprompts.corpora).
    corpus: Literal["sharegpt", "stdlib"] | None = None
    answer: WizardAnswer | None = None


def _registry(*specs: WorkloadSpec) -> dict[str, WorkloadSpec]:
    return {spec.name: spec for spec in specs}


# In the wire enum's order.
WORKLOADS = _registry(
    WorkloadSpec(
        "chat",
        fingerprint="chat",
        context=4096,
        temperature=0.7,
        corpus="sharegpt",
        answer=WizardAnswer("input", "conversation", "A chat turn or short instruction"),
    ),
    WorkloadSpec(
        "code",
        fingerprint="code",
        context=4096,
        corpus="stdlib",
        answer=WizardAnswer("output", "code", "Source code"),
    ),
    WorkloadSpec(
        "rag",
        fingerprint="rag",
        context=8192,
        answer=WizardAnswer("input", "documents", "Retrieved documents to answer from"),
    ),
    WorkloadSpec(
        "summarization",
        fingerprint="summarization",
        context=8192,
        answer=WizardAnswer("input", "condense", "A text to summarize"),
    ),
    WorkloadSpec(
        "structured",
        fingerprint="structured",
        context=4096,
        answer=WizardAnswer("output", "structured", "JSON or another fixed format"),
    ),
    WorkloadSpec(
        "reasoning",
        fingerprint="reasoning",
        context=8192,
        answer=WizardAnswer("input", "problem", "A problem to reason through step by step"),
    ),
    WorkloadSpec(
        "creative",
        fingerprint="creative",
        context=4096,
        temperature=1.0,
        answer=WizardAnswer("input", "brief", "A creative brief (story, poem, copy)"),
    ),
    WorkloadSpec(
        "long_context",
        fingerprint="long_context",
        context=32_768,
        answer=WizardAnswer("length", "long", "Tens of thousands of tokens"),
    ),
    WorkloadSpec("agentic", fingerprint="structured", context=4096),
)
FINGERPRINTS = tuple(name for name, spec in WORKLOADS.items() if spec.fingerprint == name)


def workload_spec(name: str) -> WorkloadSpec:
    """The spec of workload ``name``; UnknownWorkload listing the valid ones otherwise."""
    spec = WORKLOADS.get(name)
    if spec is None:
        raise UnknownWorkload(f"unknown workload {name!r}; valid workloads: {', '.join(WORKLOADS)}")
    return spec


def fingerprint_of(workload: str) -> str:
    """The fingerprint a workload's prompt set measures (a fingerprint's own set: itself)."""
    return workload_spec(workload).fingerprint


def temperature(workload: str) -> float:
    """The sampling temperature a workload is measured at (0: greedy)."""
    return workload_spec(workload).temperature
