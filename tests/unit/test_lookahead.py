"""Lookahead proposer: tree layout, pool harvesting and window moves on hand-made outcomes."""

from __future__ import annotations

import pytest
import torch

from speccore.errors import SpecError
from speccore.proposers import make_proposer
from speccore.proposers.base import DraftTree, ProposerConfig, StepContext, StepOutcome
from speccore.proposers.lookahead import (
    LookaheadProposer,
    guess_trie,
    harvest,
    last_level_blocks,
    shift_window,
    window_parents,
)
from speccore.sampling import SamplingParams
from speccore.state import Sequence
from speccore.tree import ancestor_mask, block_parents, depths

VOCAB = 64
GREEDY = SamplingParams()


def make_seq(prompt: list[int], output: list[int], max_new: int = 100) -> Sequence:
    return Sequence(list(prompt), max_new, GREEDY, output_ids=list(output))


def ctx(batch: int) -> StepContext:
    return StepContext(sampling=GREEDY, generators=[None] * batch)


def paths(tree: DraftTree, row: int) -> list[list[int]]:
    """Token path from the root's first child down to every node of one row."""
    toks, pars = tree.tokens[row].tolist(), tree.parents[row].tolist()
    out = []
    for i in range(len(toks)):
        path, node = [], i
        while node >= 0:
            path.append(toks[node])
            node = pars[node]
        out.append(path[::-1])
    return out


def accepted_paths(tree: DraftTree, row: int) -> set[tuple[int, ...]]:
    acc = tree.acceptable[row].tolist()
    return {tuple(p) for p, a in zip(paths(tree, row), acc, strict=True) if a}


def outcome_for(tree: DraftTree, pending: list[int], argmax: dict[tuple[int, int], int]) -> StepOutcome:
    """Logits whose argmax at (row, block index) is argmax[...] (token 0 elsewhere); nothing accepted."""
    batch, q = tree.tokens.shape[0], tree.size + 1
    logits = torch.zeros(batch, q, VOCAB)
    logits[:, :, 0] = 0.5
    for (row, block), tok in argmax.items():
        logits[row, block, tok] = 1.0
    block = torch.cat([torch.tensor(pending)[:, None], tree.tokens], dim=1)
    return StepOutcome(
        block_tokens=block, logits=logits, accepted_nodes=[[0] for _ in range(batch)], next_tokens=[0] * batch
    )


def test_window_nodes_follow_the_jacobi_diagonals() -> None:
    width, ngram = 4, 4
    labels = [(0, c) for c in range(1, width)] + [(lv, c) for lv in range(1, ngram - 1) for c in range(width)]
    parents = window_parents(width, ngram)
    assert len(parents) == len(labels)
    for i, (level, col) in enumerate(labels):
        parent = labels[parents[i]] if parents[i] >= 0 else (0, 0)
        assert parents[i] < i
        assert parent == ((0, col - 1) if level == 0 else (level - 1, col))
    # levels[l][c] guesses offset c + l after the pending token, so it sits at that depth.
    d = depths(ancestor_mask(block_parents(torch.tensor([parents]))))[0, 1:].tolist()
    assert d == [col + level for level, col in labels]
    last = last_level_blocks(width, ngram)
    assert [labels[b - 1] for b in last] == [(ngram - 2, c) for c in range(width)]


def test_bigram_window_reads_the_level0_chain_and_root() -> None:
    assert window_parents(3, 2) == [-1, 0]
    assert last_level_blocks(3, 2) == [0, 1, 2]


