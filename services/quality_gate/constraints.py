"""`constraint_violation`: JSON Schema violations per 1k generated tokens.

Each structured task asks for one JSON object and nothing else; a reply's
violations are counted by specprompts.structured.violations. The seed's bound
"<= N violations per 1k tokens" is read as an increase over the target's own rate
on the same tasks: small models break schemas by themselves, and speculation is
only to blame for what it adds. In-process the gate decodes both sides on
speccore; a candidate measured on an engine server brings the same counts from
the bench (`Measurement.structured`), judged by the same :func:`constraint_outcome`.
"""

from __future__ import annotations

from speccore.engine import Engine
from speccore.sampling import SamplingParams
from specops_schemas.candidates import GateOutcome, StructuredEvidence
from specops_schemas.catalog import GateMethod
from specops_services.quality_gate.decoding import Reference, describe
from specprompts.structured import violations


def per_1k(count: int, tokens: int) -> float:
    return 1000.0 * count / max(tokens, 1)


def constraint_violation(
    ref: Reference, engine: Engine, sampling: SamplingParams, threshold: float
) -> GateOutcome:
    tasks = ref.tasks()
    chat = bool(ref.target.tokenizer.chat_template)
    ids = [ref.target.encode_prompt(t.prompt.text, chat=chat and t.prompt.chat) for t in tasks]
    n_new = ref.sample.structured_new_tokens
    base = ref.baseline("structured", ids, n_new, sampling)
    cand = ref.generate(engine, ids, n_new, sampling)
    base_found = [violations(g.text, t.schema) for g, t in zip(base, tasks, strict=True)]
    cand_found = [violations(g.text, t.schema) for g, t in zip(cand, tasks, strict=True)]
    evidence = StructuredEvidence(
        task_ids=[t.prompt.id for t in tasks],
        baseline_violations=[v for v, _ in base_found],
        candidate_violations=[v for v, _ in cand_found],
        candidate_problems=[p for _, p in cand_found],
        baseline_tokens=sum(len(g.token_ids) for g in base),
        candidate_tokens=sum(len(g.token_ids) for g in cand),
    )
    return constraint_outcome(evidence, describe(sampling), threshold)


def constraint_outcome(evidence: StructuredEvidence, decoding: str, threshold: float) -> GateOutcome:
    base, cand = evidence.baseline_violations, evidence.candidate_violations
    base_count, cand_count = sum(base), sum(cand)
    base_rate = per_1k(base_count, evidence.baseline_tokens)
    cand_rate = per_1k(cand_count, evidence.candidate_tokens)
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
            "tasks": len(evidence.task_ids),
            "baseline_violations": base_count,
            "candidate_violations": cand_count,
            "baseline_tokens": evidence.baseline_tokens,
            "candidate_tokens": evidence.candidate_tokens,
            "baseline_per_1k": base_rate,
            "candidate_per_1k": cand_rate,
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
