"""Lookahead decoding: Jacobi iteration plus an n-gram pool, target model only.

Fu et al., 2024, "Break the Sequential Dependency of LLM Inference Using
Lookahead Decoding" (https://arxiv.org/abs/2402.02057).

Glossary (W = ``lookahead_window``, N = ``lookahead_ngram``, G = ``lookahead_guesses``):

- **window**: N-1 levels of W guessed tokens each, the last N-1 iterates of a greedy
  Jacobi iteration over the W positions after the pending token. ``levels[l][c]``
  guesses the token at offset ``c + l`` after the pending token (offset 0 is the
  pending token itself, so ``levels[0][0]`` *is* the pending token).
- **diagonal**: ``levels[0][c], levels[1][c], ..., levels[N-2][c]`` plus the
  target's argmax after ``levels[N-2][c]`` is an N-gram the target itself wrote one
  token at a time; these are harvested into the pool every step.
- **pool**: per row, first token -> up to G recent (N-1)-token continuations,
  most recent first. Seeded with the prompt's own N-grams and fed with the N-grams
  of the emitted text, so it also does prompt lookup on code and templates.
- **guesses**: the pool's continuations of the pending token, drafted as a trie
  below the root; the only acceptable nodes.

Draft tree of one row (draft-relative node indices; the root is the pending token)::

    level 0:  root -> n[0] -> n[1] -> ... -> n[W-2]          (levels[0][1:], a chain)
    level l:  levels[l][c] hangs below levels[l-1][c]         (l = 1 .. N-2)
    guesses:  a trie of pool continuations hanging from the root (acceptable)

so ``levels[l][c]`` attends to the context, ``levels[0][0..c]`` and the diagonal
above it, and sits at depth ``c + l``: exactly the Jacobi dependency pattern of the
paper's lookahead mask. Window nodes are ``acceptable=False``. The layout of the
window part is the same for every row, so ``observe`` reads the Jacobi update at
fixed block indices.

After each step the window moves forward one position whatever was accepted (the
reference implementation's default): level l+1 becomes level l, the new argmax row
becomes the last level and the new pending token replaces ``levels[0][0]``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from speccore.errors import SpecError
from speccore.proposers.base import (
    MAX_K,
    DraftTree,
    Proposer,
    ProposerConfig,
    StepContext,
    StepOutcome,
    knob_values,
)
from speccore.state import Sequence

if TYPE_CHECKING:
    from speccore.models import LoadedModel

Pool = dict[int, list[tuple[int, ...]]]


def window_parents(width: int, ngram: int) -> list[int]:
    """Draft-relative parents of the window nodes (levels[0][1:], then levels 1..N-2 column by column)."""
    parents = list(range(-1, width - 2))  # the level-0 chain below the root
    # levels[l][c] is draft node width-1 + (l-1)*width + c; levels[0][c] is node c-1 (the root for c = 0).
    for level in range(1, ngram - 1):
        for col in range(width):
            parents.append(col - 1 if level == 1 else width - 1 + (level - 2) * width + col)
    return parents


def last_level_blocks(width: int, ngram: int) -> list[int]:
    """Block indices of levels[N-2][0..W-1], whose argmax is the next Jacobi iterate."""
    if ngram == 2:
        return list(range(width))  # the root and the level-0 chain
    first = width + (ngram - 3) * width  # block index = draft index + 1
    return list(range(first, first + width))


def add_ngram(pool: Pool, key: int, cont: tuple[int, ...], cap: int) -> None:
    """Put ``cont`` first among ``key``'s continuations, dropping a duplicate and the oldest beyond cap."""
    conts = pool.get(key)
    if conts is None:
        pool[key] = [cont]
        return
    if conts and conts[0] == cont:
        return
    if cont in conts:
        conts.remove(cont)
    conts.insert(0, cont)
    del conts[cap:]


