"""Token-level retrieval datastore for the ``rest`` family (He et al. 2023, arXiv:2311.08252).

A corpus is tokenized with the target's tokenizer, its documents are joined with
a separator (``SEPARATOR``, never a real token id, so no match or continuation
crosses a document boundary), and a suffix array indexes every position. A
lookup finds the longest suffix of the context that occurs in the corpus and
returns the token sequences that followed it, most frequent first.

Corpus formats:

- a directory: every file under it matching ``pattern`` (default: all files;
  hidden ones, ``__pycache__`` and any path component matching an ``exclude``
  glob skipped) is one document, except ``*.jsonl`` files, which are read as
  below;
- a ``.jsonl`` file: one JSON object per line; its ``"text"``, else its
  ``"completion"`` (after ``"prompt"`` when present), else the string contents
  of its ``"conversations"`` / ``"messages"`` list is one document;
- a ``.txt`` / ``.md`` file: one document per blank-line-separated block (with
  ``paragraphs=False``: the whole file, as an uploaded text corpus is read);
- any other file: the whole file is one document.
"""

from __future__ import annotations

import bisect
import fnmatch
import hashlib
import json
import re
import sys
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from speccore.errors import SpecError
from speccore.files import atomic_write

FORMAT_VERSION = 1
SEPARATOR = -1
# A lookup reads at most this many occurrences of the matched suffix; past it the
# occurrences are sampled evenly across the suffix-array range. That range is
# sorted by what follows the suffix, so an even sample keeps the frequencies.
MAX_SCAN = 4096
_BLOCK_SPLIT = re.compile(r"\n[ \t]*\n+")
_PARAGRAPH_SUFFIXES = {".txt", ".md"}
_TOKENIZE_BATCH_CHARS = 4_000_000


@dataclass(slots=True)
class Datastore:
    """Tokens of a corpus and their suffix array."""

    tokens: np.ndarray  # [n] int32 token ids, SEPARATOR between documents and at the end
    suffixes: np.ndarray  # [n] int32 start positions, suffixes in lexicographic order
    vocab_hash: str  # vocab_fingerprint() of the tokenizer that produced ``tokens``
    meta: dict[str, Any]  # provenance: corpus path, n_docs, n_tokens, ...

    @property
    def nbytes(self) -> int:
        return int(self.tokens.nbytes + self.suffixes.nbytes)

    @classmethod
    def load(cls, path: str | Path) -> Datastore:
        path = Path(path)
        if not path.is_file():
            raise SpecError(f"datastore {path} does not exist")
        try:
            with np.load(path, allow_pickle=False) as npz:
                tokens = npz["tokens"]
                suffixes = npz["suffixes"]
                vocab_hash = str(npz["vocab_hash"])
                meta = json.loads(str(npz["meta"]))
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
            raise SpecError(f"datastore {path} is unreadable or corrupt ({exc}); rebuild it") from exc
        if not _well_formed(tokens, suffixes, meta):
            raise SpecError(f"datastore {path} is corrupt or from another speccore version; rebuild it")
        return cls(tokens, suffixes, vocab_hash, meta)

    def save(self, path: str | Path) -> None:
        with atomic_write(Path(path)) as tmp, tmp.open("wb") as f:
            np.savez(
                f,
                tokens=self.tokens,
                suffixes=self.suffixes,
                vocab_hash=np.array(self.vocab_hash),
                meta=np.array(json.dumps(self.meta, sort_keys=True)),
            )

    def continuations(
        self, context: Sequence[int], max_suffix: int, min_suffix: int, max_matches: int, depth: int
    ) -> list[tuple[list[int], int]]:
        """Token sequences that followed the longest matching suffix of ``context``.

        Tries context suffixes of length ``max_suffix`` down to ``min_suffix`` and
        keeps the longest that occurs. Returns up to ``max_matches`` distinct
        continuations (each 1..``depth`` tokens; shorter only where a document
        ends) with their occurrence counts, most frequent first.
        """
        if depth <= 0 or max_matches <= 0:
            return []
        longest = min(max_suffix, len(context))
        lo_len, found = max(min_suffix, 1), None
        # A match of length m implies matches of every shorter length, so binary-search m.
        hi_len = longest
        while lo_len <= hi_len:
            m = (lo_len + hi_len) // 2
            span = self._find([int(t) for t in context[len(context) - m :]])
            if span[0] < span[1]:
                found, lo_len = (m, span), m + 1
            else:
                hi_len = m - 1
        if found is None:
            return []
        m, (lo, hi) = found
        return self._following(lo, hi, m, max_matches, depth)

    def _find(self, query: list[int]) -> tuple[int, int]:
        """[lo, hi) range of the suffix array whose suffixes start with ``query``."""
        tokens, m = self.tokens, len(query)

        def prefix(start: int) -> list[int]:
            return tokens[start : start + m].tolist()

        lo = bisect.bisect_left(self.suffixes, query, key=prefix)
        hi = bisect.bisect_right(self.suffixes, query, lo=lo, key=prefix)
        return lo, hi

    def _following(
        self, lo: int, hi: int, m: int, max_matches: int, depth: int
    ) -> list[tuple[list[int], int]]:
        total = hi - lo
        picks = lo + (np.arange(min(total, MAX_SCAN), dtype=np.int64) * total) // min(total, MAX_SCAN)
        starts = self.suffixes[picks].astype(np.int64) + m
        # The corpus ends with a separator, so clipping reads only separators past the end.
        idx = np.minimum(starts[:, None] + np.arange(depth), len(self.tokens) - 1)
        windows = self.tokens[idx]  # [scanned, depth]
        ended = np.cumsum(windows == SEPARATOR, axis=1) > 0
        windows[ended] = SEPARATOR
        windows = windows[windows[:, 0] != SEPARATOR]
        if len(windows) == 0:
            return []
        distinct, counts = np.unique(windows, axis=0, return_counts=True)
        scale = total / len(picks)
        order = np.lexsort((np.arange(len(counts)), -counts))[:max_matches]
        out = []
        for i in order:
            row = distinct[i]
            out.append((row[row != SEPARATOR].tolist(), max(1, round(int(counts[i]) * scale))))
        return out


