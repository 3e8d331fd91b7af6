"""Suffix trees that count what followed every recent pattern, and the drafts they give
(SuffixDecoding, Oliaro et al. 2024, arXiv 2411.04975).

Glossary:
- tree: every substring of at most ``max_depth`` tokens of the sequences it holds, as a
  trie; a node's *count* is how many times its string occurs in them (a sequence's own
  last tokens included, which nothing follows yet).
- pattern: the context's last m tokens, m the *match length* (1 <= m < len(context), the
  context being the sequence's last ``max_depth`` tokens).
- probability of a draft token: the product, along its path from the matched node, of
  count(child) / count(parent) — how often the matched pattern went on this way.
- draft: from one match, tokens of probability >= ``min_token_prob``, at most
  ``min(max_tokens, max_spec_factor x m)`` of them: longer matches draft more. A *path*
  follows the most frequent child (the latest seen among equals); a *tree* is the paper's
  greedy expansion, the most probable frontier node first, up to the same node budget.
- score: the sum of the draft's probabilities, its expected accepted tokens; of all match
  lengths the best-scoring draft wins (a longer match on a tie).

The counts, the match-length cap, the minimum probability and the score are Arctic
Inference's (``csrc/suffix_decoding/suffix_tree.cc``, 0.3.0), which vLLM's ``suffix``
method runs, so a candidate measured here means the same on vLLM. Arctic compresses
single-child runs into one node in C++; this trie keeps one node per token, which makes a
lookup a few dictionary probes per matched token and costs memory per node, so every tree
is bounded (``max_depth``; the global trees also by requests and nodes).

A node is an index into flat arrays, its children a dict of token ids to node indices, so
the trees hold no object that Python's cyclic garbage collector tracks: a tree of nodes as
objects added hundreds of thousands of them, made full collections frequent, and each one
stalled a decoding step by the time it took to scan the whole heap (about 180 ms on 2 CPU
threads with torch and transformers loaded).
"""

from __future__ import annotations

import heapq
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

# Python bytes a node costs (its slots in the arrays, its entry in the parent's children
# dict, its own children dict, which most nodes have: a chain of one child each): tracemalloc
# over 57 ShareGPT replies (17k smollm2 tokens) at depth 24 measured 289, with 19 nodes a
# token; for memory reports and bounds.
NODE_BYTES = 290
ROOT = 0


