"""`constraint_violation`: violations of each task's contract per 1k generated tokens.

The workload picks the tasks and their check (specprompts.sets.constraint_tasks):

- ``json_schema``: each structured task (or agentic tool call) asks for one JSON object and
  nothing else; a reply's violations are counted by specprompts.structured.violations.
- ``python_syntax`` (the ``code`` fingerprint): each task is a HumanEval function stub
  completed as a raw prompt; a completion that does not parse is one violation, by
  specprompts.code's rule (cut at the function's end; a completion the token budget
  cut need only be a valid prefix of a program).

The seed's bound "<= N violations per 1k tokens" is read as an increase over the target's
own rate on the same tasks: small models break schemas and code by themselves, and
speculation is only to blame for what it adds. In-process the gate decodes both sides on
speccore; a candidate measured on an engine server brings the same counts from the bench
(`Measurement.structured`), judged by the same :func:`constraint_outcome`.
"""

from __future__ import annotations

from collections.abc import Sequence

from speccore.engine import Engine
from speccore.errors import SpecError
from speccore.sampling import SamplingParams
from specops_schemas.candidates import GateOutcome, StructuredEvidence
from specops_schemas.catalog import GateMethod
from specops_services.quality_gate.decoding import Reference, describe
from specprompts.sets import ConstraintTask, count_replies


def per_1k(count: int, tokens: int) -> float:
    return 1000.0 * count / max(tokens, 1)


def constraint_violation(
    ref: Reference, engine: Engine, sampling: SamplingParams, threshold: float
) -> GateOutcome:
    tasks = ref.tasks()
    chat = bool(ref.target.tokenizer.chat_template)
    ids = [ref.target.encode_prompt(t.prompt.text, chat=chat and t.prompt.chat) for t in tasks]
    check = check_of(tasks)
    n_new = ref.sample.new_tokens_for(check)
    base = ref.baseline(check, ids, n_new, sampling)
    cand = ref.generate(engine, ids, n_new, sampling)
    evidence = count_evidence(
        tasks,
        baseline=[(g.text, len(g.token_ids)) for g in base],
        candidate=[(g.text, len(g.token_ids)) for g in cand],
        max_new_tokens=n_new,
    )
    return constraint_outcome(evidence, describe(sampling), threshold)


def check_of(tasks: Sequence[ConstraintTask]) -> str:
    """The one check of a task set (the evidence names one); SpecError when they differ."""
    checks = {t.check for t in tasks}
    if len(checks) != 1:
        raise SpecError(f"constraint_violation needs tasks of one check, got {sorted(checks) or 'none'}")
    return checks.pop()


def count_evidence(
    tasks: Sequence[ConstraintTask],
    *,
    baseline: Sequence[tuple[str, int]],
    candidate: Sequence[tuple[str, int]],
    max_new_tokens: int,
) -> StructuredEvidence:
    """Both sides' replies (text, generated tokens) to ``tasks``, their violations counted
    (specprompts.sets.count_replies)."""
    base_found = count_replies(tasks, baseline, max_new_tokens)
    cand_found = count_replies(tasks, candidate, max_new_tokens)
    return StructuredEvidence(
        check=tasks[0].check,
        task_ids=[t.prompt.id for t in tasks],
        baseline_violations=[v for v, _ in base_found],
        candidate_violations=[v for v, _ in cand_found],
        candidate_problems=[p for _, p in cand_found],
        baseline_tokens=sum(n for _, n in baseline),
        candidate_tokens=sum(n for _, n in candidate),
    )


def constraint_outcome(evidence: StructuredEvidence, decoding: str, threshold: float) -> GateOutcome:
    base, cand = evidence.baseline_violations, evidence.candidate_violations
    base_count, cand_count = sum(base), sum(cand)
    base_rate = per_1k(base_count, evidence.baseline_tokens)
    cand_rate = per_1k(cand_count, evidence.candidate_tokens)
    tasks = len(evidence.task_ids)
    # The task where the candidate adds the most violations over the target.
    extra, worst = max(((c - b, i) for i, (b, c) in enumerate(zip(base, cand, strict=True))), default=(0, -1))
    score = cand_rate - base_rate
    return GateOutcome(
        method=GateMethod.CONSTRAINT_VIOLATION,
        passed=score <= threshold,
        score=score,
        threshold=threshold,
        details={
            "decoding": decoding,
            "check": evidence.check,
            "tasks": tasks,
            "baseline_violations": base_count,
            "candidate_violations": cand_count,
            "baseline_tokens": evidence.baseline_tokens,
            "candidate_tokens": evidence.candidate_tokens,
            "baseline_per_1k": base_rate,
            "candidate_per_1k": cand_rate,
            "baseline_per_task": base_count / tasks,
            "candidate_per_task": cand_count / tasks,
            "baseline_valid_replies": sum(v == 0 for v in base),
            "candidate_valid_replies": sum(v == 0 for v in cand),
            "worst_task": (
                {
                    "task_id": evidence.task_ids[worst],
                    "extra_violations": extra,
                    "problem": evidence.candidate_problems[worst],
                }
                if extra > 0
                else None
            ),
        },
    )
