"""Training data for learned drafts: read, convert, tokenize, split, self-distill.

The format is the seed's JSONL: one ``{"prompt": str, "completion": str}`` object a
line; blank lines are skipped. An optional string ``"id"`` (the converter writes
``"sharegpt:<conv id>"``) is kept for provenance; any other field is ignored, so files
written by other tools load as they are.

Held-out examples are chosen by a hash of the whitespace-normalized prompt, never
by position or seed: a prompt, and every duplicate of it, lands on the same side in
every run and every file.
"""

from __future__ import annotations

import heapq
import itertools
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from speccore.errors import SpecError
from speccore.files import atomic_write
from speccore.models import user_prompt_ids
from speccore.split import check_fraction, digest, is_heldout, prompt_digest

# a batch of prompt token ids (chat-rendered) -> the target's own output token ids for
# each; in practice one speccore Engine.generate call. Special tokens (EOS) are dropped.
Regenerate = Callable[[list[list[int]]], list[list[int]]]

Turn = tuple[str, str]  # (role: "user" | "assistant" | "system", text)

_FIELDS = ("prompt", "completion")
# ShareGPT splits long chats into parts "<conv>_<k>"; a later part's first turn lacks context.
_LATER_PART = re.compile(r"_[1-9]\d*$")


@dataclass(frozen=True, slots=True)
class Example:
    prompt: str  # one user turn, rendered as speccore.models.user_prompt_ids does when tokenized
    completion: str  # the reply the draft learns to predict
    id: str | None = None  # provenance, e.g. "sharegpt:<conv id>"


@dataclass(frozen=True, slots=True)
class TokenizedExample:
    input_ids: list[int]  # [seq] rendered prompt, completion tokens, eos; at most max_len
    loss_mask: list[bool]  # [seq] True where input_ids holds a completion token or that eos


def read_examples(path: Path) -> Iterator[Example]:
    """Stream the examples of a JSONL file; a bad line raises SpecError with ``path:line``."""
    for where, raw in _lines(path):
        yield _parse_line(raw, where)


def write_examples(path: Path, examples: Iterable[Example]) -> int:
    """Write ``examples`` as JSONL (via a temp file and rename); returns how many."""
    count = 0
    with atomic_write(path) as tmp, tmp.open("w", encoding="utf-8") as fp:
        for ex in examples:
            row = {"prompt": ex.prompt, "completion": ex.completion}
            if ex.id is not None:
                row["id"] = ex.id
            fp.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def first_exchanges(
    conversations: Iterable[tuple[str, list[Turn]]], limit: int | None, seed: int = 0
) -> list[Example]:
    """Up to ``limit`` first exchanges (first user turn, first reply to it) of (id, turns) conversations.

    Conversations without both, and later parts of split chats (``<id>_<k>``, k > 0), are
    skipped. The choice is the ``limit`` smallest hashes of (seed, conversation id), so
    it streams the conversations keeping only ``limit`` examples, and a larger limit
    extends a smaller one.
    """
    if limit is not None and limit <= 0:
        raise SpecError(f"limit must be positive or None, got {limit}")
    exchanges = (
        ex for conv_id, turns in conversations if (ex := _first_exchange(conv_id, turns)) is not None
    )

    def rank(ex: Example) -> bytes:
        return digest(f"{seed}:{ex.id}")

    if limit is None:
        return sorted(exchanges, key=rank)
    return heapq.nsmallest(limit, exchanges, key=rank)


def tokenize_example(
    tokenizer: PreTrainedTokenizerBase, example: Example, max_len: int, *, chat: bool = True
) -> TokenizedExample | None:
    """Prompt, completion and eos as token ids, with the completion part marked for the loss.

    The completion is cut at ``max_len`` tokens in all (its eos goes first); None when
    the prompt alone leaves no room for a completion token, as there is nothing to learn.
    """
    if max_len < 2:
        raise SpecError(f"max_len must be at least 2, got {max_len}")
    if tokenizer.eos_token_id is None:
        raise SpecError("the target's tokenizer has no eos token to end completions with")
    if chat:
        prompt = user_prompt_ids(tokenizer, example.prompt, "the target")
    else:
        prompt = list(tokenizer(example.prompt).input_ids)
    completion = [*tokenizer(example.completion, add_special_tokens=False).input_ids, tokenizer.eos_token_id]
    room = max_len - len(prompt)
    if room <= 0:
        return None
    completion = completion[:room]
    return TokenizedExample(
        input_ids=[*prompt, *completion], loss_mask=[False] * len(prompt) + [True] * len(completion)
    )


