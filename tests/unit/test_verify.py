"""The verifier on hand-built logits: what is accepted, what comes next, and that
sampled verification reproduces the target distribution exactly."""

from __future__ import annotations

import pytest
import torch
from stats import chi_square_pvalue

import speccore.verify
from speccore.sampling import SamplingParams
from speccore.verify import Block, verify_block

V = 8  # vocabulary of the synthetic tests
GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=1.0)
ALPHA = 1e-3
DRAWS = 20_000


def _argmax_logits(argmax: list[list[int]], vocab: int = 10) -> torch.Tensor:
    """[batch, q, vocab] logits whose argmax at node i of row b is argmax[b][i]."""
    logits = torch.randn(len(argmax), len(argmax[0]), vocab, generator=torch.Generator().manual_seed(0))
    logits.scatter_(2, torch.tensor(argmax)[..., None], 10.0)
    return logits


def _greedy(
    tokens: list[list[int]],
    parents: list[list[int]],
    argmax: list[list[int]],
    acceptable: list[list[bool]] | None = None,
    active: list[bool] | None = None,
) -> tuple[list[list[int]], list[int]]:
    ok = torch.tensor(acceptable) if acceptable is not None else torch.tensor(parents) >= 0
    block = Block(tokens=torch.tensor(tokens), parents=torch.tensor(parents), acceptable=ok)
    verdict = verify_block(block, _argmax_logits(argmax), GREEDY, [None] * len(tokens), active=active)
    return verdict.accepted_nodes, verdict.next_tokens


CHAIN = [-1, 0, 1, 2]


@pytest.mark.parametrize(
    ("argmax", "path", "next_token"),
    [
        ([3, 4, 7, 1], [0, 1, 2], 7),  # third draft (5) differs from the target's 7
        ([3, 4, 5, 8], [0, 1, 2, 3], 8),  # all accepted: the bonus token is the argmax at the leaf
        ([6, 4, 5, 8], [0], 6),  # first draft rejected: the target's own token
    ],
)
def test_greedy_accepts_the_longest_matching_prefix(
    argmax: list[int], path: list[int], next_token: int
) -> None:
    assert _greedy([[9, 3, 4, 5]], [CHAIN], [argmax]) == ([path], [next_token])


def test_greedy_rows_are_verified_independently() -> None:
    paths, nexts = _greedy(
        [[9, 3, 4, 5], [9, 3, 4, 5], [2, 1, 1, 1]],
        [CHAIN] * 3,
        [[3, 4, 7, 1], [6, 4, 5, 8], [1, 1, 1, 0]],
    )
    assert paths == [[0, 1, 2], [0], [0, 1, 2, 3]]
    assert nexts == [7, 6, 0]


#       0 (9)
#      /     \
#   1 (3)   2 (4)
#     |       |
#   3 (6)   4 (6)
#             |
#           5 (2)
TREE_TOKENS = [9, 3, 4, 6, 6, 2]
TREE_PARENTS = [-1, 0, 0, 1, 2, 4]


def test_greedy_tree_follows_the_branch_that_matches() -> None:
    # The target picks 4 at the root (second branch), 6 below it, then 1 where the draft says 2.
    # Node 1's argmax (6) matches its child 3, which must not matter: node 1 was rejected.
    assert _greedy([TREE_TOKENS], [TREE_PARENTS], [[4, 6, 6, 0, 1, 0]]) == ([[0, 2, 4]], [1])


def test_greedy_tree_leaf_gives_the_bonus_token() -> None:
    assert _greedy([TREE_TOKENS], [TREE_PARENTS], [[3, 6, 0, 5, 0, 0]]) == ([[0, 1, 3]], [5])


def test_non_acceptable_nodes_are_never_accepted_even_when_they_match() -> None:
    tokens, argmax = [[9, 3, 4, 5]], [[3, 4, 5, 8]]
    assert _greedy(tokens, [CHAIN], argmax, [[False, False, True, True]]) == ([[0]], [3])
    assert _greedy(tokens, [CHAIN], argmax, [[False, True, False, True]]) == ([[0, 1]], [4])


