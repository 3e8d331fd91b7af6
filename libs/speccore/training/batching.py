"""Shuffled batches of whole sequences, bounded by a token count."""

from __future__ import annotations

import torch


def sequence_batches(lengths: list[int], batch_tokens: int, gen: torch.Generator) -> list[list[int]]:
    """Sequence indices in a random order drawn from ``gen``, cut into batches of at
    most ``batch_tokens`` tokens (a longer sequence gets a batch of its own)."""
    batches: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i in torch.randperm(len(lengths), generator=gen).tolist():
        if current and used + lengths[i] > batch_tokens:
            batches.append(current)
            current, used = [], 0
        current.append(i)
        used += lengths[i]
    if current:
        batches.append(current)
    return batches


def draft_index(draft_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[vocab] position of each token in the draft vocabulary, -100 (ignored) if absent."""
    index = torch.full((vocab_size,), -100, dtype=torch.long)
    index[draft_ids.cpu()] = torch.arange(len(draft_ids))  # labels are made on the CPU
    return index
