"""REST: retrieval-based speculative decoding (He et al. 2023, arXiv:2311.08252).

Each step the longest suffix of a row's tokens (pending token included: the draft
continues after it) is looked up in a corpus datastore. The continuations that
followed it are merged into a trie, and the trie's most frequent nodes form the
draft tree: a node's weight is the number of corpus occurrences passing through
it, so a child never outweighs its parent and a greedy pick stays connected.

Knobs (the rest spec's, speccatalog.families.rest; a T2 search tunes them): the tree
is at most ``cfg.k`` deep and has at most ``nodes_per_depth * cfg.k`` nodes (default
4: 20 for k=5). The paper verifies up to 64 nodes on a GPU, where a wider block is
nearly free; on CPU every node costs target compute, so the default stays small.
Suffixes of ``max_suffix`` (the retrieval depth, default 16) down to ``min_suffix``
(default 2) tokens are tried; one-token matches are too common to predict much.
"""

from __future__ import annotations

import heapq
from pathlib import Path
from typing import TYPE_CHECKING

from speccatalog.families.rest import tree_nodes
from speccore.datastore import Datastore, vocab_fingerprint
from speccore.errors import SpecError
from speccore.proposers.base import DraftTree, Proposer, ProposerConfig, StepContext, capped, knob_values
from speccore.state import Sequence

if TYPE_CHECKING:
    from speccore.models import LoadedModel

MAX_SUFFIX = 16
MIN_SUFFIX = 2
# Continuations retrieved per lookup: enough distinct ones to fill the node budget.
MATCHES_PER_NODE = 2


class RestProposer(Proposer):
    family = "rest"
    adapts_draft = True

    def __init__(
        self,
        store: Datastore,
        depth: int,
        max_nodes: int,
        *,
        max_suffix: int = MAX_SUFFIX,
        min_suffix: int = MIN_SUFFIX,
    ) -> None:
        if max_nodes <= 0 or depth <= 0:
            raise SpecError(f"rest needs a positive depth and node budget, got {depth}, {max_nodes}")
        if not 1 <= min_suffix <= max_suffix:
            raise SpecError(f"need 1 <= min_suffix <= max_suffix, got {min_suffix}, {max_suffix}")
        self.store = store
        self.depth = depth
        self.max_nodes = max_nodes
        self.max_suffix = max_suffix
        self.min_suffix = min_suffix

    @property
    def draft_nodes(self) -> int:
        return self.max_nodes

    def propose(self, seqs: list[Sequence], ctx: StepContext) -> DraftTree:
        depth, nodes = capped(self.depth, ctx), capped(self.max_nodes, ctx)
        return DraftTree.from_row_trees([self._row_tree(seq, depth, nodes) for seq in seqs])

    def _row_tree(self, seq: Sequence, max_depth: int, max_nodes: int) -> tuple[list[int], list[int]]:
        # The pending token and up to depth drafts join the output, which must not pass max_new_tokens.
        depth = min(max_depth, seq.remaining - 1)
        if seq.finished or depth <= 0:
            return [], []
        context = seq.token_ids[-self.max_suffix :]
        found = self.store.continuations(
            context, self.max_suffix, self.min_suffix, MATCHES_PER_NODE * max_nodes, depth
        )
        return best_subtree(found, max_nodes)

    def extra_memory_bytes(self) -> int:
        return self.store.nbytes


def best_subtree(continuations: list[tuple[list[int], int]], max_nodes: int) -> tuple[list[int], list[int]]:
    """The ``max_nodes`` heaviest nodes of the trie of ``continuations``, parents first.

    Returns (tokens, parents) with draft-relative parents (-1 = the root).
    """
    children: list[dict[int, int]] = [{}]  # trie node 0 is the root
    weight = [0]
    token = [-1]
    for seq, count in continuations:
        node = 0
        for tok in seq:
            nxt = children[node].get(tok)
            if nxt is None:
                nxt = len(weight)
                children[node][tok] = nxt
                children.append({})
                weight.append(0)
                token.append(tok)
            weight[nxt] += count
            node = nxt
    tokens: list[int] = []
    parents: list[int] = []
    # Heap entries: (-weight, trie node, draft index of its parent); trie node ids break ties
    # in insertion order, i.e. towards the more frequent continuation.
    heap = [(-weight[c], c, -1) for c in children[0].values()]
    heapq.heapify(heap)
    while heap and len(tokens) < max_nodes:
        _, node, parent = heapq.heappop(heap)
        tokens.append(token[node])
        parents.append(parent)
        here = len(tokens) - 1
        for c in children[node].values():
            heapq.heappush(heap, (-weight[c], c, here))
    return tokens, parents


def make_rest(cfg: ProposerConfig, target: LoadedModel) -> RestProposer:
    if cfg.datastore is None:
        raise SpecError(
            "the rest family needs --datastore PATH; build one with `specops datastores build ...`"
        )
    if not Path(cfg.datastore).is_file():
        raise SpecError(
            f"datastore {cfg.datastore} does not exist; build one with `specops datastores build ...`"
        )
    store = Datastore.load(cfg.datastore)
    if store.vocab_hash != vocab_fingerprint(target.tokenizer):
        raise SpecError(
            f"datastore {cfg.datastore} was built with another tokenizer "
            f"({store.meta.get('tokenizer') or 'unknown'}); rebuild it with the target's"
        )
    knobs = knob_values("rest", cfg)
    return RestProposer(
        store,
        depth=cfg.k,
        max_nodes=tree_nodes(int(knobs["nodes_per_depth"]), cfg.k),
        max_suffix=int(knobs["max_suffix"]),
        min_suffix=int(knobs["min_suffix"]),
    )
