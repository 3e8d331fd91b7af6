"""Prompt sets of the six fingerprints derived from the packaged sources.

Nothing here is downloaded: every set is built deterministically from the same
ShareGPT, MT-Bench, HumanEval and MMLU files as ``chat`` and ``code``
(:mod:`specprompts.sources`).

- rag: a ShareGPT question after three retrieved passages; one is the assistant's
  real answer to it, the others answer other questions.
- summarization: a ShareGPT conversation, or one long answer, to summarise.
- structured: JSON answers and tool calls, each with the JSON Schema the reply
  must satisfy (:mod:`specprompts.structured`).
- reasoning: MMLU questions asked step by step, alternating with generated
  multi-step arithmetic word problems.
- creative: MT-Bench writing/roleplay questions, ShareGPT story and poem requests
  and generated story prompts; sampled hot (:mod:`speccatalog.workloads`).
- long_context: ShareGPT conversations concatenated up to a token budget, with a
  question about one of them at the end.

Selection works as in :mod:`specprompts.sources` (seeded shuffle, then exclusions, then
a prefix). A prompt built around a source item has the id ``<workload>:<source id>``
and its text depends only on that id (distractors and templates come from a
``Random`` seeded by it); long_context's text also depends on the token budget.
Source items used verbatim keep their own ids (creative's MT-Bench and ShareGPT
requests); generated ones are ``arithmetic:<i>`` and ``story:<i>``.
"""

from __future__ import annotations

import functools
import itertools
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from speccore.errors import SpecError
from specprompts.sources import (
    MIN_ASCII_RATIO,
    MMLURow,
    Prompt,
    check_n,
    interleave,
    mmlu_pool,
    mtbench_categories,
    mtbench_pool,
    seeded_shuffle,
    sharegpt_conversations,
    sharegpt_pool,
    take_prompts,
)
from specprompts.structured import structured_tasks

# The chat REST datastore is built from the first 4000 ShareGPT conversations
# (specprompts.corpora.CHAT_CONVERSATIONS); passages come from the ones after them, so
# REST never retrieves a measured passage verbatim.
DOCUMENT_SKIP = 4000
DOCUMENT_SCAN = 8000
QUESTION_CHARS = (16, 600)
ANSWER_CHARS = (200, 1500)
TRANSCRIPT_CHARS = 4000

RAG_PASSAGES = 3
SUMMARY_MIN_CHARS = 800
ARITHMETIC_PROBLEMS = 1000

# Default long_context budget: a 2048-token context less 256 new tokens. Without a
# tokenizer, tokens are estimated at 3 characters each, which overestimates English
# BPE (about 4), so the default prompts fit.
LONG_CONTEXT_TOKENS = 1792
# Stop filling once this few tokens are left or this many documents in a row did not fit.
LONG_CONTEXT_SLACK = 64
LONG_CONTEXT_MISSES = 40

_PART_SUFFIX = re.compile(r"_(\d+)$")
_TERMINAL = (".", "!", "?", ")", '"', "'", "```")


def derived_prompts(
    workload: str, n: int, seed: int = 0, *, exclude_ids: frozenset[str] = frozenset()
) -> list[Prompt]:
    """`n` prompts of one of the derived workloads (``sets.load_prompts`` dispatches here)."""
    builder = _BUILDERS.get(workload)
    if builder is None:
        raise SpecError(f"{workload!r} is not a derived workload; derived: {', '.join(DERIVED_WORKLOADS)}")
    return builder(n, seed, exclude_ids=exclude_ids)


RAG_INSTRUCTION = (
    "Answer the question using only the passages below. If they do not contain the answer, say so."
)


def rag_prompts(n: int, seed: int = 0, *, exclude_ids: frozenset[str] = frozenset()) -> list[Prompt]:
    """A question after RAG_PASSAGES passages, one of them the answer it really got."""
    docs = _select(documents(), "rag", n, seed, exclude_ids)
    return [_rag_prompt(doc) for doc in docs]


SUMMARY_TASKS = (
    "Summarize the following conversation between a user and an AI assistant in three sentences.",
    "List the main points of the following conversation as short bullet points.",
)
SUMMARY_ANSWER_TASKS = (
    "Write a one-paragraph summary of the following text.",
    "Summarize the following text in one sentence, then suggest a title for it.",
)


def summarization_prompts(
    n: int, seed: int = 0, *, exclude_ids: frozenset[str] = frozenset()
) -> list[Prompt]:
    """A conversation, or one long assistant answer, with an instruction to summarise it."""
    docs = _select(_summarizable(), "summarization", n, seed, exclude_ids)
    return [_summary_prompt(doc) for doc in docs]