@dataclass(slots=True)
class Draft:
    """Draft tokens as a tree: ``parents[i]`` indexes an earlier token, -1 the pending token."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0


@dataclass(frozen=True, slots=True)
class DraftRule:
    """How a draft is cut (the vLLM ``suffix_decoding_*`` options of the same names)."""

    max_tokens: int  # node budget (vLLM's num_speculative_tokens)
    max_spec_factor: float = 1.0
    min_token_prob: float = 0.1
    tree: bool = False  # the paper's greedy tree; False: a path, as vLLM drafts

    def budget(self, match_len: int) -> int:
        # The epsilon as in Arctic, so that e.g. 3 x 0.1 x 10 is not cut to 2.
        return max(0, min(self.max_tokens, int(match_len * self.max_spec_factor + 1e-6)))


class SuffixTree:
    """Counts of every substring of at most ``max_depth`` tokens of the sequences it holds.

    Sequences grow at the end (``extend``) and leave whole (``remove``); appending a token
    costs ``max_depth`` node updates, through the nodes of the sequence's last suffixes.
    Node ``n``: its token, its count, when an occurrence last ended there (``stamp``, on the
    tree's clock), its child of highest count, the latest among equals (``best``, -1 if it
    has none), and its children by token (None if it has none). Removed nodes' indices are
    reused.
    """

    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"a suffix tree needs a depth of at least 1, got {max_depth}")
        self.max_depth = max_depth
        self.nodes = 0  # not counting the root
        self.clock = 0
        self.seqs: dict[int, list[int]] = {}
        self.token = array("q", [-1])
        self.count = array("q", [0])
        self.stamp = array("q", [0])
        self.best = array("q", [-1])
        self.kids: list[dict[int, int] | None] = [None]
        self._free: list[int] = []
        # Per growing sequence: the nodes of its last 1, 2, ... max_depth - 1 tokens.
        self._ends: dict[int, list[int]] = {}

    def extend(self, seq_id: int, tokens: list[int]) -> None:
        """Append tokens to a sequence (a new one if ``seq_id`` is not held)."""
        seq = self.seqs.setdefault(seq_id, [])
        ends = self._ends.get(seq_id, [])
        keep = self.max_depth - 1
        for token in tokens:
            self.clock += 1
            new = [self._bump(ROOT, token)]
            new += [self._bump(node, token) for node in ends[:keep]]
            ends = new
        seq.extend(tokens)
        self._ends[seq_id] = ends

    def seal(self, seq_id: int) -> None:
        """The sequence will not grow: forget its growing ends (it stays counted)."""
        self._ends.pop(seq_id, None)

    def remove(self, seq_id: int) -> None:
        """Uncount every substring of a sequence; nodes left with no occurrence go."""
        seq = self.seqs.pop(seq_id)
        self._ends.pop(seq_id, None)
        count, best, kids = self.count, self.best, self.kids
        for start in range(len(seq)):
            node = ROOT
            for token in seq[start : start + self.max_depth]:
                children = kids[node]
                assert children is not None
                child = children[token]
                count[child] -= 1
                if count[child] == 0:
                    del children[token]
                    self._free.append(child)
                    self.nodes -= 1
                if best[node] == child:
                    best[node] = max(children.values(), key=self._rank, default=-1)
                node = child

    def match(self, pattern: list[int]) -> int | None:
        """The node of ``pattern``, None if it does not occur."""
        node = ROOT
        for token in pattern:
            children = self.kids[node]
            child = children.get(token) if children is not None else None
            if child is None:
                return None
            node = child
        return node

    def speculate(self, context: list[int], rule: DraftRule) -> Draft:
        """The best-scoring draft over every match length of ``context``'s last tokens."""
        context = context[-self.max_depth :]
        best = Draft()
        for m in range(1, len(context)):
            node = self.match(context[len(context) - m :])
            if node is None:
                break  # no longer pattern occurs either
            budget = rule.budget(m)
            draft = (
                self._tree(node, budget, rule.min_token_prob)
                if rule.tree
                else self._path(node, budget, rule.min_token_prob)
            )
            if draft.score >= best.score:
                best = draft
                best.match_len = m
        return best

    def _bump(self, parent: int, token: int) -> int:
        children = self.kids[parent]
        if children is None:
            children = self.kids[parent] = {}
        child = children.get(token)
        if child is None:
            child = children[token] = self._new(token)
        count = self.count
        count[child] += 1
        self.stamp[child] = self.clock
        best = self.best[parent]
        if best < 0 or count[child] > count[best] or (count[child] == count[best] > 1):
            self.best[parent] = child
        return child

    def _new(self, token: int) -> int:
        self.nodes += 1
        if self._free:
            node = self._free.pop()
            self.token[node], self.count[node], self.stamp[node], self.best[node] = token, 0, 0, -1
            self.kids[node] = None
            return node
        self.token.append(token)
        self.count.append(0)
        self.stamp.append(0)
        self.best.append(-1)
        self.kids.append(None)
        return len(self.kids) - 1

    def _rank(self, node: int) -> tuple[int, int]:
        """Children in draft order: the most frequent first; among equals the latest to reach
        that count, except that once-seen ones keep the order they were first seen in
        (Arctic's sibling order, in all but rare cases: its linked list's)."""
        count = self.count[node]
        return count, self.stamp[node] if count > 1 else -self.stamp[node]

    def _path(self, node: int, budget: int, min_prob: float) -> Draft:
        draft = Draft()
        prob = 1.0
        while len(draft.tokens) < budget and self.best[node] >= 0:
            child = self.best[node]
            prob *= self.count[child] / self.count[node]
            if prob < min_prob:
                break
            draft.parents.append(len(draft.tokens) - 1)
            draft.tokens.append(self.token[child])
            draft.probs.append(prob)
            node = child
        draft.score = sum(draft.probs)
        return draft

    def _tree(self, node: int, budget: int, min_prob: float) -> Draft:
        """Greedy expansion: the most probable frontier node next (the earlier pushed among
        equals); a node's children enter the frontier, most frequent first, once it is drafted."""
        draft = Draft()
        frontier: list[tuple[float, int, int, int]] = []  # (-probability, push order, node, parent)
        pushed = 0

        def push(parent: int, prob: float, index: int) -> None:
            nonlocal pushed
            children = self.kids[parent]
            if children is None:
                return
            for child in sorted(children.values(), key=self._rank, reverse=True):
                p = prob * self.count[child] / self.count[parent]
                if p < min_prob:
                    break
                heapq.heappush(frontier, (-p, pushed, child, index))
                pushed += 1

        push(node, 1.0, -1)
        while len(draft.tokens) < budget and frontier:
            neg, _, child, parent = heapq.heappop(frontier)
            draft.tokens.append(self.token[child])
            draft.parents.append(parent)
            draft.probs.append(-neg)
            push(child, -neg, len(draft.tokens) - 1)
        draft.score = sum(draft.probs)
        return draft


