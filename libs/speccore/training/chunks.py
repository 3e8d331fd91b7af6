"""Training data written in resumable chunks: for self-distilled data sets too large for one
sitting (a million reply tokens is hours of CPU decoding, minutes on a GPU).

A chunk directory holds ``heldout.jsonl`` (the held-out side, written first), the training
side in ``train-00000.jsonl``, ``train-00001.jsonl``, ... of ``chunk_examples`` examples
each, and ``manifest.json``: the plan that made them (target, source limit and seed,
split, reply length) and, per finished file, its examples, reply tokens, sha256 and where
it was decoded (a directory may be resumed on another machine). Each
file is written whole (temp file and rename) and then entered in the manifest, so a run
killed at any point resumes at the first file the manifest lacks; a run with another plan
is refused rather than mixing two data sets. The files are the seed's JSONL
(speccore.training.data), so they can be concatenated, committed and trained on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from speccore.errors import SpecError
from speccore.files import atomic_write
from speccore.split import is_heldout
from speccore.training.data import Example, Regenerate, self_distill, write_examples

MANIFEST = "manifest.json"
HELDOUT = "heldout.jsonl"


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """What a chunk directory is made of; a resumed run must have the same."""

    target: str
    limit: int | None  # source examples taken before the split; None: every one
    seed: int
    heldout_fraction: float
    max_new_tokens: int | None  # None: the source's completions, not self-distilled
    max_prompt_tokens: int
    chunk_examples: int


@dataclass(frozen=True, slots=True)
class ChunkFile:
    file: str
    examples: int
    reply_tokens: int  # completion tokens the target generated (0 when not self-distilled)
    sha256: str
    made_on: str  # where the target decoded it, e.g. "cuda (NVIDIA H200) float32"


def train_name(index: int) -> str:
    return f"train-{index:05d}.jsonl"


def chunk_slices(total: int, size: int) -> list[range]:
    """The index ranges of ``total`` examples in chunks of ``size`` (the last may be short)."""
    if size <= 0:
        raise SpecError(f"chunk size must be positive, got {size}")
    return [range(start, min(start + size, total)) for start in range(0, total, size)]


class ChunkStore:
    """A chunk directory: its plan and the files already finished."""

    def __init__(self, root: Path, plan: ChunkPlan, made_on: str) -> None:
        self.root = root
        self.plan = plan
        self.made_on = made_on
        self.files: dict[str, ChunkFile] = {}
        path = root / MANIFEST
        if path.exists():
            manifest = json.loads(path.read_text())
            if manifest["plan"] != asdict(plan):
                raise SpecError(
                    f"{root} holds chunks of another plan ({manifest['plan']}); "
                    f"this run's is {asdict(plan)}: use another directory"
                )
            self.files = {f["file"]: ChunkFile(**f) for f in manifest["files"]}

    def done(self, name: str) -> bool:
        """Whether ``name`` is finished: in the manifest, and the file on disk is what it lists."""
        entry = self.files.get(name)
        path = self.root / name
        return entry is not None and path.exists() and _sha256(path) == entry.sha256

    def write(self, name: str, examples: list[Example], reply_tokens: int) -> ChunkFile:
        """Write a file whole, then enter it in the manifest."""
        path = self.root / name
        count = write_examples(path, examples)
        entry = ChunkFile(name, count, reply_tokens, _sha256(path), self.made_on)
        self.files[name] = entry
        manifest: dict[str, Any] = {
            "plan": asdict(self.plan),
            "files": [asdict(f) for f in sorted(self.files.values(), key=lambda f: f.file)],
            "reply_tokens": sum(f.reply_tokens for f in self.files.values()),
        }
        with atomic_write(self.root / MANIFEST) as tmp:
            tmp.write_text(json.dumps(manifest, indent=1) + "\n")
        return entry


Distill = Callable[[list[Example]], tuple[list[Example], int]]


def chunk_jobs(plan: ChunkPlan, examples: Sequence[Example]) -> list[tuple[str, list[Example]]]:
    """(file name, its examples): the held-out side, then the training side in chunks."""
    heldout = [ex for ex in examples if is_heldout(ex.prompt, plan.heldout_fraction)]
    train = [ex for ex in examples if not is_heldout(ex.prompt, plan.heldout_fraction)]
    chunks = chunk_slices(len(train), plan.chunk_examples)
    return [(HELDOUT, heldout)] + [(train_name(i), train[r.start : r.stop]) for i, r in enumerate(chunks)]


def write_chunks(
    store: ChunkStore,
    jobs: list[tuple[str, list[Example]]],
    distill: Distill | None,
    progress: Callable[[ChunkFile], None] = lambda _: None,
) -> list[ChunkFile]:
    """Write every file of ``jobs`` (chunk_jobs) the store lacks; ``distill`` replaces the
    completions with the target's (and counts its reply tokens), or None keeps them."""
    written = []
    for name, rows in jobs:
        if store.done(name):
            continue
        out, tokens = distill(rows) if distill is not None else (rows, 0)
        entry = store.write(name, out, tokens)
        progress(entry)
        written.append(entry)
    return written


def distiller(tokenizer: Any, regenerate: Regenerate, batch_size: int) -> Distill:
    """The target's replies to a chunk's prompts, and how many tokens it generated."""

    def distill(rows: list[Example]) -> tuple[list[Example], int]:
        tokens = 0

        def counting(batch: list[list[int]]) -> list[list[int]]:
            nonlocal tokens
            outputs = regenerate(batch)
            tokens += sum(len(o) for o in outputs)
            return outputs

        return list(self_distill(rows, tokenizer, counting, batch_size)), tokens

    return distill


def chunk_files(root: Path) -> tuple[list[Path], Path]:
    """A chunk directory's training files (in order) and its held-out file, each checked
    against the manifest; SpecError when the manifest is missing or a file differs."""
    path = root / MANIFEST
    if not path.is_file():
        raise SpecError(f"{root} is not a chunk directory: it has no {MANIFEST} (see `specops heads data`)")
    entries = {f["file"]: f for f in json.loads(path.read_text())["files"]}
    if HELDOUT not in entries:
        raise SpecError(f"{root}: the manifest lists no {HELDOUT}")
    for name, entry in entries.items():
        if not (root / name).is_file() or _sha256(root / name) != entry["sha256"]:
            raise SpecError(f"{root / name} is missing or differs from {path} (sha256 {entry['sha256']})")
    train = sorted(name for name in entries if name != HELDOUT)
    if not train:
        raise SpecError(f"{root}: the manifest lists no training file yet")
    return [root / name for name in train], root / HELDOUT


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