def _well_formed(tokens: np.ndarray, suffixes: np.ndarray, meta: Any) -> bool:
    return (
        isinstance(meta, dict)
        and meta.get("format_version") == FORMAT_VERSION
        and tokens.ndim == 1
        and tokens.dtype == np.int32
        and suffixes.dtype == np.int32
        and suffixes.shape == tokens.shape
        and len(tokens) > 0
        and tokens[-1] == SEPARATOR
        and suffixes.min() >= 0
        and suffixes.max() < len(tokens)
    )


def vocab_fingerprint(tokenizer: Any) -> str:
    """sha256 of the tokenizer's (token, id) pairs: equal vocabularies, equal fingerprints."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Suffix array of ``tokens`` (SEPARATOR entries sort first, each as a distinct symbol).

    Prefix doubling that re-sorts only the groups still tied (Larsson & Sadakane
    1999): a suffix's rank is the first suffix-array slot of its group, so ranks
    of settled suffixes never change. O(n log n) per round, rounds = log2 of the
    longest repeat, and later rounds touch only the repeated regions.
    """
    n = len(tokens)
    if n >= 2**31 - 1:
        raise SpecError(f"corpus of {n} tokens is too large for an int32 suffix array")
    initial = tokens.astype(np.int64)
    separators = initial == SEPARATOR
    initial[separators] = np.arange(int(separators.sum())) - int(separators.sum())
    sa = np.argsort(initial)
    rank = np.empty(n, dtype=np.int64)
    rank[sa], active = _regroup(initial[sa], np.arange(n, dtype=np.int64))
    h = 1
    while len(active):
        members = sa[active]
        follow = members + h
        second = np.where(follow < n, rank[np.minimum(follow, n - 1)], -1)
        order = np.argsort(rank[members] * (n + 1) + second + 1)
        members = members[order]
        sa[active] = members
        group_key = rank[members] * (n + 1) + second[order] + 1
        rank[members], active = _regroup(group_key, active)
        h *= 2
    return sa.astype(np.int32)


