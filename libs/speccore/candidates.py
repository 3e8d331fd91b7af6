"""A catalog candidate as a speccore engine configuration, for every service that
builds one (the benchmark runner measures it, the quality gate decodes with it).

- ``Candidate.draft`` is the datastore of a ``rest`` candidate, the head directory
  of a ``medusa`` or ``eagle`` one (or ``builtin:<name>``, a head speccore ships for
  the target: ``speccore.heads.builtin``) and the draft model otherwise.
- Options named like a ``ProposerConfig`` field (or an alias in ``OPTION_ALIASES``)
  are read and must be integers. Options for other engines (``OTHER_ENGINE_OPTIONS``:
  vLLM's ``prompt_lookup_min``, the catalog's ``eagle_version``, ...) are ignored here
  and listed by ``ignored_options`` so that the caller can report them; any other
  name is refused, so that a misspelt knob is not measured as the default.
- A tree shape (``[4, 2, 1]``: 4 children of the pending token, 2 below each of
  those, 1 below each of those) is speccore's ``tree_shape`` for ``medusa`` and
  ``eagle`` (see ProposerConfig); without one they draft a chain of k tokens, as vLLM
  and SGLang run such a candidate. Other families take no tree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from speccore import proposers
from speccore.errors import SpecError
from speccore.proposers.base import ProposerConfig

# Candidate option names read as ProposerConfig fields besides the fields' own names.
OPTION_ALIASES = {"min_match": "ngram_min", "max_match": "ngram_max"}
# Options the apply step renders for vLLM or SGLang (gateway.engine_flags) and names
# those engines use for settings speccore reads under its own names.
OTHER_ENGINE_OPTIONS = frozenset(
    {
        "eagle_version",
        "draft_tensor_parallel_size",
        "num_draft_tokens",
        "prompt_lookup_min",
        "prompt_lookup_max",
        "medium",
    }
)
# Fields a candidate sets through its k, draft and tree, never through options.
_FROM_CANDIDATE = frozenset({"k", "draft", "datastore", "head", "tree_shape"})
_KNOBS = frozenset(f.name for f in dataclasses.fields(ProposerConfig)) - _FROM_CANDIDATE


class Candidate(Protocol):
    """A catalog candidate (specops_schemas.candidates.Candidate is one)."""

    @property
    def family(self) -> str: ...
    @property
    def draft(self) -> str | None: ...
    @property
    def k(self) -> int: ...
    @property
    def tree(self) -> list[int] | None: ...
    @property
    def options(self) -> Mapping[str, str | int | float | bool]: ...


@dataclass(frozen=True, slots=True)
class SpeccoreCandidate:
    family: str  # the speccore method
    config: ProposerConfig


def ignored_options(candidate: Candidate) -> list[str]:
    """The candidate's options speccore does not read (flags for other engines)."""
    return sorted(key for key in candidate.options if key in OTHER_ENGINE_OPTIONS)


def speccore_candidate(candidate: Candidate) -> SpeccoreCandidate:
    """speccore's method and ProposerConfig for ``candidate``; SpecError says why there is none."""
    family = str(candidate.family)
    proposers.load_all()
    if family not in proposers.REGISTRY:
        runnable = ", ".join(sorted(proposers.REGISTRY))
        raise SpecError(f"speccore cannot run family '{family}'; it runs {runnable}")
    knobs: dict[str, Any] = {}
    for key, value in candidate.options.items():
        name = OPTION_ALIASES.get(key, key)
        if key in OTHER_ENGINE_OPTIONS:
            continue
        if name not in _KNOBS:
            known = ", ".join(sorted(_KNOBS | set(OPTION_ALIASES)))
            raise SpecError(f"unknown option '{key}'; speccore reads {known}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"option '{key}' must be an integer, got {value!r}")
        knobs[name] = value
    is_rest = family == "rest"
    is_head = family in proposers.HEAD_FAMILIES
    draft = candidate.draft
    fields: dict[str, Any] = {
        "k": candidate.k,
        "draft": None if is_rest or is_head else draft,
        "datastore": draft if is_rest else None,
        "head": draft if is_head else None,
        **knobs,
    }
    fields.update(_tree_fields(family, candidate))
    return SpeccoreCandidate(family, ProposerConfig(**fields))


def _tree_fields(family: str, candidate: Candidate) -> dict[str, Any]:
    if family not in proposers.HEAD_FAMILIES:
        if candidate.tree is not None:
            raise SpecError(f"speccore's {family} proposer takes no tree shape; send tree=null")
        return {}
    # Without a shape a head candidate drafts a chain of k, as vLLM and SGLang run it.
    return {"tree_shape": tuple(candidate.tree) if candidate.tree else (1,) * candidate.k}
