"""Tree attention for a block of candidate tokens.

A block is the pending token (the root, index 0) followed by n draft nodes; node
i+1's parent is ``parents[i]`` (-1 means the root). Every node attends to the
committed context plus its own ancestors, and sits at position
``committed_length + depth``. A chain is the tree whose parents are i-1.
"""

from __future__ import annotations

import torch


def block_parents(parents: torch.Tensor) -> torch.Tensor:
    """Parents of every block node, root included.

    parents: [batch, n] draft-relative parents (-1 = root); returns [batch, n+1]
    block-relative parents (root's own parent is -1).
    """
    root = torch.full((parents.shape[0], 1), -1, dtype=parents.dtype)
    return torch.cat([root, torch.where(parents < 0, 0, parents + 1)], dim=1)


def ancestor_mask(block_par: torch.Tensor) -> torch.Tensor:
    """[batch, q, q] bool: node i may attend to node j (j is i or an ancestor of i).

    Parents precede their children; any node may be a root (parent -1), so a block
    may hold several trees (an EAGLE draft level has no parent inside its block).
    """
    batch, q = block_par.shape
    if torch.equal(block_par, torch.arange(-1, q - 1).expand(batch, q)):  # chains: the causal mask
        return torch.tril(torch.ones(q, q, dtype=torch.bool)).expand(batch, q, q).clone()
    mask = torch.eye(q, dtype=torch.bool).expand(batch, q, q).clone()
    rows = torch.arange(batch)
    for i in range(1, q):
        parent = block_par[:, i]
        mask[rows, i] |= mask[rows, parent.clamp(min=0)] & (parent >= 0)[:, None]
    return mask


def depths(mask: torch.Tensor) -> torch.Tensor:
    """[batch, q] depth of every node below the root (root = 0)."""
    return mask.sum(-1) - 1


def chain_parents(batch: int, n: int) -> torch.Tensor:
    """[batch, n] draft-relative parents of a chain of n drafts."""
    return (torch.arange(n) - 1).expand(batch, n).clone()


def children_lists(block_par: list[int]) -> list[list[int]]:
    """Children of every block node of one row, in node order."""
    kids: list[list[int]] = [[] for _ in block_par]
    for node, parent in enumerate(block_par):
        if parent >= 0:
            kids[parent].append(node)
    return kids