def _regroup(keys: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group ranks for sorted ``keys`` occupying suffix-array ``slots``, and the slots still tied."""
    new_group = np.ones(len(keys), dtype=bool)
    new_group[1:] = keys[1:] != keys[:-1]
    group_start = np.flatnonzero(new_group)
    sizes = np.diff(np.append(group_start, len(keys)))
    ranks = slots[np.repeat(group_start, sizes)]
    tied = np.repeat(sizes > 1, sizes)
    return ranks, slots[tied]


def build_datastore(
    tokenizer: Any,
    corpus: str | Path,
    out: str | Path,
    *,
    pattern: str = "*",
    exclude: Sequence[str] = (),
    paragraphs: bool = True,
    progress: bool = True,
) -> Datastore:
    """Tokenize ``corpus`` (see the module docstring), index it and save it to ``out``."""
    corpus = Path(corpus)
    if not corpus.exists():
        raise SpecError(f"corpus {corpus} does not exist")
    started = time.perf_counter()
    docs = list(_documents(corpus, pattern, tuple(exclude), paragraphs=paragraphs))
    if not docs:
        raise SpecError(f"corpus {corpus} holds no documents (pattern {pattern!r})")
    pieces: list[np.ndarray] = []
    n_docs = 0
    bar = tqdm(
        total=sum(len(d) for d in docs),
        unit="char",
        unit_scale=True,
        desc="tokenize",
        disable=not progress,
        file=sys.stderr,
    )
    for batch in _batches(docs):
        ids = tokenizer(batch, add_special_tokens=False)["input_ids"]
        for doc_ids in ids:
            if doc_ids:
                pieces.append(np.asarray(doc_ids, dtype=np.int32))
                pieces.append(np.array([SEPARATOR], dtype=np.int32))
                n_docs += 1
        bar.update(sum(len(d) for d in batch))
    bar.close()
    if not pieces:
        raise SpecError(f"corpus {corpus} tokenized to nothing")
    tokens = np.concatenate(pieces)
    tokenized = time.perf_counter()
    if progress:
        print(f"indexing {len(tokens):,} tokens ...", file=sys.stderr)
    suffixes = suffix_array(tokens)
    meta = {
        "format_version": FORMAT_VERSION,
        "corpus": str(corpus.resolve()),
        "pattern": pattern,
        "exclude": list(exclude),
        "n_docs": n_docs,
        "n_tokens": int(len(tokens) - n_docs),
        "tokenizer": str(getattr(tokenizer, "name_or_path", "")),
    }
    store = Datastore(tokens, suffixes, vocab_fingerprint(tokenizer), meta)
    store.save(out)
    if progress:
        print(
            f"datastore {out}: {n_docs:,} docs, {meta['n_tokens']:,} tokens; "
            f"tokenize {tokenized - started:.1f}s, index {time.perf_counter() - tokenized:.1f}s",
            file=sys.stderr,
        )
    return store


def _batches(docs: list[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for doc in docs:
        batch.append(doc)
        size += len(doc)
        if size >= _TOKENIZE_BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _documents(
    corpus: Path, pattern: str, exclude: tuple[str, ...], *, paragraphs: bool = True
) -> Iterator[str]:
    skip = (".*", "__pycache__", *exclude)
    if corpus.is_dir():
        files = sorted(
            p
            for p in corpus.rglob(pattern)
            if p.is_file()
            and not any(fnmatch.fnmatch(part, glob) for part in p.relative_to(corpus).parts for glob in skip)
        )
        for path in files:
            if path.suffix == ".jsonl":
                yield from _jsonl_documents(path)
            else:
                text = _read_text(path, skip_binary=True)
                if text and text.strip():
                    yield text
    elif corpus.suffix == ".jsonl":
        yield from _jsonl_documents(corpus)
    else:
        text = _read_text(corpus, skip_binary=False) or ""
        if paragraphs and corpus.suffix in _PARAGRAPH_SUFFIXES:
            yield from (block for block in _BLOCK_SPLIT.split(text) if block.strip())
        elif text.strip():
            yield text


def _read_text(path: Path, *, skip_binary: bool) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        if skip_binary:
            return None
        raise SpecError(f"{path} is not UTF-8 text ({exc})") from exc


def _jsonl_documents(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SpecError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            doc = record_text(record)
            if doc is None:
                raise SpecError(
                    f'{path}:{lineno}: need an object with "text", "completion", '
                    f'or a "conversations"/"messages" list'
                )
            if doc.strip():
                yield doc


def record_text(record: Any) -> str | None:
    """The document of one JSONL record (see the module docstring), or None if it holds none."""
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("text"), str):
        return record["text"]
    if isinstance(record.get("completion"), str):
        prompt = record.get("prompt")
        return (prompt if isinstance(prompt, str) else "") + record["completion"]
    turns = record.get("conversations", record.get("messages"))
    if not isinstance(turns, list):
        return None
    parts = []
    for turn in turns:
        if isinstance(turn, str):
            parts.append(turn)
        elif isinstance(turn, dict):
            content = next(
                (turn[k] for k in ("content", "value", "text") if isinstance(turn.get(k), str)), None
            )
            parts.extend(
                [content] if content is not None else [v for v in turn.values() if isinstance(v, str)]
            )
    return "\n".join(parts)