@dataclass(frozen=True, slots=True)
class Document:
    id: str  # "sharegpt:<conv id>"
    question: str  # first user turn
    answer: str  # first assistant reply
    transcript: str  # "User: ...\n\nAssistant: ..." in whole turns, at most TRANSCRIPT_CHARS


@functools.cache
def documents() -> tuple[Document, ...]:
    """Conversations whose first exchange is a plain-text question and a mid-length answer."""
    docs: list[Document] = []
    conversations = itertools.islice(sharegpt_conversations(), DOCUMENT_SKIP, DOCUMENT_SKIP + DOCUMENT_SCAN)
    for conv_id, turns in conversations:
        part = _PART_SUFFIX.search(conv_id)
        if (part and part.group(1) != "0") or len(turns) < 2:
            continue
        (role_q, question), (role_a, answer) = turns[0], turns[1]
        question, answer = question.strip(), answer.strip()
        if role_q != "user" or role_a != "assistant":
            continue
        if not (_fits(question, QUESTION_CHARS) and _fits(answer, ANSWER_CHARS) and _complete(answer)):
            continue
        docs.append(Document(conv_id, question, answer, _transcript(turns)))
    if len(docs) < RAG_PASSAGES:
        raise SpecError(f"only {len(docs)} ShareGPT conversations are usable as documents")
    return tuple(docs)


@functools.cache
def _summarizable() -> tuple[Document, ...]:
    return tuple(d for d in documents() if len(d.transcript) >= SUMMARY_MIN_CHARS)


def _fits(text: str, bounds: tuple[int, int]) -> bool:
    low, high = bounds
    return low <= len(text) <= high and sum(c.isascii() for c in text) >= MIN_ASCII_RATIO * len(text)


def _complete(text: str) -> bool:
    # ShareGPT's split chats cut some replies mid-sentence; a passage should end like one.
    return text.endswith(_TERMINAL)


def _transcript(turns: Sequence[tuple[str, str]]) -> str:
    parts: list[str] = []
    size = 0
    for role, text in turns:
        part = f"{role.capitalize()}: {text.strip()}"
        if parts and size + len(part) > TRANSCRIPT_CHARS:
            break
        parts.append(part)
        size += len(part) + 2
    return "\n\n".join(parts)


def _rag_prompt(doc: Document) -> Prompt:
    pool = documents()
    rng = random.Random(f"rag:{doc.id}")
    passages = [doc.answer]
    while len(passages) < RAG_PASSAGES:
        other = pool[rng.randrange(len(pool))]
        if other.answer not in passages:
            passages.append(other.answer)
    rng.shuffle(passages)
    body = "\n\n".join(f"[Passage {i}]\n{text}" for i, text in enumerate(passages, 1))
    text = f"{RAG_INSTRUCTION}\n\n{body}\n\nQuestion: {doc.question}"
    return Prompt(id=f"rag:{doc.id}", text=text, chat=True, source="sharegpt")


def _summary_prompt(doc: Document) -> Prompt:
    rng = random.Random(f"summarization:{doc.id}")
    if len(doc.answer) >= SUMMARY_MIN_CHARS and rng.random() < 0.5:
        task, body = rng.choice(SUMMARY_ANSWER_TASKS), doc.answer
    else:
        task, body = rng.choice(SUMMARY_TASKS), doc.transcript
    text = f'{task}\n\n"""\n{body}\n"""'
    return Prompt(id=f"summarization:{doc.id}", text=text, chat=True, source="sharegpt")


# --- reasoning ---------------------------------------------------------------------


STEP_BY_STEP_CHOICE = "Think step by step, then finish with a line 'Answer: X', where X is A, B, C or D."
STEP_BY_STEP_NUMBER = "Think step by step, then give the final answer on the last line as 'Answer: <number>'."


def reasoning_prompts(n: int, seed: int = 0, *, exclude_ids: frozenset[str] = frozenset()) -> list[Prompt]:
    """MMLU questions and arithmetic word problems, alternating, each asked step by step."""
    check_n(n)
    mmlu = [_mmlu_prompt(q) for q in seeded_shuffle(mmlu_pool(), seed, "mmlu")]
    arithmetic = seeded_shuffle(_arithmetic_pool(), seed, "arithmetic")
    streams = [take_prompts(s, None, exclude_ids) for s in (mmlu, arithmetic)]
    return interleave(streams, n, "reasoning")


def _mmlu_prompt(q: MMLURow) -> Prompt:
    options = "\n".join(f"{letter}) {choice}" for letter, choice in zip("ABCD", q.choices, strict=True))
    text = (
        f"The following is a multiple-choice question about {q.subject}.\n\n"
        f"{q.question}\n{options}\n\n{STEP_BY_STEP_CHOICE}"
    )
    return Prompt(id=f"reasoning:{q.id}", text=text, chat=True, source="mmlu")


