"""`mmlu_slice`: MMLU accuracy with and without the candidate on a seeded slice.

The questions are asked as specprompts.mmlu asks them; both engines decode a few
tokens greedily and the first standalone letter A-D is the answer (none counts as
wrong). The score is the accuracy drop, baseline - candidate. In-process the gate
decodes both sides on speccore; a candidate measured on an engine server brings the
same answers from the bench (`Measurement.mmlu`), judged by the same
:func:`mmlu_outcome`.
"""

from __future__ import annotations

from speccore.engine import Engine
from speccore.models import LoadedModel
from speccore.sampling import SamplingParams
from specops_schemas.candidates import GateOutcome, MmluEvidence
from specops_schemas.catalog import GateMethod
from specops_services.quality_gate.decoding import Reference
from specprompts.mmlu import ANSWER_PREFIX, parse_answer, question_text
from specprompts.sources import MMLUQuestion, mmlu_questions


def question_ids(target: LoadedModel, q: MMLUQuestion) -> list[int]:
    """The question, then the start of the reply, as token ids."""
    chat = bool(target.tokenizer.chat_template)
    prompt = target.encode_prompt(question_text(q) if chat else question_text(q) + "\n", chat=chat)
    return prompt + list(target.tokenizer(ANSWER_PREFIX, add_special_tokens=False).input_ids)


def mmlu_slice(ref: Reference, engine: Engine, sampling: SamplingParams, threshold: float) -> GateOutcome:
    """Always greedy: accuracy is a property of the model's best answer, not of a sample."""
    questions = mmlu_questions(ref.sample.mmlu_questions, ref.sample.seed)
    ids = [question_ids(ref.target, q) for q in questions]
    n_new = ref.sample.mmlu_new_tokens
    greedy = SamplingParams()
    evidence = MmluEvidence(
        seed=ref.sample.seed,
        question_ids=[q["id"] for q in questions],
        truth=[q["answer"] for q in questions],
        baseline_answers=[parse_answer(g.text) for g in ref.baseline("mmlu", ids, n_new, greedy)],
        candidate_answers=[parse_answer(g.text) for g in ref.generate(engine, ids, n_new, greedy)],
    )
    return mmlu_outcome(evidence, threshold)


def mmlu_outcome(evidence: MmluEvidence, threshold: float) -> GateOutcome:
    base, cand, truth = evidence.baseline_answers, evidence.candidate_answers, evidence.truth
    n = len(truth)
    base_acc = sum(a == t for a, t in zip(base, truth, strict=True)) / n
    cand_acc = sum(a == t for a, t in zip(cand, truth, strict=True)) / n
    changed = [qid for qid, a, b in zip(evidence.question_ids, base, cand, strict=True) if a != b]
    score = base_acc - cand_acc
    return GateOutcome(
        method=GateMethod.MMLU_SLICE,
        passed=score <= threshold,
        score=score,
        threshold=threshold,
        details={
            "decoding": "greedy",
            "questions": n,
            "seed": evidence.seed,
            "baseline_accuracy": base_acc,
            "candidate_accuracy": cand_acc,
            "baseline_unanswered": base.count(None),
            "candidate_unanswered": cand.count(None),
            "changed_answers": len(changed),
            "first_changed": changed[0] if changed else None,
        },
    )
