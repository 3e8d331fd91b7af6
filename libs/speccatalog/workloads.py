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

import re
from dataclasses import dataclass
from typing import Literal


class UnknownWorkload(ValueError):
    """A workload name that is neither a fingerprint nor one of the extra prompt sets."""


@dataclass(frozen=True, slots=True)
class WizardAnswer:
    """The answer to one of the console's new-run questions that picks this fingerprint."""

    question: Literal["output", "input", "length"]
    value: str
    label: str


@dataclass(frozen=True, slots=True)
class PromptCue:
    """What makes a sample prompt pasted into the console vote for this fingerprint."""

    pattern: re.Pattern[str]
    # Cues are tried lowest rank first: code and data formats are the clearest signs.
    rank: int


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
    cue: PromptCue | None = None


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
        cue=PromptCue(
            re.compile(r"```|\bdef |\bfunction\b|\bclass \w+|#include|\bimport \w+|=>|\breturn\b"), rank=0
        ),
    ),
    WorkloadSpec(
        "rag",
        fingerprint="rag",
        context=8192,
        answer=WizardAnswer("input", "documents", "Retrieved documents to answer from"),
        cue=PromptCue(
            re.compile(r"\bcontext:|\bdocuments?\b|\bbased on the (following|passage)|\bsources?:", re.I),
            rank=3,
        ),
    ),
    WorkloadSpec(
        "summarization",
        fingerprint="summarization",
        context=8192,
        answer=WizardAnswer("input", "condense", "A text to summarize"),
        cue=PromptCue(re.compile(r"\bsummar|\btl;?dr\b|\bcondense\b|\bkey points\b", re.I), rank=2),
    ),
    WorkloadSpec(
        "structured",
        fingerprint="structured",
        context=4096,
        answer=WizardAnswer("output", "structured", "JSON or another fixed format"),
        cue=PromptCue(re.compile(r"\bjson\b|\byaml\b|\bschema\b|\bcsv\b|^\s*[{\[]", re.I | re.M), rank=1),
    ),
    WorkloadSpec(
        "reasoning",
        fingerprint="reasoning",
        context=8192,
        answer=WizardAnswer("input", "problem", "A problem to reason through step by step"),
        cue=PromptCue(
            re.compile(r"step by step|\bprove\b|\bsolve\b|\bhow many\b|\bcalculate\b", re.I), rank=4
        ),
    ),
    WorkloadSpec(
        "creative",
        fingerprint="creative",
        context=4096,
        temperature=1.0,
        answer=WizardAnswer("input", "brief", "A creative brief (story, poem, copy)"),
        cue=PromptCue(re.compile(r"\bstory\b|\bpoem\b|\bimagine\b|\bslogan\b|\blyrics\b", re.I), rank=5),
    ),
    # The console tells long context by a prompt's length rather than by a cue.
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


def prompt_cues() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """(fingerprint, pattern) of every prompt cue, in the order the console tries them."""
    cued = sorted((spec.cue.rank, name, spec.cue.pattern) for name, spec in WORKLOADS.items() if spec.cue)
    return tuple((name, pattern) for _, name, pattern in cued)
