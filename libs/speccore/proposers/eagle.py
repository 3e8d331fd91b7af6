"""EAGLE heads draft a dynamic tree (EAGLE-2, Li et al. 2024, arXiv 2406.16858).

The head's one decoder layer keeps its own key/value cache at the target's
positions. Entry j reads [embedding of x_{j+1}; target feature at j]; its output
stands for the feature at j+1, whose logits give x_{j+2}. The proposer commits an
entry for every committed target position: the prompt's at ``start``, the accepted
path's at the next ``propose`` (queued by ``observe``).

Drafting grows a tree of ``k`` levels from the last entry's output: its top
``tree_topk`` tokens are depth 0; each further level runs the layer on the frontier
(a node reads its token's embedding and its parent's output), gives every frontier
node ``tree_topk`` children scored by cumulative log-probability, and keeps the
``tree_topk`` best as the next frontier. The ``tree_tokens`` best nodes of all levels
are drafted (a ``tree_shape`` sets the three at once: its depth, its widest level,
its number of nodes; topk 1 drafts a chain). Drafts are deterministic, so the
verifier's one-hot rule keeps sampling lossless.

Dynamic drafting (``tree_min_prob`` > 0): a node is drafted only when its cumulative
probability reaches the floor, and the tree stops growing at the first level where no
row's frontier does; the step's block is as wide as its widest row's kept nodes, so a
step where the head is unsure drafts, and the target verifies, fewer nodes (an empty
tree is a plain decoding step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from speccatalog.shapes import shape_nodes
from speccore.heads.eagle import EagleHead
from speccore.heads.loading import (
    draft_dtype,
    draft_rows,
    draft_scorer,
    load_head,
    on_target_kernels,
    open_head,
)
from speccore.kv_cache import StaticKVCache
from speccore.models import LoadedModel
from speccore.proposers.base import DraftTree, Proposer, ProposerConfig, StepContext, StepOutcome, capped
from speccore.runner import ModelRunner, pad_rows
from speccore.state import Sequence


@dataclass(slots=True)
class _Pool:
    """Every candidate node of a growing tree, level by level (parents come first)."""

    tokens: torch.Tensor  # [batch, P] draft-vocabulary index of each node
    parents: torch.Tensor  # [batch, P] pool index of the parent, -1 at depth 0
    scores: torch.Tensor  # [batch, P] cumulative log-probability
    depths: torch.Tensor  # [P] depth of each node (the same for every row)


class EagleProposer(Proposer):
    family = "eagle"
    adapts_draft = True
    needs_hidden_states = True
    row_state = ("cache", "last", "ready", "queued_tokens", "queued_features")

    def __init__(self, cfg: ProposerConfig, target: LoadedModel) -> None:
        config = open_head(cfg.head, self.family, target)
        head = load_head(str(cfg.head), EagleHead(config), target)
        self.feature_layers = tuple(config.feature_layers)
        self.draft_ids = head.get_buffer("draft_ids")  # [draft vocab] their token ids
        self.dtype = draft_dtype(target)  # the target's features and embeddings enter in it
        # EAGLE-1 scores with the target's output rows, EAGLE-3 with its own output layer.
        rows = draft_rows(target, self.draft_ids) if head.lm_head is None else None
        tensors = [*head.parameters(), *([rows] if rows is not None else [])]
        self.weight_bytes = sum(t.numel() * t.element_size() for t in tensors)
        self.head = on_target_kernels(head, target)
        self.scorer = draft_scorer(rows, target) if rows is not None else None
        self.embed = target.model.get_input_embeddings()
        self.runner = ModelRunner(self.head.layer)
        shape = cfg.tree_shape
        topk, self.depth, self.size = (
            (max(shape), len(shape), shape_nodes(shape)) if shape else (cfg.tree_topk, cfg.k, cfg.tree_tokens)
        )
        self.topk = min(topk, config.draft_vocab_size)
        self.min_log_prob = math.log(cfg.tree_min_prob) if cfg.tree_min_prob > 0 else -math.inf
        self.cache: StaticKVCache | None = None
        # Entries to commit at the next propose, per row: next tokens and [m, F] features.
        self.queued_tokens: list[list[int]] = []
        self.queued_features: list[list[torch.Tensor]] = []
        self.last: torch.Tensor | None = None  # [batch, hidden] output of each row's last entry
        self.ready: list[bool] = []

    @property
    def draft_nodes(self) -> int:
        return min(self.size, self.topk + (self.depth - 1) * self.topk * self.topk)

    def start(self, seqs: list[Sequence], features: torch.Tensor | None = None) -> None:
        capacity = max(len(s.prompt_ids) + s.max_new_tokens for s in seqs) + self.depth * self.topk + 8
        self.cache = self.runner.new_cache(len(seqs), capacity)
        self.last, self.ready = None, [False] * len(seqs)
        self.queued_tokens = [s.prompt_ids[1:] if features is not None else [] for s in seqs]
        self.queued_features = [
            [features[row, : len(s.prompt_ids) - 1]] if features is not None else []
            for row, s in enumerate(seqs)
        ]

    def observe(self, seqs: list[Sequence], outcome: StepOutcome) -> None:
        if outcome.hidden is None:
            raise RuntimeError("the eagle proposer needs the target's features")
        tokens = outcome.block_tokens.tolist()
        for row, seq in enumerate(seqs):
            if seq.finished:
                continue
            path = outcome.accepted_nodes[row]
            # Each accepted node's feature, paired with the token that follows it.
            self.queued_tokens[row] += [tokens[row][n] for n in path[1:]] + [outcome.next_tokens[row]]
            self.queued_features[row].append(outcome.hidden[row, path])

    def propose(self, seqs: list[Sequence], ctx: StepContext) -> DraftTree:
        if capped(self.depth, ctx) <= 0:
            # Adaptive k drafts nothing this step: the queued entries wait for the next step
            # that drafts and go through the layer then, as one block per row.
            return DraftTree.empty(len(seqs))
        self._commit_queued()
        # A node at depth d is accepted as the (d+1)-th new token: room for it and the bonus token.
        ready = zip(seqs, self.ready, strict=True)
        room = torch.tensor([s.remaining - 1 if ok and not s.finished else 0 for s, ok in ready])
        depth = min(capped(self.depth, ctx), int(room.max()))
        if self.last is None or depth <= 0:
            return DraftTree.empty(len(seqs))
        tokens, parents, depths, kept = self._grow(self.last, depth, capped(self.size, ctx))
        return DraftTree(tokens=tokens, parents=parents, acceptable=kept & (depths < room[:, None]))

    def _commit_queued(self) -> None:
        """Run the layer over the queued entries, a chain block per row, and commit them."""
        cache = self.cache
        if cache is None or not any(self.queued_tokens):
            return
        tokens, counts = pad_rows(self.queued_tokens)  # [batch, width], [batch]
        some = next(f[0] for f in self.queued_features if f)
        features = pad_sequence(
            [torch.cat(f) if f else some.new_zeros(0, some.shape[-1]) for f in self.queued_features],
            batch_first=True,
        )  # [batch, width, F]
        inputs = self.head.inputs(self._embed(tokens), self.head.target_feature(features.to(self.dtype)))
        out = self.runner.forward(cache, None, embeds=inputs)  # [batch, width, hidden]
        cache.commit(counts)
        last = out[torch.arange(len(counts)), (counts - 1).clamp(min=0)]
        fed = (counts > 0).to(out.device)[:, None]
        self.last = last if self.last is None else torch.where(fed, last, self.last)
        self.ready = [ok or n > 0 for ok, n in zip(self.ready, counts.tolist(), strict=True)]
        self.queued_tokens = [[] for _ in self.queued_tokens]
        self.queued_features = [[] for _ in self.queued_features]

    def _grow(
        self, root_out: torch.Tensor, depth: int, size: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The EAGLE-2 tree of ``size`` nodes below each row's pending token, from its last
        entry's output ([batch, hidden]): tokens, draft-relative parents (-1 = the pending
        token), depths and whether the row drafts the node, each [batch, n], parents first."""
        cache = self.cache
        if cache is None:
            raise RuntimeError("start() must precede propose()")
        batch, k, dev = root_out.shape[0], self.topk, root_out.device
        scores, idx = self._log_probs(root_out).topk(k, dim=-1)  # [batch, k]
        pool = _Pool(idx, torch.full_like(idx, -1), scores, torch.zeros(k, dtype=torch.long, device=dev))
        # The frontier: pool indices, block index of each node's parent, the parent's output.
        frontier = torch.arange(k, device=dev).expand(batch, k)  # [batch, k]
        frontier_par = torch.full((batch, k), -1)  # [batch, k] (level 0: roots of the block)
        parent_out = root_out[:, None].expand(batch, k, -1)  # [batch, k, hidden]
        # Every frontier so far, level after level: the layer's block (recomputed, never committed).
        block_in: list[torch.Tensor] = []  # per level [batch, k, layer input]
        block_par = torch.empty(batch, 0, dtype=torch.long)  # [batch, b]
        for level in range(depth - 1):
            if bool((pool.scores.gather(1, frontier) < self.min_log_prob).all()):
                break  # no row's frontier is worth a child: its children score lower still
            start = level * k
            tokens = self.draft_ids[pool.tokens.gather(1, frontier)]
            block_in.append(self.head.inputs(self._embed(tokens), parent_out))
            block_par = torch.cat([block_par, frontier_par], dim=1)
            out = self.runner.forward(cache, None, block_par, embeds=torch.cat(block_in, dim=1))
            out = out[:, start:]  # [batch, k, hidden] the frontier's outputs
            logp, child = self._log_probs(out).topk(k, dim=-1)  # [batch, k, k]
            cumulative = (pool.scores.gather(1, frontier)[:, :, None] + logp).flatten(1)  # [batch, k*k]
            first = pool.tokens.shape[1]
            pool = _Pool(
                torch.cat([pool.tokens, child.flatten(1)], dim=1),
                torch.cat([pool.parents, frontier.repeat_interleave(k, dim=1)], dim=1),
                torch.cat([pool.scores, cumulative], dim=1),
                torch.cat([pool.depths, torch.full((k * k,), level + 1, device=dev)]),
            )
            best = cumulative.topk(k, dim=-1).indices  # [batch, k] the best new children
            frontier = first + best
            frontier_par = start + (best // k).cpu()
            parent_out = out.gather(1, (best // k)[:, :, None].expand(batch, k, out.shape[-1]))
        return self._select(pool, size)

    def _select(
        self, pool: _Pool, size: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The ``size`` best nodes per row, in pool order, and which of them reach the
        probability floor (the block is as wide as the row keeping most). A child scores at
        most its parent and comes later in the pool, so a stable sort keeps the choice, and
        the kept nodes, ancestor-closed."""
        batch, total = pool.scores.shape
        floor = pool.scores >= self.min_log_prob
        n = min(size, total, int(floor.sum(1).max()))
        chosen = pool.scores.sort(dim=1, descending=True, stable=True).indices[:, :n].sort(dim=1).values
        position = torch.full((batch, total), -1, device=chosen.device)
        position.scatter_(1, chosen, torch.arange(n, device=chosen.device).expand(batch, n))
        par = pool.parents.gather(1, chosen)
        parents = torch.where(par >= 0, position.gather(1, par.clamp(min=0)), -1)
        tokens = self.draft_ids[pool.tokens.gather(1, chosen)]
        return tokens.cpu(), parents.cpu(), pool.depths[chosen].cpu(), floor.gather(1, chosen).cpu()

    def _log_probs(self, out: torch.Tensor) -> torch.Tensor:
        """[..., hidden] layer outputs -> [..., draft vocab] float32 log-probabilities."""
        logits = self.scorer(out) if self.scorer is not None else self.head.draft_logits(out, None)
        return logits.float().log_softmax(-1)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """[...] token ids -> [..., hidden] the target's input embeddings, in the draft dtype."""
        return self.embed(tokens.to(self.draft_ids.device)).to(self.dtype)

    def extra_memory_bytes(self) -> int:
        return self.weight_bytes + (self.cache.nbytes() if self.cache is not None else 0)


def make_eagle(cfg: ProposerConfig, target: LoadedModel) -> Proposer:
    return EagleProposer(cfg, target)