def test_tree_is_well_formed_and_only_guesses_are_acceptable() -> None:
    cfg = ProposerConfig(knobs={"lookahead_window": 5, "lookahead_ngram": 4, "lookahead_guesses": 5})
    prop = LookaheadProposer(cfg)
    prompt = [1, 2, 3, 4, 9, 1, 2, 3, 5, 9, 1, 2, 7, 8, 9, 6]
    seqs = [make_seq(prompt, [1])]
    prop.start(seqs)
    tree = prop.propose(seqs, ctx(1))
    n_window = 4 + 2 * 5
    pars = tree.parents[0].tolist()
    assert all(-1 <= p < i for i, p in enumerate(pars))
    assert tree.acceptable[0, :n_window].tolist() == [False] * n_window
    assert tree.acceptable[0, n_window:].all()
    assert tree.tokens.dtype == torch.long and tree.parents.dtype == torch.long
    # The guesses continue the pending token (1) the way the prompt did, sharing prefixes.
    assert accepted_paths(tree, 0) == {(2,), (2, 3), (2, 3, 4), (2, 3, 5), (2, 7), (2, 7, 8)}
    assert tree.size == n_window + 6


def test_guess_trie_shares_prefixes_and_caps_depth() -> None:
    toks, pars = guess_trie([(5, 6, 7), (5, 6, 8), (9, 1, 2)], depth=2, first=10)
    assert toks == [5, 6, 9, 1]
    assert pars == [-1, 10, -1, 12]


def test_k_and_remaining_tokens_cap_the_guess_depth() -> None:
    prompt = [1, 2, 3, 4, 5]
    prop = LookaheadProposer(ProposerConfig(k=2, knobs={"lookahead_ngram": 4}))
    seqs = [make_seq(prompt, [1])]
    prop.start(seqs)
    assert accepted_paths(prop.propose(seqs, ctx(1)), 0) == {(2,), (2, 3)}

    prop = LookaheadProposer(ProposerConfig(knobs={"lookahead_ngram": 4}))
    seqs = [make_seq(prompt, [1], max_new=3)]  # room for one draft and the bonus token
    prop.start(seqs)
    assert accepted_paths(prop.propose(seqs, ctx(1)), 0) == {(2,)}


def test_finished_rows_get_nothing() -> None:
    prop = LookaheadProposer(ProposerConfig())
    seqs = [make_seq([1, 2, 3, 1], [2]), make_seq([1, 2, 3, 1], [2, 3, 1])]
    seqs[1].finished = True
    prop.start(seqs)
    tree = prop.propose(seqs, ctx(2))
    assert tree.size > 0
    assert not tree.acceptable[1].any()
    assert (tree.parents[1] == -1).all()


def test_first_step_drafts_after_the_prompts_last_token() -> None:
    prop = LookaheadProposer(ProposerConfig(knobs={"lookahead_ngram": 3}))
    seqs = [make_seq([4, 5, 6, 7, 4], [])]  # nothing emitted yet: the pending token is the prompt's last
    prop.start(seqs)
    tree = prop.propose(seqs, ctx(1))
    assert accepted_paths(tree, 0) == {(5,), (5, 6)}


def test_all_finished_batch_drafts_an_empty_tree() -> None:
    prop = LookaheadProposer(ProposerConfig())
    seqs = [make_seq([1, 2], [3])]
    prop.start(seqs)
    seqs[0].finished = True
    assert prop.propose(seqs, ctx(1)).size == 0


def test_observe_harvests_diagonal_ngrams_into_the_pool() -> None:
    width, ngram = 3, 3
    prop = LookaheadProposer(ProposerConfig(knobs={"lookahead_window": width, "lookahead_ngram": ngram}))
    prompt = [10, 11, 12, 13, 14, 15]
    seqs = [make_seq(prompt, [20])]
    prop.start(seqs)
    tree = prop.propose(seqs, ctx(1))
    toks = tree.tokens[0].tolist()
    level0 = [20] + toks[: width - 1]
    level1 = toks[width - 1 : 2 * width - 1]
    new = [40, 41, 42]
    last = last_level_blocks(width, ngram)
    outcome = outcome_for(tree, [20], {(0, b): t for b, t in zip(last, new, strict=True)})
    # Nothing accepted; the target's next token is level0[2], the key of the last diagonal.
    seqs[0].output_ids.append(level0[2])
    prop.observe(seqs, outcome)
    tree = prop.propose(seqs, ctx(1))
    assert (level1[2], 42) in accepted_paths(tree, 0)


