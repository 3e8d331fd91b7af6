"""The proposer interface shared by every drafting family.

A proposer reads the sequences (and, for families that ask, the target's hidden
states) and returns a DraftTree; the verifier decides what is accepted. Proposers
never import the verifier: they only see the outcome through ``observe``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from speccatalog import families
from speccatalog.families.base import FamilyError, KnobValue
from speccatalog.shapes import shape_nodes
from speccore.draft_pool import DraftPools, ScopePool
from speccore.errors import SpecError
from speccore.sampling import SamplingParams
from speccore.state import Sequence
from speccore.tree import chain_parents


@dataclass(slots=True)
class DraftTree:
    """Candidate tokens for one verify step of a batch.

    Node i hangs below ``parents[b, i]`` (-1 is the pending token, the root).
    Parents always precede their children. Nodes with ``acceptable`` False are
    computed by the target (their logits come back through ``observe``) but can
    never be accepted: padding, or lookahead's Jacobi window.
    """

    tokens: torch.Tensor  # [batch, n] int64 draft token ids
    parents: torch.Tensor  # [batch, n] int64 draft-relative parent index, -1 = root
    acceptable: torch.Tensor  # [batch, n] bool
    draft_probs: torch.Tensor | None = None  # [batch, n, vocab] distribution each token was sampled from

    @property
    def size(self) -> int:
        return int(self.tokens.shape[1])

    def truncate(self, n: int) -> DraftTree:
        """The first n nodes of every row: still a tree, since parents precede their children."""
        if n >= self.size:
            return self
        probs = self.draft_probs[:, :n] if self.draft_probs is not None else None
        return DraftTree(self.tokens[:, :n], self.parents[:, :n], self.acceptable[:, :n], probs)

    @classmethod
    def empty(cls, batch: int) -> DraftTree:
        none = torch.zeros(batch, 0, dtype=torch.long)
        return cls(tokens=none, parents=none.clone(), acceptable=torch.zeros(batch, 0, dtype=torch.bool))

    @classmethod
    def from_chains(cls, chains: list[list[int]]) -> DraftTree:
        """Right-padded chains, one per row (an empty list drafts nothing)."""
        n = max((len(c) for c in chains), default=0)
        tokens = torch.tensor([c + [0] * (n - len(c)) for c in chains], dtype=torch.long).view(len(chains), n)
        acceptable = torch.tensor([[i < len(c) for i in range(n)] for c in chains], dtype=torch.bool)
        return cls(
            tokens=tokens, parents=chain_parents(len(chains), n), acceptable=acceptable.view(len(chains), n)
        )

    @classmethod
    def from_row_trees(cls, rows: list[tuple[list[int], list[int]]]) -> DraftTree:
        """Right-padded trees, one (tokens, parents) pair per row; padding hangs off the root."""
        n = max((len(t) for t, _ in rows), default=0)
        tokens = torch.zeros(len(rows), n, dtype=torch.long)
        parents = torch.full((len(rows), n), -1, dtype=torch.long)
        acceptable = torch.zeros(len(rows), n, dtype=torch.bool)
        for row, (toks, pars) in enumerate(rows):
            if len(toks) != len(pars):
                raise SpecError("a draft tree needs one parent per token")
            tokens[row, : len(toks)] = torch.tensor(toks, dtype=torch.long)
            parents[row, : len(pars)] = torch.tensor(pars, dtype=torch.long)
            acceptable[row, : len(toks)] = True
        return cls(tokens=tokens, parents=parents, acceptable=acceptable)


@dataclass(slots=True)
class StepContext:
    """What a proposer may read when drafting."""

    sampling: SamplingParams
    generators: list[torch.Generator | None]  # per row: the request's own RNG, None when greedy
    # At most this many draft nodes per row, and no deeper (adaptive k, speccore.adaptive);
    # None: the proposer's own size. 0 drafts nothing (a plain decoding step).
    max_draft: int | None = None


@dataclass(slots=True)
class StepOutcome:
    """What the verifier decided, handed back to the proposer."""

    block_tokens: torch.Tensor  # [batch, q] pending token then draft nodes
    logits: torch.Tensor  # [batch, q, vocab] target logits at every block node
    accepted_nodes: list[list[int]]  # per row: block indices of the accepted path, root first
    next_tokens: list[int]  # per row: the token sampled after the accepted path (new pending token)
    hidden: torch.Tensor | None = None  # [batch, q, F] target features at every block node, when asked


@dataclass(slots=True)
class ProposerConfig:
    """What a proposer is built with: the draft depth, the draft source, the tree, and the
    family's own knobs (its spec's, e.g. ngram_min; missing ones take the spec's defaults)."""

    k: int = 5
    draft: str | None = None  # draft model: a model ref, a distilled draft's directory or self:N
    datastore: str | None = None  # REST datastore file
    head: str | None = None  # trained head (medusa, eagle): a directory, or builtin:<name>
    # Tree defaults sized for speccore's CPU kernels, where a verify block of up to 6 tokens
    # costs one token (held-out chat, smollm2 heads: 5 nodes 1.24-1.29x, 11 nodes 1.07-1.11x,
    # 16 nodes 0.91-0.92x); on a GPU larger trees pay.
    tree_topk: int = 2  # eagle: children per expanded node, and nodes expanded per level (depth: k)
    tree_tokens: int = 5  # medusa and eagle: draft nodes per step
    # medusa and eagle: a static shape instead, (4, 2, 1) = 4 children of the pending token,
    # 2 below each, 1 below each (heads.trees.shape_choices)
    tree_shape: tuple[int, ...] | None = None
    # eagle: dynamic drafting. A node whose drafted probability (the product of the head's
    # probabilities along its path) is below this is not drafted, and levels stop growing once
    # no frontier node reaches it, so an unsure step drafts (and verifies) fewer nodes. 0: off.
    tree_min_prob: float = 0.0
    knobs: Mapping[str, KnobValue] = field(default_factory=dict)  # family knobs by name (FamilySpec.knobs)

    def __post_init__(self) -> None:
        if self.k <= 0:
            raise SpecError(f"k must be a positive number of draft tokens, got {self.k}")
        if self.k > MAX_K:
            raise SpecError(f"k={self.k} is too large; speccore drafts at most {MAX_K} tokens per step")
        if min(self.tree_topk, self.tree_tokens) <= 0:
            raise SpecError("tree_topk and tree_tokens must be positive")
        if not 0.0 <= self.tree_min_prob < 1.0:
            raise SpecError(f"tree_min_prob must be in [0, 1), got {self.tree_min_prob}")
        if self.tree_tokens > MAX_K:
            raise SpecError(f"tree_tokens={self.tree_tokens} is too large; at most {MAX_K} nodes a step")
        if self.tree_shape is not None:
            if not self.tree_shape or min(self.tree_shape) <= 0:
                raise SpecError(f"bad tree shape {list(self.tree_shape)}: every depth needs a child or more")
            nodes = shape_nodes(self.tree_shape)
            if nodes > MAX_K:
                raise SpecError(
                    f"tree shape {list(self.tree_shape)} has {nodes} nodes; speccore verifies at most {MAX_K}"
                )