def merge(first: Draft, second: Draft, budget: int) -> Draft:
    """Two drafts as one tree of at most ``budget`` nodes: a node both drafted (the same token
    below the same node) once, at the higher of its two probabilities, and then the most
    probable nodes first (the earlier among equals, so a node never outlives its parent,
    whose probability is at least its own)."""
    tokens, parents, probs = list(first.tokens), list(first.parents), list(first.probs)
    at = {(parent, token): i for i, (token, parent) in enumerate(zip(tokens, parents, strict=True))}
    placed: list[int] = []  # second's node i is placed[i]
    for token, parent, prob in zip(second.tokens, second.parents, second.probs, strict=True):
        key = (placed[parent] if parent >= 0 else -1, token)
        node = at.get(key)
        if node is None:
            node = at[key] = len(tokens)
            tokens.append(token)
            parents.append(key[0])
            probs.append(prob)
        else:
            probs[node] = max(probs[node], prob)
        placed.append(node)
    for i, parent in enumerate(parents):  # parents come first; undo rounding (p x c / c > p)
        if parent >= 0:
            probs[i] = min(probs[i], probs[parent])
    keep = sorted(range(len(tokens)), key=lambda i: (-probs[i], i))[:budget]
    renumbered = {old: new for new, old in enumerate(keep)}
    merged = Draft(
        tokens=[tokens[i] for i in keep],
        parents=[renumbered[parents[i]] if parents[i] >= 0 else -1 for i in keep],
        probs=[probs[i] for i in keep],
        match_len=max(first.match_len, second.match_len),
    )
    merged.score = sum(merged.probs)
    return merged


class OutputTree:
    """One scope's global tree (a ``speccore.draft_pool`` pool): the outputs of its finished
    requests, the oldest dropped first past ``max_requests`` requests or ``max_nodes`` nodes."""

    def __init__(self, max_depth: int, max_requests: int, max_nodes: int) -> None:
        if max_requests < 0 or max_nodes < 1:
            raise ValueError("an output tree needs max_requests >= 0 and max_nodes >= 1")
        self.tree = SuffixTree(max_depth)
        self.max_requests = max_requests
        self.max_nodes = max_nodes
        self._held: OrderedDict[int, None] = OrderedDict()  # sequence ids, oldest first
        self._next_id = 0

    @property
    def sequences(self) -> int:
        return len(self._held)

    def __len__(self) -> int:
        return self.tree.nodes

    def add(self, prompt: list[int], output: list[int]) -> None:
        """Count a finished request's output (its prompt is its own tree's, not shared)."""
        if self.max_requests == 0 or not output:
            return
        seq_id = self._next_id
        self._next_id += 1
        self.tree.extend(seq_id, output)
        self.tree.seal(seq_id)
        self._held[seq_id] = None
        while len(self._held) > 1 and (
            len(self._held) > self.max_requests or self.tree.nodes > self.max_nodes
        ):
            oldest, _ = self._held.popitem(last=False)
            self.tree.remove(oldest)
        if self.tree.nodes > self.max_nodes:  # one output alone is too large: keep none
            self._held.clear()
            self.tree.remove(seq_id)