_NAMES = ("Maria", "Kenji", "Amara", "Lukas", "Priya", "Tom", "Sofia", "Omar")


@functools.cache
def _arithmetic_pool() -> tuple[Prompt, ...]:
    return tuple(_arithmetic_prompt(i) for i in range(ARITHMETIC_PROBLEMS))


def _arithmetic_prompt(i: int) -> Prompt:
    rng = random.Random(f"arithmetic:{i}")
    name = rng.choice(_NAMES)
    r = rng.randint
    templates = (
        lambda: (
            f"A bakery bakes {r(3, 9)} trays of {r(12, 24)} muffins every morning. It sells {r(20, 35)} "
            f"muffins before noon and {r(5, 15)} in the afternoon. How many muffins are left at the end of "
            "the day?"
        ),
        lambda: (
            f"{name} has ${r(50, 200)}. {name} buys {r(2, 6)} notebooks at ${r(2, 9)} each and a backpack "
            f"for ${r(15, 40)}, then receives ${r(10, 50)} as a gift. How many dollars does {name} have now?"
        ),
        lambda: (
            f"A train travels at {r(6, 12) * 10} km/h for {r(2, 5)} hours, then at {r(4, 9) * 10} km/h for "
            f"{r(1, 4) * 30} minutes. How many kilometres does it travel in total?"
        ),
        lambda: (
            f"A rectangle is {r(4, 30)} cm long and {r(2, 20)} cm wide. A square has the same perimeter "
            "as the rectangle. What is the area of the square in square centimetres?"
        ),
        lambda: (
            f"{name} is {r(10, 20)} years old. {name}'s sister is {r(2, 6)} years younger, and their "
            f"father is {r(3, 4)} times as old as the sister. How old will the father be in {r(2, 10)} years?"
        ),
        lambda: (
            f"A warehouse holds {r(100, 300)} boxes. Every day {r(20, 40)} boxes arrive and {r(10, 19)} are "
            f"shipped out. How many boxes does it hold after {r(3, 12)} days?"
        ),
    )
    question = rng.choice(templates)()
    return Prompt(
        id=f"arithmetic:{i}", text=f"{question}\n\n{STEP_BY_STEP_NUMBER}", chat=True, source="generated"
    )


# --- creative ------------------------------------------------------------------------


CREATIVE_CATEGORIES = frozenset({"writing", "roleplay"})
_CREATIVE_REQUEST = re.compile(
    r"\b(write|compose|create)\b[^.?!\n]{0,40}\b(story|stories|poem|song|lyrics|haiku|limerick|fairy tale"
    r"|fable|screenplay|sonnet|rap|ballad)\b|^tell me a (short )?story",
    re.IGNORECASE,
)
_GENRES = ("fantasy", "science-fiction", "mystery", "ghost", "fairy-tale", "adventure", "comic", "noir")
_HEROES = (
    "a retired lighthouse keeper",
    "a robot that collects lost socks",
    "a twelve-year-old chess champion",
    "a dragon afraid of heights",
    "a night-shift nurse",
    "a street musician",
    "a cartographer who maps dreams",
    "an elderly beekeeper",
)
_SETTINGS = (
    "a floating city",
    "a small fishing village in winter",
    "a generation ship between stars",
    "a library that never closes",
    "a desert train station",
    "an abandoned amusement park",
    "a rainforest research camp",
    "a Venetian palace during carnival",
)
_STYLES = (
    "Use vivid sensory detail.",
    "Tell it in the first person.",
    "End with an unexpected twist.",
    "Write it as a series of diary entries.",
    "Keep it under 300 words.",
    "Include a line of dialogue in every paragraph.",
)


def creative_prompts(n: int, seed: int = 0, *, exclude_ids: frozenset[str] = frozenset()) -> list[Prompt]:
    """MT-Bench writing/roleplay, ShareGPT story and poem requests and generated story prompts."""
    check_n(n)
    categories = mtbench_categories()
    mtbench = [p for p in mtbench_pool() if categories[p.id] in CREATIVE_CATEGORIES]
    sharegpt = [p for p in sharegpt_pool() if _CREATIVE_REQUEST.search(p.text)]
    streams = [
        take_prompts(seeded_shuffle(pool, seed, salt), None, exclude_ids)
        for pool, salt in ((mtbench, "mtbench"), (sharegpt, "sharegpt"), (_story_pool(), "story"))
    ]
    return interleave(streams, n, "creative")


