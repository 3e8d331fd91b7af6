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

from specops_schemas.catalog import Fingerprint


@dataclass(frozen=True, slots=True)
class Question:
    name: str
    text: str
    choices: tuple[tuple[str, str], ...]
    """(value, label) of each answer."""


QUESTIONS = (
    Question(
        "output",
        "What does the endpoint produce?",
        (
            ("text", "Prose or conversation"),
            ("code", "Source code"),
            ("structured", "JSON or another fixed format"),
        ),
    ),
    Question(
        "input",
        "What does a typical request carry?",
        (
            ("conversation", "A chat turn or short instruction"),
            ("documents", "Retrieved documents to answer from"),
            ("condense", "A text to summarize"),
            ("problem", "A problem to reason through step by step"),
            ("brief", "A creative brief (story, poem, copy)"),
        ),
    ),
    Question(
        "length",
        "How long are the prompts?",
        (("short", "Up to a few thousand tokens"), ("long", "Tens of thousands of tokens")),
    ),
)

_BY_INPUT = {
    "conversation": Fingerprint.CHAT,
    "documents": Fingerprint.RAG,
    "condense": Fingerprint.SUMMARIZATION,
    "problem": Fingerprint.REASONING,
    "brief": Fingerprint.CREATIVE,
}
# Long prompts dominate how a chat or retrieval endpoint behaves (the draft's context).
_LONG_INPUTS = frozenset({"conversation", "documents"})


def wizard(output: str, input: str, length: str) -> Fingerprint:
    """The fingerprint the three answers describe: the output format decides first (code and
    structured output draft alike whatever they read), then what the prompts carry and how long."""
    if output == "code":
        return Fingerprint.CODE
    if output == "structured":
        return Fingerprint.STRUCTURED
    if length == "long" and input in _LONG_INPUTS:
        return Fingerprint.LONG_CONTEXT
    return _BY_INPUT[input]


def wizard_table() -> dict[str, str]:
    """Every combination of answers -> its fingerprint, keyed `output/input/length` (the page's
    script looks the user's answers up in it)."""
    output, input, length = (tuple(value for value, _ in q.choices) for q in QUESTIONS)
    return {f"{o}/{i}/{n}": wizard(o, i, n).value for o in output for i in input for n in length}


# A prompt this many characters long (about 8k tokens of English) counts as long context.
LONG_PROMPT_CHARS = 32_000
_CUES: tuple[tuple[Fingerprint, re.Pattern[str]], ...] = (
    (
        Fingerprint.CODE,
        re.compile(r"```|\bdef |\bfunction\b|\bclass \w+|#include|\bimport \w+|=>|\breturn\b"),
    ),
    (Fingerprint.STRUCTURED, re.compile(r"\bjson\b|\byaml\b|\bschema\b|\bcsv\b|^\s*[{\[]", re.I | re.M)),
    (Fingerprint.SUMMARIZATION, re.compile(r"\bsummar|\btl;?dr\b|\bcondense\b|\bkey points\b", re.I)),
    (
        Fingerprint.RAG,
        re.compile(r"\bcontext:|\bdocuments?\b|\bbased on the (following|passage)|\bsources?:", re.I),
    ),
    (Fingerprint.REASONING, re.compile(r"step by step|\bprove\b|\bsolve\b|\bhow many\b|\bcalculate\b", re.I)),
    (Fingerprint.CREATIVE, re.compile(r"\bstory\b|\bpoem\b|\bimagine\b|\bslogan\b|\blyrics\b", re.I)),
)


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
    return Inference(winner, {fingerprint.value: count for fingerprint, count in votes.most_common()})