def add_text(pool: Pool, tokens: list[int], ngram: int, cap: int, start: int = 0) -> None:
    """Add every N-gram of ``tokens`` that ends at index ``start`` or later, in text order."""
    for end in range(max(start, ngram - 1), len(tokens)):
        add_ngram(pool, tokens[end - ngram + 1], tuple(tokens[end - ngram + 2 : end + 1]), cap)


def harvest(levels: list[list[int]], new: list[int]) -> list[tuple[int, tuple[int, ...]]]:
    """(first token, continuation) of every diagonal N-gram, column 0 first."""
    return [
        (levels[0][col], tuple(level[col] for level in levels[1:]) + (tok,)) for col, tok in enumerate(new)
    ]


def shift_window(levels: list[list[int]], new: list[int], pending: int) -> list[list[int]]:
    """The window one Jacobi step and one position later (new[c] guesses offset c + N-1 before the move)."""
    shifted = [list(level) for level in levels[1:]] + [list(new)]
    shifted[0][0] = pending
    return shifted


def guess_trie(conts: list[tuple[int, ...]], depth: int, first: int) -> tuple[list[int], list[int]]:
    """Tokens and draft-relative parents of the continuations cut to ``depth``, prefixes shared.

    ``first`` is the draft index the trie starts at; its top nodes hang from the root.
    """
    tokens: list[int] = []
    parents: list[int] = []
    nodes: dict[tuple[int, ...], int] = {}
    for cont in conts:
        parent = -1
        for i in range(min(depth, len(cont))):
            prefix = cont[: i + 1]
            node = nodes.get(prefix)
            if node is None:
                node = first + len(tokens)
                nodes[prefix] = node
                tokens.append(cont[i])
                parents.append(parent)
            parent = node
    return tokens, parents


def initial_window(context: list[int], width: int, ngram: int, rng: random.Random) -> list[list[int]]:
    """Window whose diagonals start as N-1 consecutive context tokens, at random context places.

    The Jacobi iteration may start from anything; real text makes the first
    harvested N-grams plausible instead of noise.
    """
    levels = [[0] * width for _ in range(ngram - 1)]
    for col in range(width):
        start = rng.randrange(max(len(context) - ngram + 2, 1))
        for level in range(ngram - 1):
            levels[level][col] = context[min(start + level, len(context) - 1)]
    levels[0][0] = context[-1]
    return levels


@dataclass(slots=True)
class _Row:
    seq: Sequence  # the request this state belongs to (rows are matched by identity)
    levels: list[list[int]]
    pool: Pool = field(default_factory=dict)
    absorbed: int = 0  # token_ids already turned into pool N-grams
    drafted: bool = False  # the last proposal carried this row's window


