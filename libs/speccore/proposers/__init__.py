"""Drafting families: each family's spec (speccatalog.families) names its proposer factory
here, ``(ProposerConfig, LoadedModel) -> Proposer``; the engine builds proposers through
:func:`make_proposer` and never branches on a family name."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from speccatalog import families
from speccatalog.families.base import FamilySpec
from speccore.errors import SpecError
from speccore.proposers.base import DraftTree, Proposer, ProposerConfig, StepContext, StepOutcome, knob_values

if TYPE_CHECKING:
    from speccore.models import LoadedModel

# Plain decoding: the engine's loop with an empty draft.
NONE = "none"
# k of plain decoding, which drafts nothing; any positive value would do.
_NONE_K = 5


def runnable() -> tuple[str, ...]:
    """The methods speccore decodes with: plain decoding, then every family with a proposer."""
    return (NONE, *families.runnable())


def default_k(method: str) -> int:
    """Draft tokens per step when the user gives none: the family's own default."""
    return _NONE_K if method == NONE else spec_of(method).default_k


def spec_of(method: str) -> FamilySpec:
    """The family spec of a method speccore runs; SpecError naming the methods it runs."""
    spec = families.families().get(method)
    if spec is None:
        raise SpecError(f"unknown method '{method}'; choose one of: {', '.join(runnable())}")
    if spec.proposer is None:
        raise SpecError(f"speccore cannot run family '{method}'; it runs {', '.join(families.runnable())}")
    return spec


def make_proposer(method: str, config: ProposerConfig, target: LoadedModel) -> Proposer:
    """The proposer of ``method`` (its spec's factory) for ``target``."""
    spec = spec_of(method)
    module, _, attribute = (spec.proposer or "").partition(":")
    try:
        factory = getattr(import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise SpecError(
            f"family '{method}' names proposer '{spec.proposer}', which does not load: {exc}"
        ) from exc
    proposer: Proposer = factory(config, target)
    return proposer


__all__ = [
    "NONE",
    "DraftTree",
    "Proposer",
    "ProposerConfig",
    "StepContext",
    "StepOutcome",
    "default_k",
    "knob_values",
    "make_proposer",
    "runnable",
    "spec_of",
]
