"""The three-question wizard: which fingerprint an endpoint serves, from what it produces,
what its requests carry and how long they are. The console's new-run page and
``specops fingerprint --wizard`` ask the same questions; the answers that pick a fingerprint
are its workload spec's (speccatalog.workloads.WizardAnswer).
"""

from __future__ import annotations

from dataclasses import dataclass

from speccatalog.workloads import WORKLOADS


@dataclass(frozen=True, slots=True)
class Question:
    name: str
    text: str
    choices: tuple[tuple[str, str], ...]
    """(value, label) of each answer."""


def _picks(question: str) -> dict[str, str]:
    """The answers to `question` that pick a fingerprint, by value."""
    return {
        spec.answer.value: name
        for name, spec in WORKLOADS.items()
        if spec.answer is not None and spec.answer.question == question
    }


def _choices(question: str) -> tuple[tuple[str, str], ...]:
    return tuple(
        (spec.answer.value, spec.answer.label)
        for spec in WORKLOADS.values()
        if spec.answer is not None and spec.answer.question == question
    )


QUESTIONS = (
    Question(
        "output",
        "What does the endpoint produce?",
        (("text", "Prose or conversation"), *_choices("output")),
    ),
    Question("input", "What does a typical request carry?", _choices("input")),
    Question(
        "length",
        "How long are the prompts?",
        (("short", "Up to a few thousand tokens"), *_choices("length")),
    ),
)

_BY_OUTPUT = _picks("output")
_BY_INPUT = _picks("input")
_BY_LENGTH = _picks("length")
# Long prompts dominate how a chat or retrieval endpoint behaves (the draft's context).
_LONG_INPUTS = frozenset({"conversation", "documents"})


class UnknownAnswer(ValueError):
    """An answer that is not one of its question's choices."""


def wizard(output: str, input: str, length: str) -> str:
    """The fingerprint the three answers describe: the output format decides first (code and
    structured output draft alike whatever they read), then what the prompts carry and how long."""
    for question, answer in zip(QUESTIONS, (output, input, length), strict=True):
        values = [value for value, _ in question.choices]
        if answer not in values:
            raise UnknownAnswer(f"{question.name}: {answer!r} is not one of {', '.join(values)}")
    if output in _BY_OUTPUT:
        return _BY_OUTPUT[output]
    if length in _BY_LENGTH and input in _LONG_INPUTS:
        return _BY_LENGTH[length]
    return _BY_INPUT[input]


def wizard_table() -> dict[str, str]:
    """Every combination of answers -> its fingerprint, keyed `output/input/length` (the console's
    script looks the user's answers up in it)."""
    output, input, length = (tuple(value for value, _ in q.choices) for q in QUESTIONS)
    return {f"{o}/{i}/{n}": wizard(o, i, n) for o in output for i in input for n in length}
