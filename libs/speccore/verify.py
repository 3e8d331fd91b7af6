"""Lossless verification of a block of draft candidates against target logits.

Glossary (per row, per verify step):
- block: the pending token (root, index 0) followed by the draft nodes (``Block``).
- accepted tokens: draft nodes on the path the target agrees with.
- recovered token: at the first rejection, a token drawn from the residual
  distribution norm(max(0, p - q)) (Leviathan et al. 2023, arXiv 2211.17192;
  Chen et al. 2023, arXiv 2302.01318).
- bonus token: when a leaf is reached, a token drawn from the target at that leaf.
  Either the recovered or the bonus token becomes the new pending token.
- inactive row: a row that finished before this step; it accepts nothing.

Greedy (temperature 0) accepts a child whose token equals the target argmax.
Sampling walks the tree: at a node, children are tried in order; a child d is
accepted with probability min(1, p(d) / q(d)), else p becomes the residual and
the next sibling is tried (SpecInfer's multi-candidate rule). Deterministic
drafts have a one-hot q. The output distribution is exactly the target's.

Lossy option, off by default and labelled as such: ``lossy_accept_threshold`` t also
accepts a draft token the rule above rejects when the target gives it probability
>= t (greedy: softmax of the raw logits; sampling: the sampled distribution). The
output then no longer follows the target; the option exists so the quality gate
can be shown to catch such shortcuts, and must fail its `exact` method.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speccore.sampling import SamplingParams, probs_from_logits, sample
from speccore.tree import children_lists


@dataclass(slots=True)
class Block:
    """One verify step's candidates for a batch: the pending token, then the draft nodes."""

    tokens: torch.Tensor  # [batch, q] int64 block tokens, root first
    parents: torch.Tensor  # [batch, q] int64 block-relative parents, root -1
    acceptable: torch.Tensor  # [batch, q] bool, root False
    draft_probs: torch.Tensor | None = None  # [batch, q-1, vocab] q each draft node was sampled from


@dataclass(slots=True)
class Verdict:
    """Per row, what the target keeps of a block."""

    accepted_nodes: list[list[int]]  # per row: block indices of the accepted path, root first
    next_tokens: list[int]  # per row: recovered or bonus token


def acceptance_probability(p_token: float, q_token: float) -> float:
    """Probability of keeping a draft token: min(1, p/q)."""
    return min(1.0, p_token / q_token) if q_token > 0 else 0.0


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)); falls back to p when p == q everywhere."""
    r = torch.clamp(p - q, min=0.0)
    total = r.sum()
    return r / total if total > 0 else p


def verify_block(
    block: Block,
    logits: torch.Tensor,  # [batch, q, vocab] target logits at every block node
    params: SamplingParams,
    generators: list[torch.Generator | None],
    *,
    active: list[bool] | None = None,  # per row; inactive rows accept nothing (path [0], next 0)
    lossy_accept_threshold: float | None = None,
) -> Verdict:
    toks = block.tokens.tolist()
    parents = block.parents.tolist()
    ok = block.acceptable.tolist()
    greedy_ids = logits.argmax(-1).tolist() if params.greedy else None
    lossy = lossy_accept_threshold
    loose_probs = logits.softmax(-1) if lossy is not None and params.greedy else None  # [batch, q, vocab]
    paths: list[list[int]] = []
    nexts: list[int] = []
    for row in range(len(toks)):
        if active is not None and not active[row]:
            paths.append([0])
            nexts.append(0)
            continue
        kids = [[c for c in cs if ok[row][c]] for cs in children_lists(parents[row])]
        if greedy_ids is not None:
            row_p = loose_probs[row] if loose_probs is not None else None
            path, nxt = _walk_greedy(greedy_ids[row], toks[row], kids, loose_probs=row_p, lossy=lossy)
        else:
            row_q = block.draft_probs[row] if block.draft_probs is not None else None
            path, nxt = _walk_sampled(
                logits[row], toks[row], kids, params, generators[row], q_probs=row_q, lossy=lossy
            )
        paths.append(path)
        nexts.append(nxt)
    return Verdict(accepted_nodes=paths, next_tokens=nexts)


def _walk_greedy(
    argmax: list[int],
    toks: list[int],
    kids: list[list[int]],
    *,
    loose_probs: torch.Tensor | None = None,  # [q, vocab], only with the lossy threshold
    lossy: float | None = None,
) -> tuple[list[int], int]:
    node, path = 0, [0]
    while True:
        target = argmax[node]
        match = next((c for c in kids[node] if toks[c] == target), None)
        if match is None and loose_probs is not None and lossy is not None:
            match = next((c for c in kids[node] if float(loose_probs[node, toks[c]]) >= lossy), None)
        if match is None:
            return path, target
        node = match
        path.append(node)


def _walk_sampled(
    logits: torch.Tensor,  # [q, vocab]
    toks: list[int],
    kids: list[list[int]],
    params: SamplingParams,
    gen: torch.Generator | None,
    *,
    q_probs: torch.Tensor | None,  # [q-1, vocab] or None for deterministic drafts
    lossy: float | None = None,
) -> tuple[list[int], int]:
    node, path = 0, [0]
    while True:
        p = p_target = probs_from_logits(logits[node], params)
        for child in kids[node]:
            d = toks[child]
            q = q_probs[child - 1] if q_probs is not None else _one_hot(d, p)
            u = float(torch.rand((), generator=gen))
            if u < acceptance_probability(float(p[d]), float(q[d])):
                break
            if lossy is not None and float(p_target[d]) >= lossy:
                break
            p = residual(p, q)
        else:
            return path, sample(p, gen)
        node = child
        path.append(node)


def _one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q