def test_an_acceptable_sibling_is_found_behind_a_non_acceptable_twin() -> None:
    # Lookahead puts its Jacobi window (never acceptable) beside real guesses with the same token.
    tokens, parents = [[9, 3, 3, 5]], [[-1, 0, 0, 2]]
    assert _greedy(tokens, parents, [[3, 0, 5, 7]], [[False, False, True, True]]) == ([[0, 2, 3]], [7])


def test_inactive_rows_accept_nothing_and_leave_other_rows_alone() -> None:
    paths, _ = _greedy([[9, 3, 4, 5]] * 2, [CHAIN] * 2, [[3, 4, 5, 8]] * 2, active=[False, True])
    assert paths == [[0], [0, 1, 2, 3]]


# Sampled verification.


def _random_dist(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return (torch.randn(*shape, V, generator=gen) * 1.5).softmax(-1)


def _sampled_case(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chains of 3 drafts sampled from random q, with random target logits: (logits, tokens, parents, q)."""
    gen = torch.Generator().manual_seed(seed)
    q = _random_dist(gen, rows, 3)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(rows, 3)
    tokens = torch.cat([torch.zeros(rows, 1, dtype=torch.long), drafts], 1)
    logits = torch.randn(rows, 4, V, generator=gen)
    return logits, tokens, torch.tensor([CHAIN] * rows), q


def _verify_seeded(case: tuple[torch.Tensor, ...], seeds: list[int]) -> tuple[list[list[int]], list[int]]:
    logits, tokens, parents, q = case
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    block = Block(tokens=tokens, parents=parents, acceptable=parents >= 0, draft_probs=q)
    verdict = verify_block(block, logits, SAMPLED, gens)
    return verdict.accepted_nodes, verdict.next_tokens


def test_sampled_verification_is_reproducible_from_the_request_seeds() -> None:
    case = _sampled_case(rows=32, seed=0)
    torch.manual_seed(1)
    first = _verify_seeded(case, list(range(32)))
    torch.manual_seed(2)  # the global RNG must not matter
    assert _verify_seeded(case, list(range(32))) == first
    other = _verify_seeded(case, list(range(100, 132)))
    assert other != first  # ... while the request's own seed does


def _first_tokens(
    p: torch.Tensor, cand_q: torch.Tensor | None, cand_tokens: torch.Tensor, seed: int
) -> list[int]:
    """First emitted token of each row: the root has len(cand) children, the candidates.

    p: [V] target at the root; cand_q: [m, V] distribution each candidate was drawn
    from (None for deterministic drafts); cand_tokens: [rows, m].
    """
    rows, m = cand_tokens.shape
    tokens = torch.cat([torch.zeros(rows, 1, dtype=torch.long), cand_tokens], 1)
    logits = torch.zeros(rows, m + 1, V)
    logits[:, 0] = p.log()
    parents = torch.tensor([[-1] + [0] * m] * rows)
    draft_probs = cand_q.expand(rows, m, V) if cand_q is not None else None
    gen = torch.Generator().manual_seed(seed)
    block = Block(tokens=tokens, parents=parents, acceptable=parents >= 0, draft_probs=draft_probs)
    verdict = verify_block(block, logits, SAMPLED, [gen] * rows)
    return [
        row[path[1]] if len(path) > 1 else nxt
        for row, path, nxt in zip(tokens.tolist(), verdict.accepted_nodes, verdict.next_tokens, strict=True)
    ]


def _draws_with_sampled_drafts(seed: int, candidates: int) -> tuple[list[int], dict[int, float]]:
    gen = torch.Generator().manual_seed(seed)
    p, q = _random_dist(gen), _random_dist(gen)
    cand = torch.multinomial(q, DRAWS * candidates, replacement=True, generator=gen).reshape(
        DRAWS, candidates
    )
    return _first_tokens(p, q.expand(candidates, V), cand, seed + 1), dict(enumerate(p.tolist()))


def _draws_with_deterministic_siblings(seed: int) -> tuple[list[int], dict[int, float]]:
    gen = torch.Generator().manual_seed(seed)
    p, guess = _random_dist(gen), _random_dist(gen)
    # Two distinct candidates per row, guessed without the verifier's randomness (as n-gram/REST
    # drafts are): the verifier treats each as certain (a one-hot q).
    cand = torch.multinomial(guess.expand(DRAWS, V), 2, generator=gen)
    return _first_tokens(p, None, cand, seed + 1), dict(enumerate(p.tolist()))


CASES = {
    "sampled-draft": lambda seed: _draws_with_sampled_drafts(seed, candidates=1),
    "two-sampled-siblings": lambda seed: _draws_with_sampled_drafts(seed, candidates=2),
    "two-deterministic-siblings": _draws_with_deterministic_siblings,
}


@pytest.mark.parametrize("case", CASES)
def test_first_token_follows_the_target_distribution(case: str) -> None:
    draws, p = CASES[case](seed=11)
    assert chi_square_pvalue(draws, p) > ALPHA


def _always_accept(p: float, q: float) -> float:
    return 1.0


def _ignore_q(p: float, q: float) -> float:
    return min(1.0, p)


def _resample_target(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return p


BROKEN = {
    "always-accept": ("acceptance_probability", _always_accept),
    "ignore-how-the-draft-was-sampled": ("acceptance_probability", _ignore_q),
    "resample-target-after-rejection": ("residual", _resample_target),
}


@pytest.mark.parametrize(
    ("case", "rule"),
    [
        (case, rule)
        for case in ("sampled-draft", "two-deterministic-siblings")
        for rule in BROKEN
        # For a one-hot draft min(1, p/q) is min(1, p): that "broken" rule is the right one.
        if (case, rule) != ("two-deterministic-siblings", "ignore-how-the-draft-was-sampled")
    ],
)
def test_a_broken_rule_fails_the_same_test(case: str, rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(speccore.verify, *BROKEN[rule])
    draws, p = CASES[case](seed=11)
    assert chi_square_pvalue(draws, p) < ALPHA


def test_two_token_chain_follows_the_target_joint_distribution() -> None:
    """Token pairs (x, y) emitted through a sampled chain of 2 drafts follow p0(x) * p1(y | x).

    When the first draft is rejected, the second token is what the next step would
    sample from the target; the test draws it itself.
    """
    gen = torch.Generator().manual_seed(5)
    p0, p1 = _random_dist(gen), _random_dist(gen, V)  # p1[x]: target after x
    q0, q1 = _random_dist(gen), _random_dist(gen, V)  # draft after the pending token, after x
    d1 = torch.multinomial(q0, DRAWS, replacement=True, generator=gen)
    d2 = torch.multinomial(q1[d1], 1, generator=gen)[:, 0]
    tokens = torch.stack([torch.zeros(DRAWS, dtype=torch.long), d1, d2], 1)
    logits = torch.stack([p0.log().expand(DRAWS, V), p1[d1].log(), torch.zeros(DRAWS, V)], 1)
    draft_probs = torch.stack([q0.expand(DRAWS, V), q1[d1]], 1)
    parents = torch.tensor([[-1, 0, 1]] * DRAWS)
    block = Block(tokens=tokens, parents=parents, acceptable=parents >= 0, draft_probs=draft_probs)
    verdict = verify_block(block, logits, SAMPLED, [gen] * DRAWS)

    pairs = []
    for row, (path, nxt) in enumerate(zip(verdict.accepted_nodes, verdict.next_tokens, strict=True)):
        emitted = [int(tokens[row, n]) for n in path[1:]] + [nxt]
        if len(emitted) == 1:
            emitted.append(int(torch.multinomial(p1[emitted[0]], 1, generator=gen)))
        pairs.append(tuple(emitted[:2]))
    joint = {(x, y): float(p0[x] * p1[x, y]) for x in range(V) for y in range(V)}
    assert chi_square_pvalue(pairs, joint) > ALPHA


def test_chi_square_helper_rejects_impossible_draws_and_accepts_exact_ones() -> None:
    p = {0: 0.5, 1: 0.5}
    assert chi_square_pvalue([0, 1] * 50, p) > 0.99
    assert chi_square_pvalue([0, 1] * 50 + [2], p) == 0.0
    assert chi_square_pvalue([0] * 70 + [1] * 30, p) < ALPHA
