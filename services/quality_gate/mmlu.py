"""`mmlu_slice`: MMLU accuracy with and without the candidate on a seeded slice.

Each question is asked zero-shot (as a chat turn when the model has a template)
and the reply is started with "The correct answer is", which small instruct
models otherwise tend to spend their first tokens on. Both engines decode a few
tokens greedily; the first standalone letter A-D is the answer (none counts as
wrong). The score is the accuracy drop, baseline - candidate.
"""

from __future__ import annotations

import re

from speccore.engine import Engine
from speccore.models import LoadedModel
from speccore.sampling import SamplingParams
from specops_schemas.candidates import GateOutcome
from specops_schemas.catalog import GateMethod
from specops_services.quality_gate.decoding import Reference
from specprompts.sources import MMLUQuestion, mmlu_questions

LETTERS = "ABCD"
ANSWER_PREFIX = "The correct answer is"
_ANSWER = re.compile(r"\b([ABCD])\b")


def question_text(q: MMLUQuestion) -> str:
    options = "\n".join(f"{letter}. {text}" for letter, text in zip(LETTERS, q["choices"], strict=True))
    return (
        f"The following is a multiple choice question about {q['subject']}.\n\n"
        f"{q['question']}\n{options}\nAnswer with the letter of the correct option."
    )


def question_ids(target: LoadedModel, q: MMLUQuestion) -> list[int]:
    """The question, then the start of the reply, as token ids."""
    chat = bool(target.tokenizer.chat_template)
    prompt = target.encode_prompt(question_text(q) if chat else question_text(q) + "\n", chat=chat)
    return prompt + list(target.tokenizer(ANSWER_PREFIX, add_special_tokens=False).input_ids)


def parse_answer(text: str) -> int | None:
    """Index of the first standalone letter A-D in a reply, or None."""
    found = _ANSWER.search(text)
    return LETTERS.index(found.group(1)) if found else None


def mmlu_slice(ref: Reference, engine: Engine, sampling: SamplingParams, threshold: float) -> GateOutcome:
    """Always greedy: accuracy is a property of the model's best answer, not of a sample."""
    questions = mmlu_questions(ref.sample.mmlu_questions, ref.sample.seed)
    ids = [question_ids(ref.target, q) for q in questions]
    n_new = ref.sample.mmlu_new_tokens
    greedy = SamplingParams()
    base = [parse_answer(g.text) for g in ref.baseline("mmlu", ids, n_new, greedy)]
    cand = [parse_answer(g.text) for g in ref.generate(engine, ids, n_new, greedy)]

    truth = [q["answer"] for q in questions]
    base_acc = sum(a == t for a, t in zip(base, truth, strict=True)) / len(questions)
    cand_acc = sum(a == t for a, t in zip(cand, truth, strict=True)) / len(questions)
    changed = [q["id"] for q, a, b in zip(questions, base, cand, strict=True) if a != b]
    score = base_acc - cand_acc
    return GateOutcome(
        method=GateMethod.MMLU_SLICE,
        passed=score <= threshold,
        score=score,
        threshold=threshold,
        details={
            "decoding": "greedy",
            "questions": len(questions),
            "seed": ref.sample.seed,
            "baseline_accuracy": base_acc,
            "candidate_accuracy": cand_acc,
            "baseline_unanswered": base.count(None),
            "candidate_unanswered": cand.count(None),
            "changed_answers": len(changed),
            "first_changed": changed[0] if changed else None,
        },
    )