def split_jsonl(src: Path, train_out: Path, heldout_out: Path, fraction: float) -> tuple[int, int]:
    """Split ``src`` by :func:`is_heldout` into two JSONL files; returns (train, held-out) counts.

    Reads ``src`` twice, streaming, rather than holding it in memory.
    """
    check_fraction(fraction)  # before anything is written
    n_train = write_examples(train_out, (e for e in read_examples(src) if not is_heldout(e.prompt, fraction)))
    n_heldout = write_examples(heldout_out, (e for e in read_examples(src) if is_heldout(e.prompt, fraction)))
    return n_train, n_heldout


def check_disjoint(train: Path, heldout: Path) -> None:
    """Raise SpecError naming both lines when a held-out prompt also appears in training."""
    seen: dict[bytes, str] = {}
    for where, raw in _lines(train):
        seen.setdefault(prompt_digest(_parse_line(raw, where).prompt), where)
    for where, raw in _lines(heldout):
        also = seen.get(prompt_digest(_parse_line(raw, where).prompt))
        if also is not None:
            raise SpecError(f"{where}: prompt is also in the training data at {also}")


def self_distill(
    examples: Iterable[Example],
    tokenizer: PreTrainedTokenizerBase,
    regenerate: Regenerate,
    batch_size: int = 16,
) -> Iterator[Example]:
    """Replace each completion with the target's own reply to the (chat-rendered) prompt.

    EAGLE and SpecForge train on the target's outputs so the draft learns what the
    target says, not what another model said. Prompts go to ``regenerate`` in
    batches of ``batch_size``; empty replies are dropped.
    """
    if batch_size <= 0:
        raise SpecError(f"batch_size must be positive, got {batch_size}")
    it = iter(examples)
    while batch := list(itertools.islice(it, batch_size)):
        outputs = regenerate([user_prompt_ids(tokenizer, ex.prompt, "the target") for ex in batch])
        for ex, output in zip(batch, outputs, strict=True):
            text = str(tokenizer.decode(output, skip_special_tokens=True)).strip()
            if text:
                yield Example(prompt=ex.prompt, completion=text, id=ex.id)


def _lines(path: Path) -> Iterator[tuple[str, bytes]]:
    """("path:line", raw bytes) of each non-blank line, streamed; bytes so bad UTF-8 gets a line."""
    try:
        fp = path.open("rb")
    except OSError as err:
        raise SpecError(f"cannot read training data {path}: {err.strerror}") from None
    with fp:
        for line_no, raw in enumerate(fp, start=1):
            if raw.strip():
                yield f"{path}:{line_no}", raw


def _parse_line(raw: bytes, where: str) -> Example:
    try:
        row = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SpecError(f"{where}: not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise SpecError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(row, dict):
        raise SpecError(
            f'{where}: expected an object with "prompt" and "completion", got {type(row).__name__}'
        )
    for field in _FIELDS:
        if field not in row:
            raise SpecError(f'{where}: "{field}" is missing')
        value = row[field]
        if not isinstance(value, str) or not value.strip():
            raise SpecError(f'{where}: "{field}" must be a non-empty string, got {json.dumps(value)[:40]}')
    conv_id = row.get("id")
    if conv_id is not None and not isinstance(conv_id, str):
        raise SpecError(f'{where}: "id" must be a string when given, got {json.dumps(conv_id)[:40]}')
    return Example(prompt=row["prompt"], completion=row["completion"], id=conv_id)


def _first_exchange(conv_id: str, turns: list[Turn]) -> Example | None:
    if _LATER_PART.search(conv_id):
        return None
    roles = [role for role, _ in turns]
    if "user" not in roles:
        return None
    ask = roles.index("user")
    if "assistant" not in roles[ask:]:
        return None
    prompt = turns[ask][1].strip()
    completion = turns[roles.index("assistant", ask)][1].strip()
    return Example(prompt, completion, conv_id) if prompt and completion else None
