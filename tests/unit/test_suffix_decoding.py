"""Suffix decoding (speccore.suffix_tree, speccore.proposers.suffix): its drafts against a
direct implementation of the paper's algorithm (arXiv 2411.04975: count every pattern's
continuations, follow the most frequent, cut by match length and probability, keep the
best-scoring match), bounded memory, F-S1 (a tenant never drafts from another's outputs)
and the benchmark's fairness (a prompt never drafts from its own earlier output)."""

from __future__ import annotations

import gc
import random

import pytest

from speccore.bench import REP_SCOPE, WARMUP_SCOPE, Decoded, Schedule, bench_engine, engine_method, interleave
from speccore.draft_pool import DraftPools
from speccore.engine import Engine, Request
from speccore.proposers.base import ProposerConfig
from speccore.suffix_tree import ROOT, Draft, DraftRule, OutputTree, SuffixTree, merge
from specops_schemas.security import PolicySettings, SecurityTier
from specops_services.engine.security import SecurityPolicies

# --- the paper's algorithm, directly --------------------------------------------------------


class Reference:
    """Counts by scanning the sequences: count(x) = occurrences of x (|x| <= depth)."""

    def __init__(self, seqs: list[list[int]], depth: int) -> None:
        self.seqs, self.depth = seqs, depth
        # When each position was written: sequences were added whole, in order.
        self.time: dict[tuple[int, int], int] = {}
        clock = 0
        for s, seq in enumerate(seqs):
            for i in range(len(seq)):
                clock += 1
                self.time[(s, i)] = clock

    def ends(self, x: list[int]) -> list[tuple[int, int]]:
        """(sequence, index of the last token) of every occurrence of x."""
        n = len(x)
        return [
            (s, i + n - 1)
            for s, seq in enumerate(self.seqs)
            for i in range(len(seq) - n + 1)
            if seq[i : i + n] == x
        ]

    def children(self, x: list[int]) -> list[tuple[int, int]]:
        """(token, count) of x's continuations, in draft order: most frequent first; among equals
        the latest to reach its count (its last occurrence), except once-seen ones oldest first."""
        if len(x) >= self.depth:
            return []
        found: dict[int, list[int]] = {}
        for s, end in self.ends(x):
            if end + 1 < len(self.seqs[s]):
                found.setdefault(self.seqs[s][end + 1], []).append(self.time[(s, end + 1)])

        def rank(times: list[int]) -> tuple[int, int]:
            return len(times), max(times) if len(times) > 1 else -max(times)

        ranked = sorted(found.items(), key=lambda kv: rank(kv[1]), reverse=True)
        return [(token, len(times)) for token, times in ranked]

    def path(self, x: list[int], budget: int, min_prob: float) -> Draft:
        draft, prob = Draft(), 1.0
        while len(draft.tokens) < budget:
            kids = self.children(x)
            if not kids:
                break
            token, count = kids[0]
            prob *= count / len(self.ends(x))
            if prob < min_prob:
                break
            draft.parents.append(len(draft.tokens) - 1)
            draft.tokens.append(token)
            draft.probs.append(prob)
            x = x + [token]
        draft.score = sum(draft.probs)
        return draft

    def tree(self, x: list[int], budget: int, min_prob: float) -> Draft:
        """Greedy expansion: the frontier's most probable node next (the first added among equals)."""
        draft = Draft()
        frontier: list[tuple[float, list[int], int]] = []  # (probability, string, parent index)

        def add(string: list[int], prob: float, index: int) -> None:
            total = len(self.ends(string))
            for token, count in self.children(string):
                if prob * count / total < min_prob:
                    break
                frontier.append((prob * count / total, string + [token], index))

        add(x, 1.0, -1)
        while len(draft.tokens) < budget and frontier:
            best = max(range(len(frontier)), key=lambda i: (frontier[i][0], -i))
            prob, string, parent = frontier.pop(best)
            draft.tokens.append(string[-1])
            draft.parents.append(parent)
            draft.probs.append(prob)
            add(string, prob, len(draft.tokens) - 1)
        draft.score = sum(draft.probs)
        return draft

    def speculate(self, context: list[int], rule: DraftRule) -> Draft:
        context = context[-self.depth :]
        best = Draft()
        for m in range(1, len(context)):
            pattern = context[len(context) - m :]
            if not self.ends(pattern):
                break
            budget = max(0, min(rule.max_tokens, int(m * rule.max_spec_factor + 1e-6)))
            draft = (self.tree if rule.tree else self.path)(pattern, budget, rule.min_token_prob)
            if draft.score >= best.score:
                best, best.match_len = draft, m
        return best


