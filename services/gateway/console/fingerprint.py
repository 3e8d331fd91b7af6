"""Which workload fingerprint a new run declares: the three-question wizard, and a guess
from pasted sample prompts. Pure functions; the new-run page offers both and the user may still
pick any fingerprint by hand.

Glossary:

- *answers*: the wizard's three answers, (output, input, length); see QUESTIONS.
- *vote*: the fingerprint one sample prompt looks like; the most voted fingerprint wins.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from speccatalog.workloads import WORKLOADS, prompt_cues
from specops_schemas.catalog import Fingerprint


@dataclass(frozen=True, slots=True)
class Question:
    name: str
    text: str
    choices: tuple[tuple[str, str], ...]
    """(value, label) of each answer."""


def _picks(question: str) -> dict[str, Fingerprint]:
    """The answers to `question` that pick a fingerprint (speccatalog's workload specs), by value."""
    return {
        spec.answer.value: Fingerprint(name)
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


def wizard(output: str, input: str, length: str) -> Fingerprint:
    """The fingerprint the three answers describe: the output format decides first (code and
    structured output draft alike whatever they read), then what the prompts carry and how long."""
    if output in _BY_OUTPUT:
        return _BY_OUTPUT[output]
    if length in _BY_LENGTH and input in _LONG_INPUTS:
        return _BY_LENGTH[length]
    return _BY_INPUT[input]


def wizard_table() -> dict[str, str]:
    """Every combination of answers -> its fingerprint, keyed `output/input/length` (the page's
    script looks the user's answers up in it)."""
    output, input, length = (tuple(value for value, _ in q.choices) for q in QUESTIONS)
    return {f"{o}/{i}/{n}": wizard(o, i, n) for o in output for i in input for n in length}


# A prompt this many characters long (about 8k tokens of English) counts as long context.
LONG_PROMPT_CHARS = 32_000
_CUES = tuple((Fingerprint(name), pattern) for name, pattern in prompt_cues())


def vote(prompt: str) -> Fingerprint:
    """The fingerprint one prompt looks like: long context by length, else the first cue found
    (in the order of _CUES: code and formats are the clearest signs), else chat."""
    if len(prompt) >= LONG_PROMPT_CHARS:
        return Fingerprint.LONG_CONTEXT
    for fingerprint, cue in _CUES:
        if cue.search(prompt):
            return fingerprint
    return Fingerprint.CHAT


@dataclass(frozen=True, slots=True)
class Inference:
    fingerprint: Fingerprint
    votes: dict[str, int]
    """How many prompts looked like each fingerprint."""


def split_prompts(text: str) -> list[str]:
    """Sample prompts pasted one per blank-line-separated block."""
    return [block.strip() for block in re.split(r"\n\s*\n", text) if block.strip()]


def infer(prompts: Iterable[str]) -> Inference | None:
    """The fingerprint most of the prompts look like (ties: the first in _CUES order), or None
    without a prompt."""
    votes = Counter(vote(prompt) for prompt in prompts)
    if not votes:
        return None
    order = [Fingerprint.LONG_CONTEXT, *(fingerprint for fingerprint, _ in _CUES), Fingerprint.CHAT]
    best = max(votes.values())
    winner = next(fingerprint for fingerprint in order if votes[fingerprint] == best)
    return Inference(winner, {str(fingerprint): count for fingerprint, count in votes.most_common()})
