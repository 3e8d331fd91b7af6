"""lookahead: Jacobi iteration over a window of guesses plus an n-gram pool it harvests
(Fu et al. 2024, arXiv:2402.02057); the target alone, no draft. Skipped for creative text."""

from __future__ import annotations

from speccatalog.costs import DraftCost
from speccatalog.families.base import CandidateLike, FamilySpec, Knob, Known, Shape

# (window, ngram, guesses)
SHAPES = ((5, 4, 5), (10, 5, 10), (15, 5, 15))
LOOKUP_S = 2.5e-3  # speccore's measured pool lookup and window update per step
POOL_BYTES = 1 << 20
# Chain-equivalent greedy acceptance: chat and code measured with speccore on smollm2
# (E[N] 1.51 / 1.81 at k=3), the others scaled like the copy families.
PRIORS = {
    "chat": 0.37, "code": 0.52, "rag": 0.50, "summarization": 0.50,
    "structured": 0.50, "reasoning": 0.40, "creative": 0.25, "long_context": 0.45,
}  # fmt: skip


def block_nodes(window: int, ngram: int, guesses: int) -> int:
    """Draft nodes of speccore's lookahead block: the Jacobi window plus the guess trie."""
    return (window - 1) + (ngram - 2) * window + guesses * (ngram - 1)


class Lookahead(FamilySpec):
    name = "lookahead"
    summary = "lookahead decoding: Jacobi iteration with an n-gram pool, no draft model"
    proposer = "speccore.proposers.lookahead:make_lookahead"
    default_k = 4
    knobs = (
        Knob("lookahead_window", 5, (5, 10, 15), "Jacobi window width (W)"),
        Knob("lookahead_ngram", 4, (3, 4, 5), "n-gram size harvested and verified (N)"),
        Knob("lookahead_guesses", 5, (5, 10, 15), "pool guesses verified per step (G)"),
    )
    copies_input = True
    skipped_for = frozenset({"creative"})

    def candidates(self, known: Known) -> list[Shape]:
        return [
            Shape(
                f"lookahead-w{window}-n{ngram}-g{guesses}",
                self.name,
                ngram - 1,
                options={"lookahead_window": window, "lookahead_ngram": ngram, "lookahead_guesses": guesses},
            )
            for window, ngram, guesses in SHAPES
        ]

    def draft_cost(self, candidate: CandidateLike, known: Known) -> DraftCost:
        options = candidate.options
        nodes = block_nodes(
            int(options.get("lookahead_window", 5)),
            int(options.get("lookahead_ngram", candidate.k + 1)),
            int(options.get("lookahead_guesses", 5)),
        )
        return DraftCost(fixed_bytes=POOL_BYTES, lookup_s=LOOKUP_S, verify_nodes=nodes)

    def prior(self, candidate: CandidateLike, known: Known, fingerprint: str) -> float:
        return PRIORS[fingerprint]


SPEC = Lookahead()