def _tree_of(seqs: list[list[int]], depth: int) -> SuffixTree:
    tree = SuffixTree(depth)
    for i, seq in enumerate(seqs):
        tree.extend(i, seq)
    return tree


def _same(a: Draft, b: Draft) -> bool:
    same_tree = (a.tokens, a.parents, a.match_len) == (b.tokens, b.parents, b.match_len)
    return same_tree and a.probs == pytest.approx(b.probs)


# --- drafts -----------------------------------------------------------------------------------


def test_a_path_follows_the_most_frequent_continuation_with_its_estimated_probability() -> None:
    # "1 2" went on with 3 twice and with 9 once; "1 2 3" always with 4.
    tree = _tree_of([[1, 2, 3, 4, 1, 2, 9, 1, 2, 3, 4]], depth=8)
    draft = tree.speculate([7, 1, 2], DraftRule(max_tokens=8, max_spec_factor=2.0, min_token_prob=0.1))
    assert draft.match_len == 2 and draft.tokens == [3, 4, 1, 2]
    assert draft.probs == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3])
    assert draft.parents == [-1, 0, 1, 2]


def test_speculation_grows_with_the_match_and_stops_below_the_minimum_probability() -> None:
    # The row's own tree: "5 6 7" occurred once before and once now at the end, which nothing
    # follows yet, so each draft token has probability 1/2.
    context = [5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7]
    tree = _tree_of([context], depth=16)
    once = DraftRule(max_tokens=16, max_spec_factor=1.0, min_token_prob=0.1)
    assert tree.speculate(context, once).tokens == [8, 9, 10]  # 3 matched tokens, 3 drafts
    twice = DraftRule(max_tokens=16, max_spec_factor=2.0, min_token_prob=0.1)
    assert tree.speculate(context, twice).tokens == [8, 9, 10, 11, 12, 5]
    assert tree.speculate(context, DraftRule(max_tokens=4, max_spec_factor=2.0)).tokens == [8, 9, 10, 11]
    assert tree.speculate(context, DraftRule(16, 2.0, min_token_prob=0.6)).tokens == []


def test_the_greedy_tree_drafts_both_branches_most_probable_first() -> None:
    tree = _tree_of([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 5, 6], [0, 1, 2]], depth=8)
    rule = DraftRule(max_tokens=4, max_spec_factor=2.0, min_token_prob=0.1, tree=True)
    draft = tree.speculate([0, 1, 2], rule)
    # "0 1 2" occurs once, with no continuation: the best match is "1 2", seen 4 times.
    assert draft.match_len == 2
    assert list(zip(draft.tokens, draft.parents, strict=True)) == [(3, -1), (4, 0), (5, -1), (6, 2)]
    assert draft.probs == pytest.approx([0.5, 0.5, 0.25, 0.25])


@pytest.mark.parametrize("tree", [False, True], ids=["path", "tree"])
def test_drafts_equal_the_papers_algorithm_on_random_streams(tree: bool) -> None:
    rng = random.Random(22)
    compared = drafted = 0
    for _ in range(300):
        depth = rng.choice([2, 3, 5, 8])
        vocab = rng.choice([2, 3, 4, 6])
        seqs = [[rng.randrange(vocab) for _ in range(rng.randint(1, 24))] for _ in range(rng.randint(1, 4))]
        suffix_tree, reference = _tree_of(seqs, depth), Reference(seqs, depth)
        for _ in range(5):
            seq = rng.choice(seqs)
            end = rng.randint(1, len(seq))
            seen = rng.random() < 0.7
            context = seq[max(0, end - 10) : end] if seen else [rng.randrange(vocab) for _ in range(6)]
            rule = DraftRule(
                max_tokens=rng.randint(1, 10),
                max_spec_factor=rng.choice([0.5, 1.0, 2.0]),
                min_token_prob=rng.choice([0.0, 0.1, 0.3]),
                tree=tree,
            )
            got, want = suffix_tree.speculate(context, rule), reference.speculate(context, rule)
            assert _same(got, want), (seqs, depth, context, rule, got, want)
            compared += 1
            drafted += bool(want.tokens)
    assert drafted > compared // 2  # most comparisons drafted something


def test_a_growing_sequence_counts_like_one_added_whole() -> None:
    rng = random.Random(5)
    seq = [rng.randrange(3) for _ in range(60)]
    whole, grown = _tree_of([seq], depth=6), SuffixTree(6)
    for start in range(0, len(seq), 7):
        grown.extend(0, seq[start : start + 7])
    rule = DraftRule(max_tokens=6, max_spec_factor=2.0, min_token_prob=0.0)
    for end in range(2, len(seq)):
        assert _same(grown.speculate(seq[:end], rule), whole.speculate(seq[:end], rule))
    assert grown.nodes == whole.nodes


