"""A catalog candidate as a speccore engine configuration, for every service that
builds one (the benchmark runner measures it, the quality gate decodes with it).

The family's spec (speccatalog.families) says how:

- ``Candidate.draft`` goes where its draft source is read: a draft model to
  ``ProposerConfig.draft``, a datastore to ``datastore``, a trained head (or
  ``builtin:<name>``, a head speccore ships for the target) to ``head``.
- Options are the family's knobs (or their aliases) and must be integers. Options
  any family renders for other engines (vLLM's ``prompt_lookup_min``, the catalog's
  ``eagle_version``, ...) are ignored here and listed by ``ignored_options`` so that
  the caller can report them; any other name is refused, so that a misspelt knob is
  not measured as the default.
- A family that takes a tree shape (``[4, 2, 1]``: 4 children of the pending token, 2
  below each of those, 1 below each of those) drafts it as speccore's ``tree_shape``,
  or a chain of k tokens without one, as vLLM and SGLang run such a candidate. Other
  families take no tree.
"""

from __future__ import annotations

from dataclasses import dataclass

from speccatalog import families
from speccatalog.families.base import CandidateLike, DraftSource, FamilyError
from speccore import proposers
from speccore.errors import SpecError
from speccore.proposers.base import ProposerConfig


@dataclass(frozen=True, slots=True)
class SpeccoreCandidate:
    family: str  # the speccore method
    config: ProposerConfig
    source: DraftSource  # what the candidate's draft named (its family's draft source)


def ignored_options(candidate: CandidateLike) -> list[str]:
    """The candidate's options speccore does not read (flags for other engines)."""
    return sorted(key for key in candidate.options if key in families.engine_options())


def speccore_candidate(candidate: CandidateLike) -> SpeccoreCandidate:
    """speccore's method and ProposerConfig for ``candidate``; SpecError says why there is none."""
    family = str(candidate.family)
    spec = proposers.spec_of(family)
    skipped = families.engine_options()
    options = {key: value for key, value in candidate.options.items() if key not in skipped}
    try:
        knobs = spec.knob_values(options)
    except FamilyError as exc:
        raise SpecError(str(exc)) from None
    source = spec.draft_source
    draft = candidate.draft
    if source == DraftSource.MODEL and not draft:
        raise SpecError(f"{family} needs a draft: a model ref or self:<layers>")
    tree: tuple[int, ...] | None = None
    if spec.takes_tree:
        tree = tuple(candidate.tree) if candidate.tree else (1,) * candidate.k
    elif candidate.tree is not None:
        raise SpecError(f"speccore's {family} proposer takes no tree shape; send tree=null")
    config = ProposerConfig(
        k=candidate.k,
        draft=draft if source == DraftSource.MODEL else None,
        datastore=draft if source == DraftSource.DATASTORE else None,
        head=draft if source == DraftSource.HEAD else None,
        tree_shape=tree,
        knobs=knobs,
    )
    return SpeccoreCandidate(family, config, source)
