"""Static tree shapes: (4, 2, 1) is 4 children of the pending token, 2 below each, 1 below each."""

from __future__ import annotations


def shape_nodes(shape: tuple[int, ...] | list[int]) -> int:
    """Nodes of a tree where every node at depth d has shape[d] children: (4, 2) -> 4 + 8."""
    total, width = 0, 1
    for children in shape:
        width *= children
        total += width
    return total


# Static trees the catalog offers head families: (2, 1, 1) has 6 nodes, what a CPU
# verifies at little more than one token's cost (speccore); the larger ones pay on GPUs.
CATALOG_TREES: tuple[tuple[int, ...], ...] = ((2, 1, 1), (4, 2, 1), (4, 2, 2, 1, 1))