MAX_K = 64


class Proposer(ABC):
    family: ClassVar[str]
    needs_hidden_states: ClassVar[bool] = False
    # With needs_hidden_states, the target features the engine hands over: () for the
    # final hidden state, else the outputs of these decoder layers, concatenated in order.
    feature_layers: tuple[int, ...] = ()
    # Attributes holding per-row state (a list per row, a tensor with the batch first, a KV
    # cache, or None before start): continuous batching (speccore.rows) selects and joins them
    # as rows finish and join, so a family that keeps any across steps must name it here.
    row_state: ClassVar[tuple[str, ...]] = ()
    # Whether propose honours StepContext.max_draft (adaptive k) and says its draft_nodes; a
    # family that cannot shrink its block (lookahead's Jacobi window) is refused adaptive k.
    adapts_draft: ClassVar[bool] = False
    # Whether propose drafts from a cross-request pool (speccore.draft_pool) when the engine
    # hands it one in ``draft_pools``; an engine refuses pools for a family that does not.
    reads_draft_pools: ClassVar[bool] = False
    draft_pools: DraftPools[Any] | None = None

    @property
    def draft_nodes(self) -> int:
        """The most draft nodes a row gets in one step (adaptive k's k_max; adapts_draft only)."""
        return 0

    def start(  # noqa: B027 - optional hook
        self, seqs: list[Sequence], features: torch.Tensor | None = None
    ) -> None:
        """Called once after the prompts are prefilled.

        features: [batch, n-1, F] target features of each row's prompt[:-1] (right-padded),
        or None when the proposer does not need hidden states or nothing was prefilled.
        """

    @abstractmethod
    def propose(self, seqs: list[Sequence], ctx: StepContext) -> DraftTree:
        """Draft candidates for every row (finished rows may get none)."""

    def observe(self, seqs: list[Sequence], outcome: StepOutcome) -> None:  # noqa: B027 - optional hook
        """Called after every verify step, once the sequences hold the new tokens."""

    def extra_memory_bytes(self) -> int:
        """Memory this proposer holds beyond the target (weights, caches, indexes)."""
        return 0

    def new_draft_pool(self) -> ScopePool:
        """One scope's empty cross-request pool, of the kind propose reads (reads_draft_pools only)."""
        raise SpecError(f"{self.family} does not draft from a cross-request pool")


def capped(size: int, ctx: StepContext) -> int:
    """``size`` draft nodes (or depth), or fewer when the step's context caps them."""
    return size if ctx.max_draft is None else min(size, ctx.max_draft)


def knob_values(family: str, config: ProposerConfig) -> dict[str, KnobValue]:
    """A family's knobs: ``config.knobs`` over its spec's defaults, checked (SpecError if they do not fit)."""
    try:
        return families.family(family).knob_values(config.knobs)
    except FamilyError as exc:
        raise SpecError(str(exc)) from None