class LookaheadProposer(Proposer):
    family = "lookahead"
    row_state = ("_rows",)

    def __init__(self, cfg: ProposerConfig) -> None:
        knobs = knob_values(self.family, cfg)
        width, ngram = int(knobs["lookahead_window"]), int(knobs["lookahead_ngram"])
        guesses = int(knobs["lookahead_guesses"])
        if width < 1 or ngram < 2 or guesses < 1:
            raise SpecError(
                f"lookahead needs window >= 1, ngram >= 2 and guesses >= 1, got {width}, {ngram}, {guesses}"
            )
        self.width, self.ngram, self.guesses = width, ngram, guesses
        self.depth = min(ngram - 1, cfg.k)
        self._window_parents = window_parents(width, ngram)
        self._last_level = last_level_blocks(width, ngram)
        nodes = len(self._window_parents) + guesses * self.depth
        if nodes > MAX_K:
            raise SpecError(
                f"lookahead window {width} x ngram {ngram} with {guesses} guesses drafts {nodes} tokens per "
                f"step; speccore drafts at most {MAX_K}"
            )
        self._rows: list[_Row | None] = []

    def start(self, seqs: list[Sequence], features: torch.Tensor | None = None) -> None:
        self._rows = [self._new_row(seq) for seq in seqs]

    def _new_row(self, seq: Sequence) -> _Row:
        context = seq.token_ids
        rng = random.Random(hash(tuple(context)))
        row = _Row(seq, initial_window(context, self.width, self.ngram, rng))
        add_text(row.pool, context, self.ngram, self.guesses)
        row.absorbed = len(context)
        return row

    def _row(self, b: int, seq: Sequence) -> _Row:
        if b >= len(self._rows):
            self._rows.extend([None] * (b + 1 - len(self._rows)))
        row = self._rows[b]
        if row is None or row.seq is not seq:
            row = self._rows[b] = self._new_row(seq)
        return row

    def propose(self, seqs: list[Sequence], ctx: StepContext) -> DraftTree:
        per_row: list[tuple[list[int], list[int]] | None] = []
        for b, seq in enumerate(seqs):
            if seq.finished:
                per_row.append(None)
                if b < len(self._rows) and (idle := self._rows[b]) is not None:
                    idle.drafted = False
                continue
            row = self._row(b, seq)
            pending = seq.pending
            row.levels[0][0] = pending
            window = row.levels[0][1:] + [tok for level in row.levels[1:] for tok in level]
            depth = min(self.depth, seq.remaining - 1)
            conts = row.pool.get(pending, [])[: self.guesses] if depth > 0 else []
            toks, pars = guess_trie(conts, depth, len(window))
            per_row.append((window + toks, self._window_parents + pars))
            row.drafted = True
        return self._pack(per_row)

    def _pack(self, per_row: list[tuple[list[int], list[int]] | None]) -> DraftTree:
        n = max((len(r[0]) for r in per_row if r is not None), default=0)
        tokens = torch.zeros(len(per_row), n, dtype=torch.long)
        parents = torch.full((len(per_row), n), -1, dtype=torch.long)
        acceptable = torch.zeros(len(per_row), n, dtype=torch.bool)
        n_window = len(self._window_parents)
        for b, r in enumerate(per_row):
            if r is None:
                continue
            toks, pars = r
            tokens[b, : len(toks)] = torch.tensor(toks, dtype=torch.long)
            parents[b, : len(pars)] = torch.tensor(pars, dtype=torch.long)
            acceptable[b, n_window : len(toks)] = True
        return DraftTree(tokens=tokens, parents=parents, acceptable=acceptable)

    def observe(self, seqs: list[Sequence], outcome: StepOutcome) -> None:
        jacobi: list[list[int]] | None = None
        for b, seq in enumerate(seqs):
            row = self._rows[b] if b < len(self._rows) else None
            if row is None or row.seq is not seq:
                continue
            if row.drafted:
                if jacobi is None:
                    # outcome.logits: [batch, q, vocab] -> argmax at the last level, [batch, W]
                    jacobi = outcome.logits[:, self._last_level].argmax(-1).tolist()
                new = jacobi[b]
                for key, cont in harvest(row.levels, new):
                    add_ngram(row.pool, key, cont, self.guesses)
                row.levels = shift_window(row.levels, new, seq.pending)
                row.drafted = False
            self._absorb(row, seq)

    def _absorb(self, row: _Row, seq: Sequence) -> None:
        """Pool the N-grams ending in newly emitted tokens; added after the harvest, real text ranks first."""
        total = len(seq.prompt_ids) + len(seq.output_ids)
        if total <= row.absorbed:
            return
        start = max(row.absorbed - self.ngram + 1, 0)
        lp = len(seq.prompt_ids)
        tail = seq.output_ids[start - lp :] if start >= lp else seq.prompt_ids[start:] + seq.output_ids
        add_text(row.pool, tail, self.ngram, self.guesses, row.absorbed - start)
        row.absorbed = total

    def extra_memory_bytes(self) -> int:
        # A tuple of m small ints costs about 40 + 8m bytes, a list slot 8, a dict entry ~100 with its list.
        total = 0
        for row in self._rows:
            if row is None:
                continue
            for conts in row.pool.values():
                total += 100 + sum(48 + 8 * len(c) for c in conts)
        return total


def make_lookahead(cfg: ProposerConfig, target: LoadedModel) -> LookaheadProposer:
    return LookaheadProposer(cfg)
