"""Selecting and joining per-row state, for continuous batching.

Rows leave a running batch when they finish and join it when admitted; every piece
of per-row state moves with them: the target's KV cache, and the proposer
attributes named in ``Proposer.row_state``. A piece of state is a list (one item
per row), a tensor with the batch first, a :class:`StaticKVCache`, or None (not
built yet: the rows it stands for have nothing to carry).
"""

from __future__ import annotations

from typing import Any

import torch

from speccore.kv_cache import StaticKVCache


def take(value: Any, rows: list[int]) -> Any:
    """The state of these rows only, in this order."""
    if value is None:
        return None
    if isinstance(value, StaticKVCache):
        return value.take(rows)
    if isinstance(value, torch.Tensor):
        return value[torch.tensor(rows, dtype=torch.long, device=value.device)]
    if isinstance(value, list):
        return [value[r] for r in rows]
    raise TypeError(f"no per-row selection for {type(value).__name__}")


def concat(first: Any, second: Any, first_rows: int, second_rows: int) -> Any:
    """``first``'s rows, then ``second``'s; a missing (None) side of a tensor is zeros,
    which the proposer never reads: its rows are marked not ready."""
    if first is None and second is None:
        return None
    if isinstance(first, StaticKVCache) or isinstance(second, StaticKVCache):
        if first is None or second is None:
            raise TypeError("a KV cache joins only another KV cache")
        return first.concat(second)
    if isinstance(first, torch.Tensor) or isinstance(second, torch.Tensor):
        like = first if isinstance(first, torch.Tensor) else second
        parts = [
            part if isinstance(part, torch.Tensor) else like.new_zeros((n, *like.shape[1:]))
            for part, n in ((first, first_rows), (second, second_rows))
        ]
        return torch.cat(parts)
    if isinstance(first, list) and isinstance(second, list):
        return first + second
    raise TypeError(f"no per-row join for {type(first).__name__} and {type(second).__name__}")


def snapshot(owner: object, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(owner, name) for name in names}


def restore(owner: object, state: dict[str, Any]) -> None:
    for name, value in state.items():
        setattr(owner, name, value)
