"""Medusa heads draft a static candidate tree from the target's last hidden state.

After each verify step the proposer keeps the target's feature at the last accepted
node: the position before the new pending token. Head d, read at that position,
predicts the token d+1 places after the pending one; the tree (``heads.trees``)
takes the top-ranked tokens of each head. Drafts are deterministic (top-k), so the
verifier's one-hot rule keeps sampling lossless.
"""

from __future__ import annotations

import torch

from speccore.errors import SpecError
from speccore.heads.loading import (
    draft_dtype,
    draft_rows,
    draft_scorer,
    load_head,
    on_target_kernels,
    open_head,
)
from speccore.heads.medusa import MedusaHeads
from speccore.heads.trees import DEFAULT_MEDUSA_CHOICES, medusa_tree, shape_choices, tree_parents
from speccore.models import LoadedModel
from speccore.proposers.base import DraftTree, Proposer, ProposerConfig, StepContext, StepOutcome, capped
from speccore.state import Sequence


class MedusaProposer(Proposer):
    family = "medusa"
    adapts_draft = True
    needs_hidden_states = True
    row_state = ("last", "ready")

    def __init__(self, cfg: ProposerConfig, target: LoadedModel) -> None:
        config = open_head(cfg.head, self.family, target)
        heads = load_head(str(cfg.head), MedusaHeads(config), target)
        self.draft_ids = heads.get_buffer("draft_ids")  # [draft vocab] their token ids
        self.dtype = draft_dtype(target)  # the target's features enter the heads in it
        rows = draft_rows(target, self.draft_ids)  # [draft vocab, hidden]
        self.weight_bytes = sum(t.numel() * t.element_size() for t in [*heads.parameters(), rows])
        self.heads = on_target_kernels(heads, target)
        self.scorer = draft_scorer(rows, target)
        if cfg.tree_shape is not None:
            if len(cfg.tree_shape) > config.num_heads:
                raise SpecError(
                    f"tree shape {list(cfg.tree_shape)} is {len(cfg.tree_shape)} deep; "
                    f"the head has {config.num_heads} Medusa heads"
                )
            choices = shape_choices(cfg.tree_shape)
        else:
            choices = medusa_tree(DEFAULT_MEDUSA_CHOICES, config.num_heads, cfg.tree_tokens)
        self.parents = torch.tensor(tree_parents(choices), dtype=torch.long)  # [n]
        self.depth = torch.tensor([len(c) - 1 for c in choices])  # [n] which head
        self.rank = torch.tensor([c[-1] for c in choices])  # [n] which of its top tokens
        self.width = int(self.rank.max()) + 1
        if self.width > config.draft_vocab_size:
            raise SpecError(
                f"the medusa tree asks for rank {self.width - 1} of {config.draft_vocab_size} draft tokens"
            )
        self.last: torch.Tensor | None = None  # [batch, hidden] feature before each row's pending token
        self.ready: list[bool] = []

    @property
    def draft_nodes(self) -> int:
        return int(self.parents.shape[0])

    def start(self, seqs: list[Sequence], features: torch.Tensor | None = None) -> None:
        committed = torch.tensor([len(s.prompt_ids) - 1 for s in seqs])
        self.ready = [int(n) > 0 for n in committed]
        self.last = None
        if features is not None:
            rows, cols = torch.arange(len(seqs)), (committed - 1).clamp(min=0)
            self.last = features[rows.to(features.device), cols.to(features.device)]

    def propose(self, seqs: list[Sequence], ctx: StepContext) -> DraftTree:
        # A node at depth d is accepted as the (d+1)-th new token: room for it and the bonus token.
        ready = zip(seqs, self.ready, strict=True)
        room = torch.tensor([s.remaining - 1 if ok and not s.finished else 0 for s, ok in ready])
        if self.last is None or int(room.max()) <= 0:
            return DraftTree.empty(len(seqs))
        logits = self.scorer(self.heads(self.last.to(self.dtype)))  # [batch, heads, draft vocab]
        top = logits.topk(self.width, dim=-1).indices  # [batch, heads, width]
        tokens = self.draft_ids[top[:, self.depth, self.rank]].cpu()  # [batch, n]
        tree = DraftTree(
            tokens=tokens,
            parents=self.parents.expand_as(tokens).clone(),
            acceptable=self.depth[None, :] < room[:, None],
        )
        return tree.truncate(capped(tree.size, ctx))

    def observe(self, seqs: list[Sequence], outcome: StepOutcome) -> None:
        if outcome.hidden is None:
            raise RuntimeError("the medusa proposer needs the target's hidden states")
        last = torch.tensor([path[-1] for path in outcome.accepted_nodes], device=outcome.hidden.device)
        self.last = outcome.hidden[torch.arange(len(seqs), device=last.device), last]
        self.ready = [True] * len(seqs)

    def extra_memory_bytes(self) -> int:
        return self.weight_bytes


def make_medusa(cfg: ProposerConfig, target: LoadedModel) -> Proposer:
    return MedusaProposer(cfg, target)
