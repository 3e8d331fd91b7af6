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
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

# Python bytes a node costs (the node, its place in the parent's dict, its children dict):
# tracemalloc over 60 ShareGPT replies (17k smollm2 tokens) at depth 24 measured 291, with
# 17 nodes a token; for memory reports and bounds.
NODE_BYTES = 290


class _Node:
    __slots__ = ("best", "children", "count", "stamp", "token")

    def __init__(self, token: int) -> None:
        self.token = token
        self.count = 0
        self.stamp = 0  # when an occurrence last ended here (the tree's clock)
        self.children: dict[int, _Node] = {}
        self.best: _Node | None = None  # the child of highest count, the latest among equals


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
    """

    def __init__(self, max_depth: int) -> None:
        if max_depth < 1:
            raise ValueError(f"a suffix tree needs a depth of at least 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = _Node(-1)
        self.nodes = 0
        self.clock = 0
        self.seqs: dict[int, list[int]] = {}
        # Per growing sequence: the nodes of its last 1, 2, ... max_depth - 1 tokens.
        self._ends: dict[int, list[_Node]] = {}

    def extend(self, seq_id: int, tokens: list[int]) -> None:
        """Append tokens to a sequence (a new one if ``seq_id`` is not held)."""
        seq = self.seqs.setdefault(seq_id, [])
        ends = self._ends.get(seq_id, [])
        keep = self.max_depth - 1
        for token in tokens:
            self.clock += 1
            new = [self._bump(self.root, token)]
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
        for start in range(len(seq)):
            node = self.root
            for token in seq[start : start + self.max_depth]:
                child = node.children[token]
                child.count -= 1
                if child.count == 0:
                    del node.children[token]
                    self.nodes -= 1
                if node.best is child:
                    node.best = max(node.children.values(), key=_rank, default=None)
                node = child

    def match(self, pattern: list[int]) -> _Node | None:
        """The node of ``pattern``, None if it does not occur."""
        node = self.root
        for token in pattern:
            child = node.children.get(token)
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
            draft = _draft(node, rule.budget(m), rule)
            if draft.score >= best.score:
                best = draft
                best.match_len = m
        return best

    def _bump(self, parent: _Node, token: int) -> _Node:
        child = parent.children.get(token)
        if child is None:
            child = parent.children[token] = _Node(token)
            self.nodes += 1
        child.count += 1
        child.stamp = self.clock
        best = parent.best
        if best is None or child.count > best.count or (child.count == best.count > 1):
            parent.best = child
        return child


def _rank(node: _Node) -> tuple[int, int]:
    """Children in draft order: the most frequent first; among equals the latest to reach
    that count, except that once-seen ones keep the order they were first seen in (Arctic's
    sibling order, in all but rare cases: its linked list's)."""
    return node.count, node.stamp if node.count > 1 else -node.stamp


def _draft(node: _Node, budget: int, rule: DraftRule) -> Draft:
    return _tree(node, budget, rule.min_token_prob) if rule.tree else _path(node, budget, rule.min_token_prob)


def _path(node: _Node, budget: int, min_prob: float) -> Draft:
    draft = Draft()
    prob = 1.0
    while len(draft.tokens) < budget and node.best is not None:
        child = node.best
        prob *= child.count / node.count
        if prob < min_prob:
            break
        draft.parents.append(len(draft.tokens) - 1)
        draft.tokens.append(child.token)
        draft.probs.append(prob)
        node = child
    draft.score = sum(draft.probs)
    return draft


def _tree(node: _Node, budget: int, min_prob: float) -> Draft:
    """Greedy expansion: the most probable frontier node next (the earlier pushed among
    equals); a node's children enter the frontier, most frequent first, once it is drafted."""
    draft = Draft()
    frontier: list[tuple[float, int, _Node, int]] = []  # (-probability, push order, node, parent)
    pushed = 0

    def push(parent: _Node, prob: float, index: int) -> None:
        nonlocal pushed
        for child in sorted(parent.children.values(), key=_rank, reverse=True):
            p = prob * child.count / parent.count
            if p < min_prob:
                break
            heapq.heappush(frontier, (-p, pushed, child, index))
            pushed += 1

    push(node, 1.0, -1)
    while len(draft.tokens) < budget and frontier:
        neg, _, child, parent = heapq.heappop(frontier)
        draft.tokens.append(child.token)
        draft.parents.append(parent)
        draft.probs.append(-neg)
        push(child, -neg, len(draft.tokens) - 1)
    draft.score = sum(draft.probs)
    return draft


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