@functools.cache
def _story_pool() -> tuple[Prompt, ...]:
    out: list[Prompt] = []
    for i, (genre, hero, setting) in enumerate(itertools.product(_GENRES, _HEROES, _SETTINGS)):
        style = random.Random(f"story:{i}").choice(_STYLES)
        text = f"Write a {genre} short story about {hero} in {setting}. {style}"
        out.append(Prompt(id=f"story:{i}", text=text, chat=True, source="generated"))
    return tuple(out)


# --- long context --------------------------------------------------------------------


LONG_CONTEXT_HEADER = "Read the documents below carefully; a question about them follows at the end."


def estimate_tokens(text: str) -> int:
    """A tokenizer-free upper estimate of a text's tokens (3 characters each)."""
    return len(text) // 3 + 1


def long_context_prompts(
    n: int,
    seed: int = 0,
    *,
    exclude_ids: frozenset[str] = frozenset(),
    max_tokens: int = LONG_CONTEXT_TOKENS,
    count_tokens: Callable[[str], int] = estimate_tokens,
) -> list[Prompt]:
    """Conversations concatenated to just under `max_tokens` (as `count_tokens` counts them).

    Each prompt asks about one anchor conversation, hidden at a random depth among
    fillers drawn in an order seeded by the anchor.
    """
    docs = _select(documents(), "long_context", n, seed, exclude_ids)
    return [_long_context_prompt(doc, max_tokens, count_tokens) for doc in docs]


def _long_context_prompt(anchor: Document, max_tokens: int, count: Callable[[str], int]) -> Prompt:
    pool = documents()
    rng = random.Random(f"long_context:{anchor.id}")
    chosen = [anchor]
    used = count(_long_context_text(chosen, 1))
    if used > max_tokens:
        raise SpecError(f"a long_context budget of {max_tokens} tokens cannot hold even one document")
    # What `count` adds to any text (a chat template, say) is paid once, not per document.
    overhead = count("")
    misses = 0
    for index in rng.sample(range(len(pool)), len(pool)):
        if max_tokens - used < LONG_CONTEXT_SLACK or misses >= LONG_CONTEXT_MISSES:
            break
        doc = pool[index]
        if doc.id == anchor.id:
            continue
        cost = count(f"### Document {len(chosen) + 1}\n{doc.transcript}\n\n") - overhead
        if used + cost > max_tokens:
            misses += 1
            continue
        chosen.append(doc)
        used += cost
        misses = 0
    rng.shuffle(chosen)
    target = chosen.index(anchor) + 1
    text = _long_context_text(chosen, target)
    # Piecewise counts can miss a few merges across boundaries: recheck the whole text.
    while count(text) > max_tokens and len(chosen) > 1:
        chosen.remove(next(d for d in reversed(chosen) if d is not anchor))
        target = chosen.index(anchor) + 1
        text = _long_context_text(chosen, target)
    return Prompt(id=f"long_context:{anchor.id}", text=text, chat=True, source="sharegpt")


def _long_context_text(docs: Sequence[Document], target: int) -> str:
    body = "".join(f"### Document {i}\n{d.transcript}\n\n" for i, d in enumerate(docs, 1))
    question = (
        f"Above are {len(docs)} documents, each a conversation between a user and an AI assistant. "
        f"In one sentence, what did the user ask for in document {target}? Then summarize the "
        "assistant's answer in two sentences."
    )
    return f"{LONG_CONTEXT_HEADER}\n\n{body}{question}"


# --- selection -------------------------------------------------------------------------


def _select(
    docs: Sequence[Document], workload: str, n: int, seed: int, exclude_ids: frozenset[str]
) -> list[Document]:
    """The first `n` items of a seeded shuffle whose derived ids are not excluded."""
    check_n(n)
    kept = [d for d in seeded_shuffle(docs, seed, workload) if f"{workload}:{d.id}" not in exclude_ids]
    if n > len(kept):
        raise SpecError(f"workload '{workload}' has {len(kept)} prompts after exclusions, asked for {n}")
    return kept[:n]


def _structured_prompts(n: int, seed: int = 0, *, exclude_ids: frozenset[str] = frozenset()) -> list[Prompt]:
    return [task.prompt for task in structured_tasks(n, seed, exclude_ids=exclude_ids)]


_BUILDERS: dict[str, Callable[..., list[Prompt]]] = {
    "rag": rag_prompts,
    "summarization": summarization_prompts,
    "structured": _structured_prompts,
    "reasoning": reasoning_prompts,
    "creative": creative_prompts,
    "long_context": long_context_prompts,
}
DERIVED_WORKLOADS = tuple(_BUILDERS)
