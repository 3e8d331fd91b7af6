"""Training data for a target: prompt/reply examples, split, optionally self-distilled.

The held-out side is chosen by :func:`speccore.split.is_heldout`, so it
never overlaps training whatever the limit or seed. Self-distillation regenerates
every completion with the target (greedy, batched through the speccore engine), so
heads learn what this target says.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from speccore.engine import Engine, Request
from speccore.errors import SpecError
from speccore.models import LoadedModel, user_prompt_ids
from speccore.split import HELDOUT_FRACTION, is_heldout
from speccore.training.chunks import ChunkPlan, ChunkStore, chunk_jobs, distiller, write_chunks
from speccore.training.data import Example, Regenerate, self_distill, write_examples


@dataclass(frozen=True, slots=True)
class DataPlan:
    limit: int  # examples to take before the split (the caller's source, e.g. ShareGPT)
    heldout_fraction: float = HELDOUT_FRACTION
    seed: int = 0
    distill: bool = False
    max_new_tokens: int = 128
    max_prompt_tokens: int = 256  # longer prompts are skipped: they cost prefill, teach little
    batch_size: int = 16


def engine_regenerate(target: LoadedModel, max_new_tokens: int) -> Regenerate:
    """The target's own greedy replies, a padded batch per call."""
    engine = Engine(target, "none")

    def regenerate(batch: list[list[int]]) -> list[list[int]]:
        requests = [Request(prompt_ids=ids, max_new_tokens=max_new_tokens) for ids in batch]
        return [g.token_ids for g in engine.generate(requests)]

    return regenerate


# (limit, seed) -> up to `limit` examples, the same for the same seed (e.g. ShareGPT's).
Source = Callable[[int, int], Sequence[Example]]


def _examples(target: LoadedModel, plan: DataPlan, source: Source) -> list[Example]:
    """`source`'s examples whose rendered prompt (user_prompt_ids) fits `plan.max_prompt_tokens`."""
    if plan.limit <= 0:
        raise SpecError(f"limit must be positive, got {plan.limit}")
    return [
        ex
        for ex in source(plan.limit, plan.seed)
        if len(user_prompt_ids(target.tokenizer, ex.prompt, target.ref)) <= plan.max_prompt_tokens
    ]


def prepare(
    target: LoadedModel, plan: DataPlan, source: Source, train_out: Path, heldout_out: Path
) -> tuple[int, int]:
    """Write the train and held-out JSONL files of `source`'s examples; returns their counts."""
    examples = _examples(target, plan, source)
    train = [ex for ex in examples if not is_heldout(ex.prompt, plan.heldout_fraction)]
    heldout = [ex for ex in examples if is_heldout(ex.prompt, plan.heldout_fraction)]
    regenerate = engine_regenerate(target, plan.max_new_tokens) if plan.distill else None
    counts = []
    for rows, out, label in ((heldout, heldout_out, "held-out"), (train, train_out, "train")):
        if regenerate is None:
            counts.append(write_examples(out, rows))
            continue
        with tqdm(total=len(rows), desc=f"self-distilling {label}", unit="ex") as bar:
            counts.append(
                write_examples(
                    out, self_distill(rows, target.tokenizer, _ticking(regenerate, bar), plan.batch_size)
                )
            )
    return counts[1], counts[0]


def prepare_chunks(
    target: LoadedModel, plan: DataPlan, source: Source, out_dir: Path, chunk_examples: int
) -> ChunkStore:
    """Write `source`'s examples as a resumable chunk directory (speccore.training.chunks):
    the held-out file, then training chunks of `chunk_examples`; a rerun writes only what
    is missing."""
    chunk_plan = ChunkPlan(
        target=target.ref,
        limit=plan.limit,
        seed=plan.seed,
        heldout_fraction=plan.heldout_fraction,
        max_new_tokens=plan.max_new_tokens if plan.distill else None,
        max_prompt_tokens=plan.max_prompt_tokens,
        chunk_examples=chunk_examples,
    )
    store = ChunkStore(out_dir, chunk_plan, made_on=_made_on(target))
    examples = _examples(target, plan, source)
    distill = None
    if plan.distill:
        regenerate = engine_regenerate(target, plan.max_new_tokens)
        distill = distiller(target.tokenizer, regenerate, plan.batch_size)
    jobs = chunk_jobs(chunk_plan, examples)
    done = sum(store.done(name) for name, _ in jobs)
    with tqdm(total=len(jobs), initial=done, desc=f"chunks in {out_dir}", unit="file") as bar:
        write_chunks(store, jobs, distill, progress=lambda _: bar.update(1))
    return store


def _made_on(target: LoadedModel) -> str:
    device = target.device
    name = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    return f"{device.type}{name} {str(target.dtype).removeprefix('torch.')}"


def _ticking(regenerate: Regenerate, bar: tqdm) -> Regenerate:
    """``regenerate`` that moves ``bar`` by each batch (replies dropped as empty included)."""

    def run(batch: list[list[int]]) -> list[list[int]]:
        outputs = regenerate(batch)
        bar.update(len(batch))
        return outputs

    return run
