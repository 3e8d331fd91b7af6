"""Static candidate trees for Medusa heads (Cai et al. 2024, arXiv 2401.10774, §2.1.2).

A tree is a list of choices. Choice (r_0, ..., r_d) is the node at depth d whose
token is the rank-r_d prediction of head d, below the node (r_0, ..., r_{d-1}); head
0 predicts the token after the pending one. Every choice's prefix comes before it,
so a leading slice of a tree is a tree.
"""

from __future__ import annotations

import itertools

from speccore.errors import SpecError

Choice = tuple[int, ...]

# Ordered by how likely a node is to be reached with heads of typical accuracy (top
# ranks and shallow nodes first); the proposer keeps a leading slice of it.
DEFAULT_MEDUSA_CHOICES: tuple[Choice, ...] = (
    (0,), (1,), (0, 0), (2,), (0, 1), (1, 0), (0, 0, 0), (3,),
    (0, 2), (2, 0), (0, 0, 1), (1, 1), (0, 1, 0), (0, 0, 0, 0), (4,), (0, 3),
    (1, 0, 0), (0, 0, 2), (3, 0), (0, 1, 1), (0, 0, 0, 1), (2, 1), (1, 2), (0, 0, 1, 0),
    (5,), (0, 2, 0), (4, 0), (0, 4), (1, 0, 1), (2, 0, 0), (0, 0, 0, 2), (1, 1, 0),
)  # fmt: skip


def tree_parents(choices: list[Choice]) -> list[int]:
    """Draft-relative parent of every choice (-1 = the pending token); a clear error for a
    list that is not a tree (a choice before its parent, a repeat, a negative rank)."""
    index: dict[Choice, int] = {}
    parents = []
    for i, choice in enumerate(choices):
        if not choice or min(choice) < 0:
            raise SpecError(f"bad tree choice {choice}: it needs one rank >= 0 per depth")
        if choice in index:
            raise SpecError(f"tree choice {choice} is listed twice")
        parent = choice[:-1]
        if parent and parent not in index:
            raise SpecError(f"tree choice {choice} comes before its parent {parent}")
        parents.append(index[parent] if parent else -1)
        index[choice] = i
    return parents


def medusa_tree(choices: tuple[Choice, ...], num_heads: int, size: int | None = None) -> list[Choice]:
    """The choices no deeper than the heads reach, the first ``size`` of them if given."""
    kept = [c for c in choices if len(c) <= num_heads]
    return kept[:size] if size is not None else kept


def shape_choices(shape: tuple[int, ...]) -> list[Choice]:
    """The full tree of a shape, parents first: (2, 1) -> (0,), (1,), (0, 0), (1, 0)."""
    return [
        choice
        for depth in range(1, len(shape) + 1)
        for choice in itertools.product(*(range(width) for width in shape[:depth]))
    ]
