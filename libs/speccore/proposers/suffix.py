"""Suffix decoding (speccore.suffix_tree): each row drafts from a tree over its own prompt and
output so far and, when its request names a scope and the engine has pools, from the
scope's tree over earlier requests' outputs (``speccore.suffix_tree.OutputTree``). As a
path (vLLM's drafts) the better-scoring draft wins, the row's own on a tie (as Arctic
Inference does); as a tree (``use_tree_spec``) both go into one tree, which the verifier
checks at once, so a step that either source would have drafted well keeps its tokens.

A scope's tree is fed when a request finishes (Arctic also feeds outputs while they grow,
so that concurrent requests see each other's partial outputs); a request never drafts from
another scope's outputs (F-S1).
"""

from __future__ import annotations

import torch

from speccore.proposers.base import DraftTree, Proposer, ProposerConfig, StepContext, capped, knob_values
from speccore.state import Sequence
from speccore.suffix_tree import NODE_BYTES, Draft, DraftRule, OutputTree, SuffixTree, merge

# Nodes one scope's global tree may hold (about 58 MB at NODE_BYTES, about 12k output tokens
# at depth 24), beside the max_cached_requests bound: Python nodes must stay bounded too.
POOL_MAX_NODES = 200_000
_OWN = 0  # the row's sequence id in its own tree


class SuffixProposer(Proposer):
    family = "suffix"
    adapts_draft = True
    reads_draft_pools = True
    row_state = ("trees",)

    def __init__(self, cfg: ProposerConfig) -> None:
        knobs = knob_values(self.family, cfg)
        self.k = cfg.k
        self.depth = int(knobs["suffix_decoding_max_tree_depth"])
        self.max_cached = int(knobs["suffix_decoding_max_cached_requests"])
        self.max_spec_factor = float(knobs["suffix_decoding_max_spec_factor"])
        self.min_token_prob = float(knobs["suffix_decoding_min_token_prob"])
        self.tree = bool(knobs["use_tree_spec"])
        self.trees: list[SuffixTree] = []

    @property
    def draft_nodes(self) -> int:
        return self.k

    def new_draft_pool(self) -> OutputTree:
        return OutputTree(self.depth, self.max_cached, POOL_MAX_NODES)

    def start(self, seqs: list[Sequence], features: torch.Tensor | None = None) -> None:
        self.trees = [SuffixTree(self.depth) for _ in seqs]  # filled as each row drafts

    def propose(self, seqs: list[Sequence], ctx: StepContext) -> DraftTree:
        k = capped(self.k, ctx)
        rows: list[tuple[list[int], list[int]]] = []
        for seq, tree in zip(seqs, self.trees, strict=True):
            # A draft of d tokens in a path, or nodes of a tree, adds at most d tokens plus the
            # bonus one, which must not pass max_new_tokens.
            budget = min(k, seq.remaining - 1)
            draft = self._draft(seq, tree, budget) if not seq.finished and budget > 0 else Draft()
            rows.append((draft.tokens, draft.parents))
        return DraftTree.from_row_trees(rows)

    def _draft(self, seq: Sequence, tree: SuffixTree, budget: int) -> Draft:
        tokens = seq.token_ids
        tree.extend(_OWN, tokens[len(tree.seqs.get(_OWN, ())) :])
        rule = DraftRule(budget, self.max_spec_factor, self.min_token_prob, self.tree)
        own = tree.speculate(tokens, rule)
        if self.draft_pools is None or seq.draft_scope is None:
            return own
        pooled = self.draft_pools.pool(seq.draft_scope).tree.speculate(tokens, rule)
        if self.tree:
            self.draft_pools.record(seq.draft_scope, len(pooled.tokens) if pooled.tokens else None)
            return merge(own, pooled, budget)
        wins = pooled.score > own.score
        self.draft_pools.record(seq.draft_scope, len(pooled.tokens) if wins else None)
        return pooled if wins else own

    def extra_memory_bytes(self) -> int:
        nodes = sum(t.nodes for t in self.trees)
        if self.draft_pools is not None:
            nodes += sum(len(pool) for pool in self.draft_pools.pools.values())
        return nodes * NODE_BYTES


def make_suffix(cfg: ProposerConfig, target: object) -> Proposer:
    return SuffixProposer(cfg)
