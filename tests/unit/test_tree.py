"""Tree attention: who sees whom inside a verify block, and at which depth."""

from __future__ import annotations

import random

import pytest
import torch

from speccore.errors import SpecError
from speccore.heads.trees import DEFAULT_MEDUSA_CHOICES, medusa_tree, tree_parents
from speccore.tree import ancestor_mask, block_parents, chain_parents, children_lists, depths

#         0  (pending token, the root)
#        / \
#       1   2
#      / \   \
#     3   4   6
#     |
#     5
DRAFT_PARENTS = [-1, -1, 0, 0, 2, 1]  # parent of block node i+1, draft-relative (-1 = root)
BLOCK_PARENTS = [-1, 0, 0, 1, 1, 3, 2]
SEES = [{0}, {0, 1}, {0, 2}, {0, 1, 3}, {0, 1, 4}, {0, 1, 3, 5}, {0, 2, 6}]
DEPTHS = [0, 1, 1, 2, 2, 3, 2]


def _mask_of(sets: list[set[int]]) -> torch.Tensor:
    q = len(sets)
    return torch.tensor([[j in sets[i] for j in range(q)] for i in range(q)])


def test_block_parents_shift_draft_indices_and_hang_roots_off_the_pending_token() -> None:
    assert block_parents(torch.tensor([DRAFT_PARENTS])).tolist() == [BLOCK_PARENTS]


def test_ancestor_mask_of_a_hand_drawn_tree() -> None:
    mask = ancestor_mask(torch.tensor([BLOCK_PARENTS]))
    assert mask.dtype == torch.bool
    assert torch.equal(mask[0], _mask_of(SEES))
    assert depths(mask).tolist() == [DEPTHS]


def test_rows_of_a_batch_get_their_own_tree() -> None:
    chain = [-1, 0, 1, 2, 3, 4, 5]
    mask = ancestor_mask(torch.tensor([BLOCK_PARENTS, chain]))
    assert torch.equal(mask[0], _mask_of(SEES))
    assert torch.equal(mask[1], torch.tril(torch.ones(7, 7, dtype=torch.bool)))
    assert depths(mask).tolist() == [DEPTHS, list(range(7))]


def test_an_empty_draft_is_the_pending_token_alone() -> None:
    par = block_parents(torch.zeros(3, 0, dtype=torch.long))
    assert par.tolist() == [[-1], [-1], [-1]]
    mask = ancestor_mask(par)
    assert mask.tolist() == [[[True]]] * 3
    assert depths(mask).tolist() == [[0]] * 3


def test_a_chain_is_causal_attention() -> None:
    par = block_parents(chain_parents(2, 4))
    assert par.tolist() == [[-1, 0, 1, 2, 3]] * 2
    mask = ancestor_mask(par)
    assert torch.equal(mask, torch.tril(torch.ones(5, 5, dtype=torch.bool)).expand(2, 5, 5))
    assert depths(mask).tolist() == [[0, 1, 2, 3, 4]] * 2


def test_ancestor_mask_matches_walking_up_the_parents_on_random_trees() -> None:
    rng = random.Random(0)
    for _ in range(20):
        q = rng.randint(1, 12)
        par = [-1] + [rng.randrange(i) for i in range(1, q)]
        mask = ancestor_mask(torch.tensor([par]))[0]
        for i in range(q):
            line, node = set(), i
            while node >= 0:
                line.add(node)
                node = par[node]
            assert {j for j in range(q) if mask[i, j]} == line
            assert int(depths(mask[None])[0, i]) == len(line) - 1


def test_children_lists_in_node_order() -> None:
    assert children_lists(BLOCK_PARENTS) == [[1, 2], [3, 4], [6], [5], [], [], []]


def test_ancestor_mask_of_a_block_with_several_roots() -> None:
    # An EAGLE draft level: nodes 0-2 have no parent in the block; 3, 4 hang below 1, 5 below 3.
    par = torch.tensor([[-1, -1, -1, 1, 1, 3], [-1, 0, -1, 2, -1, 4]])
    mask = ancestor_mask(par)
    assert torch.equal(mask[0], _mask_of([{0}, {1}, {2}, {1, 3}, {1, 4}, {1, 3, 5}]))
    assert torch.equal(mask[1], _mask_of([{0}, {0, 1}, {2}, {2, 3}, {4}, {4, 5}]))
    assert depths(mask).tolist() == [[0, 0, 0, 1, 1, 2], [0, 1, 0, 1, 0, 1]]


def test_medusa_default_tree_is_a_tree_at_every_size() -> None:
    parents = tree_parents(list(DEFAULT_MEDUSA_CHOICES))
    for i, choice in enumerate(DEFAULT_MEDUSA_CHOICES):
        assert parents[i] == (DEFAULT_MEDUSA_CHOICES.index(choice[:-1]) if len(choice) > 1 else -1)
    two_heads = medusa_tree(DEFAULT_MEDUSA_CHOICES, num_heads=2, size=8)
    assert len(two_heads) == 8 and max(len(c) for c in two_heads) == 2
    tree_parents(two_heads)


@pytest.mark.parametrize(
    ("choices", "message"),
    [([(0, 0), (0,)], "before its parent"), ([(0,), (0,)], "listed twice"), ([(0,), (-1,)], "rank >= 0")],
)
def test_a_choice_list_that_is_not_a_tree_is_refused(choices, message) -> None:
    with pytest.raises(SpecError, match=message):
        tree_parents(choices)