def _draft(*nodes: tuple[int, int, float]) -> Draft:
    """A draft from (token, parent, probability) nodes."""
    draft = Draft([t for t, _, _ in nodes], [p for _, p, _ in nodes], [q for _, _, q in nodes])
    draft.score = sum(draft.probs)
    return draft


def test_merged_drafts_share_their_common_nodes_and_keep_the_most_probable() -> None:
    own = _draft((5, -1, 0.9), (6, 0, 0.6), (7, 1, 0.3))
    pooled = _draft((5, -1, 0.5), (8, 0, 0.45), (9, 1, 0.4), (4, -1, 0.35))
    merged = merge(own, pooled, budget=16)
    # 5 once, at its higher probability; 8 below it beside 6; 9 below 8; 4 a second root.
    nodes = {(merged.tokens[merged.parents[i]] if merged.parents[i] >= 0 else None, t, p)
             for i, (t, p) in enumerate(zip(merged.tokens, merged.probs, strict=True))}  # fmt: skip
    assert nodes == {(None, 5, 0.9), (5, 6, 0.6), (6, 7, 0.3), (5, 8, 0.45), (8, 9, 0.4), (None, 4, 0.35)}
    assert merged.probs == sorted(merged.probs, reverse=True)  # most probable first
    assert merged.score == pytest.approx(0.9 + 0.6 + 0.3 + 0.45 + 0.4 + 0.35)
    # A smaller budget keeps the most probable nodes, each with its parent.
    small = merge(own, pooled, budget=3)
    assert list(zip(small.tokens, small.parents, strict=True)) == [(5, -1), (6, 0), (8, 0)]
    assert merge(own, Draft(), budget=16).tokens == own.tokens
    # Products of count ratios can round a child above its parent (0.4 x 5 / 5); the merged
    # tree still lists every parent before its children, as the verifier needs.
    rounded = merge(_draft((1, -1, 0.4), (2, 0, 0.4000000000000001)), _draft((3, -1, 0.5)), budget=16)
    assert all(parent < i for i, parent in enumerate(rounded.parents))
    assert list(zip(rounded.tokens, rounded.parents, strict=True)) == [(3, -1), (1, -1), (2, 1)]


# --- bounded memory -----------------------------------------------------------------------------


def test_an_output_tree_keeps_the_latest_requests_and_at_most_its_nodes() -> None:
    outputs = [[i, i + 1, i + 2, 7, 8, 9] for i in range(10, 60, 10)]
    pool = OutputTree(max_depth=4, max_requests=2, max_nodes=10_000)
    for out in outputs:
        pool.add([1, 2, 3], out)
    assert pool.sequences == 2
    assert len(pool) == _tree_of(outputs[-2:], depth=4).nodes  # exactly the last two, nothing left over
    rule = DraftRule(max_tokens=4, max_spec_factor=2.0, min_token_prob=0.0)
    assert pool.tree.speculate([5, 10, 11], rule).tokens == []  # the first output is gone
    assert pool.tree.speculate([5, 50, 51], rule).tokens == [52, 7]  # depth 4: 2 matched, 2 drafted
    assert pool.tree.speculate([5, 1, 2], rule).tokens == []  # prompts are not shared

    small = OutputTree(max_depth=8, max_requests=100, max_nodes=50)
    for i in range(40):
        small.add([], [i, i + 1, i + 2, i + 3, i + 4])
        assert len(small) <= 50
    assert 1 < small.sequences < 40
    small.add([], list(range(100, 200)))  # one output larger than the bound: none kept
    assert (len(small), small.sequences) == (0, 0)


def test_a_tree_without_its_sequences_holds_no_nodes() -> None:
    rng = random.Random(1)
    tree = SuffixTree(5)
    for i in range(6):
        tree.extend(i, [rng.randrange(4) for _ in range(30)])
    for i in range(6):
        tree.remove(i)
    assert tree.nodes == 0 and not tree.kids[ROOT] and tree.best[ROOT] == -1


def test_a_tree_adds_nothing_for_the_garbage_collector_to_scan() -> None:
    # Every tracked object is scanned by each full collection, which stalls a decoding step;
    # a tree of tens of thousands of nodes must not add to them.
    rng = random.Random(3)
    seqs = [[rng.randrange(50) for _ in range(400)] for _ in range(5)]
    gc.collect()
    before = len(gc.get_objects())
    tree = _tree_of(seqs, depth=24)
    after = len(gc.get_objects())
    assert tree.nodes > 20_000
    assert after - before < 50


