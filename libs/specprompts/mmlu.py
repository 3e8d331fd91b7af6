"""MMLU as the quality gate asks it: the question, the start of the reply, the answer read back.

Each question is asked zero-shot (as a chat turn where the model has a template) and
the reply is started with :data:`ANSWER_PREFIX`, which small instruct models otherwise
spend their first tokens on. The first standalone letter A-D of the reply is the
answer; none counts as wrong. The in-process gate (token ids on speccore) and the
benchmark-runner's evidence on engine servers (text over HTTP) ask the same way.
"""

from __future__ import annotations

import re

from specprompts.sources import MMLUQuestion

LETTERS = "ABCD"
ANSWER_PREFIX = "The correct answer is"
_ANSWER = re.compile(r"\b([ABCD])\b")


def question_text(q: MMLUQuestion) -> str:
    options = "\n".join(f"{letter}. {text}" for letter, text in zip(LETTERS, q["choices"], strict=True))
    return (
        f"The following is a multiple choice question about {q['subject']}.\n\n"
        f"{q['question']}\n{options}\nAnswer with the letter of the correct option."
    )


def parse_answer(text: str) -> int | None:
    """Index of the first standalone letter A-D in a reply, or None."""
    found = _ANSWER.search(text)
    return LETTERS.index(found.group(1)) if found else None
