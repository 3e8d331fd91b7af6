"""Closed vocabularies shared by every service.

Family is the one open vocabulary: its members are the family specs registered in
speccatalog.families (the built-in ones and those of installed packages), so a new
family is known on the wire without editing this file. Fingerprint's members are the
fingerprints of speccatalog.workloads, where each workload is declared once.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from speccatalog.families import families
from speccatalog.workloads import FINGERPRINTS

if TYPE_CHECKING:

    class Family(StrEnum):
        """Speculative-decoding algorithm families the catalog knows (speccatalog.families)."""

    class Fingerprint(StrEnum):
        """Workload fingerprints: they prune the catalog and pick the measurement prompts."""

else:
    Family = StrEnum("Family", [(name.upper(), name) for name in families()])
    Family.__doc__ = "Speculative-decoding algorithm families the catalog knows (speccatalog.families)."
    Fingerprint = StrEnum("Fingerprint", [(name.upper(), name) for name in FINGERPRINTS])
    Fingerprint.__doc__ = "Workload fingerprints: they prune the catalog and pick the measurement prompts."


class Engine(StrEnum):
    """Serving engines a winner can be applied to."""

    SPECCORE = "speccore"
    VLLM = "vllm"
    SGLANG = "sglang"


class GateMethod(StrEnum):
    """The seven quality-gate methods; `topk5` is the default."""

    EXACT = "exact"
    TOPK5 = "topk5"
    LOGIT_KL = "logit_kl"
    MMLU_SLICE = "mmlu_slice"
    CONSTRAINT_VIOLATION = "constraint_violation"
    SKIPPED = "skipped"
    PENDING = "pending"


class Role(StrEnum):
    """Token roles: viewer < developer < admin, plus head_reviewer for head promotion."""

    VIEWER = "viewer"
    DEVELOPER = "developer"
    ADMIN = "admin"
    HEAD_REVIEWER = "head_reviewer"


class Mode(StrEnum):
    """Serving pressure the winner is chosen for: batch=1 latency or batched throughput."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


class RunStatus(StrEnum):
    """Lifecycle of a T1 run, in the order the SSE stream reports it."""

    QUEUED = "queued"
    RUNNING = "running"
    PREDICTED = "predicted"
    COMPLETED = "completed"
    FAILED = "failed"


class ErrorStage(StrEnum):
    """Where a run or a candidate failed; `quality_regression` is a gate fail;
    `dead_letter`: a service gave up on one of the run's events and parked it (DLQ)."""

    VALIDATION = "validation"
    PREDICTION = "prediction"
    MODEL_LOAD = "model_load"
    BENCHMARK = "benchmark"
    QUALITY_GATE = "quality_gate"
    QUALITY_REGRESSION = "quality_regression"
    TIMEOUT = "timeout"
    INTERNAL = "internal"
    DEAD_LETTER = "dead_letter"
    TRAINING = "training"  # a T3 head could not be trained
