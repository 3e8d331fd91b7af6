"""Drafting families, registered by name; the engine looks them up in REGISTRY."""

from importlib import import_module

from speccore.proposers.base import REGISTRY, DraftTree, Proposer, ProposerConfig, StepContext, StepOutcome

FAMILIES = ("ngram", "rest", "draft_model", "lookahead")
# Families that decode a trained head (--head DIR); the predictor does not plan them for speccore yet.
HEAD_FAMILIES = ("medusa", "eagle")

# Draft depth per family when the user gives no --k (HF baselines use the same table).
# ngram: on speccore's CPU kernels a verify block of up to 6 tokens costs what one token
# costs (oneDNN runs up to 6 rows in one pass; 7-12 rows cost 1.1-1.3x), and prompt
# lookup's mean acceptance length grows little past 5 drafts (HumanEval, smollm2: 1.73 at
# k=5, 1.82 at k=10), so 5 is the fastest; vLLM's own ngram examples use 5 as well.
DEFAULT_K = {
    "ngram": 5,
    "rest": 8,
    "draft_model": 4,
    "lookahead": 4,
    "eagle": 3,  # tree depth
    "hf_prompt_lookup": 10,
    "hf_assisted": 4,
}

__all__ = [
    "DEFAULT_K",
    "FAMILIES",
    "HEAD_FAMILIES",
    "REGISTRY",
    "DraftTree",
    "Proposer",
    "ProposerConfig",
    "StepContext",
    "StepOutcome",
]


def load_all() -> None:
    """Import every family module so that each registers itself."""
    for family in (*FAMILIES, *HEAD_FAMILIES):
        import_module(f"speccore.proposers.{family}")