# --- F-S1, on the real model ----------------------------------------------------------------------

TEXT = "List the seven wonders of the ancient world, then list them again."


def _suffix_engine(smollm) -> tuple[Engine, DraftPools]:
    pools: DraftPools = DraftPools()
    return Engine(smollm, "suffix", ProposerConfig(k=8), draft_pools=pools), pools


@pytest.mark.slow
def test_a_tenant_never_drafts_from_another_tenants_outputs(smollm) -> None:
    policies = SecurityPolicies(PolicySettings(tier=SecurityTier.SHARED))
    prompt = smollm.encode_prompt(TEXT, chat=True)
    engine, pools = _suffix_engine(smollm)
    engine.generate([Request(prompt, 40, draft_scope=policies.draft_scope("tenant-a"))])
    b = engine.generate([Request(prompt, 40, draft_scope=policies.draft_scope("tenant-b"))])[0]
    a = engine.generate([Request(prompt, 40, draft_scope=policies.draft_scope("tenant-a"))])[0]
    assert pools.stats["tenant-b"].lookups > 0 and pools.stats["tenant-b"].hits == 0
    assert pools.stats["tenant-a"].draft_tokens > 0
    # The repeat in tenant a's scope accepts more than the first ask in b's: the tree's effect.
    assert a.metrics.accepted_tokens > b.metrics.accepted_tokens
    assert a.token_ids == b.token_ids


@pytest.mark.slow
def test_single_tenant_requests_share_one_tree(smollm) -> None:
    policies = SecurityPolicies(PolicySettings(tier=SecurityTier.SINGLE_TENANT))
    prompt = smollm.encode_prompt(TEXT, chat=True)
    engine, pools = _suffix_engine(smollm)
    first = engine.generate([Request(prompt, 40, draft_scope=policies.draft_scope("tenant-a"))])[0]
    again = engine.generate([Request(prompt, 40, draft_scope=policies.draft_scope("tenant-b"))])[0]
    assert list(pools.pools) == [policies.draft_scope("tenant-b")]
    assert pools.totals.draft_tokens > 0
    assert again.metrics.accepted_tokens > first.metrics.accepted_tokens
    assert again.token_ids == first.token_ids


# --- the benchmark's fairness -------------------------------------------------------------------------


@pytest.mark.slow
def test_in_a_bench_a_prompt_drafts_only_from_earlier_prompts_of_its_rep(smollm) -> None:
    """Prompts [A, B, A]: the second A may draft from the first A's output (another, earlier
    prompt), but no rep's first A from anything: not the warm-up, not the rep before."""
    texts = [TEXT, "Name three primary colours.", TEXT]
    prompts = [smollm.encode_prompt(t, chat=True) for t in texts]
    engine = bench_engine(smollm, "suffix", ProposerConfig(k=8))
    pools = engine.draft_pools
    assert pools is not None
    seen: list[tuple[str | None, list[list[int]]]] = []  # (scope, outputs its tree holds) per call
    outputs: dict[tuple[str | None, int], list[int]] = {}
    decode = engine_method(engine)

    def recording(requests: list[Request]) -> Decoded:
        (request,) = requests
        pool = pools.pools.get(request.draft_scope or "")
        seen.append((request.draft_scope, list(pool.tree.seqs.values()) if pool is not None else []))
        decoded = decode(requests)
        outputs[(request.draft_scope, len(seen))] = decoded.token_ids[0]
        return decoded

    plain = engine_method(Engine(smollm, "none"))
    schedule = Schedule(prompts=prompts, reps=2, max_new_tokens=24)
    interleave(schedule, {"none": plain, "suffix": recording}, lambda run: None, baseline="none")
    assert [scope for scope, _ in seen] == [WARMUP_SCOPE] + [f"{REP_SCOPE}{r}" for r in (0, 1) for _ in texts]
    for rep in (0, 1):
        calls = seen[1 + 3 * rep : 4 + 3 * rep]
        rep_outputs = [outputs[(f"{REP_SCOPE}{rep}", 2 + 3 * rep + i)] for i in range(3)]
        assert [held for _, held in calls] == [[], rep_outputs[:1], rep_outputs[:2]]
    assert pools.stats[f"{REP_SCOPE}1"].draft_tokens > 0  # the second A drafted from the first
    assert list(pools.pools) == [f"{REP_SCOPE}1"]  # one pool at a time