def test_harvest_and_shift_keep_positions_aligned() -> None:
    levels = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]  # levels[l][c] guesses offset c + l
    new = [10, 11, 12]  # argmax after levels[2][c], so offset c + 3
    assert harvest(levels, new) == [(1, (4, 7, 10)), (2, (5, 8, 11)), (3, (6, 9, 12))]
    # One position later: offset o becomes o - 1, the old level l+1 column c lands on level l column c.
    assert shift_window(levels, new, pending=99) == [[99, 5, 6], [7, 8, 9], [10, 11, 12]]
    assert levels == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_emitted_text_feeds_the_pool() -> None:
    prop = LookaheadProposer(ProposerConfig(knobs={"lookahead_ngram": 3}))
    seqs = [make_seq([1, 2, 3], [30])]
    prop.start(seqs)
    tree = prop.propose(seqs, ctx(1))
    # Two drafted tokens were accepted: the engine emitted 31, 32 and the new pending 30.
    seqs[0].output_ids += [31, 32, 30]
    outcome = outcome_for(tree, [30], {})
    outcome.accepted_nodes = [[0, 1, 2]]
    prop.observe(seqs, outcome)
    tree = prop.propose(seqs, ctx(1))
    assert (31, 32) in accepted_paths(tree, 0)


def test_rows_are_matched_by_sequence_identity() -> None:
    prop = LookaheadProposer(ProposerConfig(knobs={"lookahead_ngram": 3}))
    prop.start([make_seq([1, 2, 3], [1])])
    fresh = [make_seq([5, 6, 7, 5], [6])]  # a new request in the same slot, without start()
    tree = prop.propose(fresh, ctx(1))
    assert accepted_paths(tree, 0) == {(7,), (7, 5)}


def test_bad_settings_are_refused() -> None:
    with pytest.raises(SpecError):
        LookaheadProposer(ProposerConfig(knobs={"lookahead_ngram": 1}))
    with pytest.raises(SpecError):
        LookaheadProposer(ProposerConfig(knobs={"lookahead_window": 0}))
    with pytest.raises(SpecError):
        LookaheadProposer(
            ProposerConfig(knobs={"lookahead_window": 20, "lookahead_ngram": 6, "lookahead_guesses": 10})
        )


def test_registered_and_memory_grows_with_the_pool() -> None:
    prop = make_proposer("lookahead", ProposerConfig(), None)  # type: ignore[arg-type]
    assert isinstance(prop, LookaheadProposer)
    prop.start([make_seq([1, 2, 3], [4])])
    small = prop.extra_memory_bytes()
    prop.start([make_seq(list(range(200)), [4])])
    assert prop.extra_memory_bytes() > small > 0


PATTERN = "apple banana cherry grape apple banana cherry grape apple banana cherry grape apple"


@pytest.mark.slow
def test_real_model_greedy_identity_and_acceptance(smollm) -> None:
    from speccore.engine import Engine, Request

    prompts = [
        smollm.encode_prompt(PATTERN, chat=False),
        smollm.encode_prompt("def fibonacci(n):\n    if n < 2:\n        return n\n", chat=False),
        smollm.encode_prompt("Name three colours.", chat=True),
    ]
    requests = [Request(p, 32) for p in prompts]
    reference = [g.token_ids for g in Engine(smollm, "none").generate(requests)]
    results = Engine(smollm, "lookahead", ProposerConfig(k=4)).generate(requests)
    assert [g.token_ids for g in results] == reference
    repetitive = results[0].metrics
    assert repetitive.accepted_tokens > 0
    assert repetitive.mean_acceptance_length > 1.5
