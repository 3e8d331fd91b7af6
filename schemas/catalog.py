"""Closed vocabularies shared by every service (DESIGN.md §2, §3, §6; seed 000)."""

from __future__ import annotations

from enum import StrEnum


class Family(StrEnum):
    """Speculative-decoding algorithm families the catalog knows."""

    DRAFT_MODEL = "draft_model"
    NGRAM = "ngram"
    REST = "rest"
    MEDUSA = "medusa"
    EAGLE = "eagle"
    LOOKAHEAD = "lookahead"
    MTP = "mtp"
    CASCADE = "cascade"


class Engine(StrEnum):
    """Serving engines a winner can be applied to."""

    SPECCORE = "speccore"
    VLLM = "vllm"
    SGLANG = "sglang"


class Fingerprint(StrEnum):
    """Workload fingerprints: they prune the catalog and pick the measurement prompts."""

    CHAT = "chat"
    CODE = "code"
    RAG = "rag"
    SUMMARIZATION = "summarization"
    STRUCTURED = "structured"
    REASONING = "reasoning"
    CREATIVE = "creative"
    LONG_CONTEXT = "long_context"


class GateMethod(StrEnum):
    """The seven quality-gate methods of seed 000; `topk5` is the default."""

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
    """Where a run or a candidate failed; `quality_regression` is a gate fail (seed 000);
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
