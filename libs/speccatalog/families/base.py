"""What one speculative-decoding family is, for every part of specops that plans, prices,
renders or runs it: a :class:`FamilySpec`.

A family is one spec file (this package's ``ngram.py``, ``eagle.py``, ...) plus, when
speccore runs it, one proposer (``speccore.proposers.<family>``). Everything else —
the schema's family names, the CLI's methods, the predictor's catalog, costs and
priors, the engine flags of ``apply`` — loops over the specs; no code outside a
family's files branches on its name. A separately installed package adds a family
through the ``specops.families`` entry-point group (see :mod:`speccatalog.families`).

Glossary:

- *candidate*: one catalog point (family x draft x k x tree x options);
  ``specops_schemas.candidates.Candidate`` on the wire, :class:`Shape` while the
  catalog builds it, :class:`CandidateLike` where either will do.
- *draft source*: what ``Candidate.draft`` names for the family (:class:`DraftSource`).
- *knob*: a number the family's proposer reads (``ngram_min``), an integer unless its
  default is a float (``suffix_decoding_min_token_prob``), with its default and its search
  grid; *aliases* are other engines' or users' names for it.
- *prior*: the per-token acceptance ``a`` the predictor starts from for a greedy
  workload, before measured history refines it (``predictor.model`` explains ``a``).
- *refusal*: a one-line reason why a target, a workload or an engine rules a
  candidate out; ``None`` when nothing does.

Specs are torch-free and pure: every fact about the world (target, heads,
datastores) comes in through :class:`Known`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Protocol

from speccatalog.artifacts import is_head_id
from speccatalog.costs import DraftCost
from speccatalog.targets import DatastoreRef, HeadRef, TargetError, TargetInfo

# Draft refs that are not model ids: the target's first N layers, and artifacts speccore ships.
SELF_PREFIX = "self:"
BUILTIN_PREFIX = "builtin:"
# Engines a spec can name (specops_schemas.catalog.Engine's values).
SPECCORE, VLLM, SGLANG = "speccore", "vllm", "sglang"

Option = str | int | float | bool
KnobValue = int | float

_ID_SAFE = re.compile(r"[A-Za-z0-9_-]{1,40}")
_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


class FamilyError(ValueError):
    """A family, option or knob that does not exist or does not validate."""


class DraftUnavailable(TargetError):
    """A candidate names a draft, head or datastore the predictor does not know."""


class EngineRefusal(ValueError):
    """An engine cannot run a candidate; the message says why (apply answers it as a problem)."""


class DraftSource(StrEnum):
    """What ``Candidate.draft`` names for a family."""

    NONE = "none"  # nothing: the family drafts from the target alone
    MODEL = "model"  # a draft model: a model ref, a distilled draft's directory or self:N
    DATASTORE = "datastore"  # a REST datastore: a file or builtin:<workload>
    HEAD = "head"  # a trained head: a registry id, a directory or builtin:<name>


class CandidateLike(Protocol):
    """A catalog candidate: a :class:`Shape` or a ``specops_schemas`` Candidate."""

    @property
    def candidate_id(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def draft(self) -> str | None: ...
    @property
    def k(self) -> int: ...
    @property
    def tree(self) -> list[int] | tuple[int, ...] | None: ...
    @property
    def options(self) -> Mapping[str, Option]: ...


@dataclass(frozen=True, slots=True)
class Shape:
    """A candidate as a spec enumerates it (the predictor turns it into a wire Candidate)."""

    candidate_id: str
    family: str
    k: int
    draft: str | None = None
    tree: tuple[int, ...] | None = None
    options: Mapping[str, Option] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Knob:
    """A numeric option a family's proposer reads: an integer, or a float where the default is one."""

    name: str  # the option's name on a candidate and in the proposer's config
    default: KnobValue
    grid: tuple[KnobValue, ...]  # values a search (T2) tries
    help: str

    def coerce(self, value: object) -> KnobValue:
        """``value`` as this knob's type; FamilyError if it is not one (a float knob takes integers)."""
        if isinstance(self.default, float) and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, bool) or not isinstance(value, int):
            kind = "a number" if isinstance(self.default, float) else "an integer"
            raise FamilyError(f"option '{self.name}' must be {kind}, got {value!r}")
        return value


@dataclass(frozen=True, slots=True)
class Known:
    """What the catalog knows when it plans for one target: its drafts, heads and datastores."""

    target: TargetInfo
    heads: Mapping[str, HeadRef] = field(default_factory=dict)  # by head_id
    datastores: Mapping[str, DatastoreRef] = field(default_factory=dict)  # by datastore_id
    enable_cascade: bool = False

    def head(self, candidate: CandidateLike) -> HeadRef:
        head = self.heads.get(candidate.draft or "")
        if head is None or head.family != candidate.family:
            raise DraftUnavailable(f"no {candidate.family} head '{candidate.draft}' for {self.target.ref}")
        return head

    def datastore(self, candidate: CandidateLike) -> DatastoreRef:
        store = self.datastores.get(candidate.draft or "")
        if store is None:
            raise DraftUnavailable(f"no REST datastore '{candidate.draft}'")
        return store


# Model-based drafts gain on code and structured output and lose on creative text
# (EAGLE-3 Table 1: HumanEval tau 6.74 vs MT-bench 6.13); every model family scales by it.
MODEL_FINGERPRINT_FACTOR: dict[str, float] = {
    "chat": 1.0, "code": 1.08, "rag": 1.03, "summarization": 1.0,
    "structured": 1.08, "reasoning": 1.05, "creative": 0.85, "long_context": 0.97,
}  # fmt: skip


class FamilySpec:
    """Base of every family spec; a family file defines one subclass and its instance SPEC.

    Class attributes are the family's data; the methods are its small rules, each with
    a default that fits a family which drafts from the target alone and runs only on
    speccore.
    """

    name: ClassVar[str]
    summary: ClassVar[str]  # one line, shown in the CLI's help
    # "module:attribute" of speccore's proposer factory, (ProposerConfig, LoadedModel) ->
    # Proposer; None when speccore does not implement the family.
    proposer: ClassVar[str | None] = None
    draft_source: ClassVar[DraftSource] = DraftSource.NONE
    default_k: ClassVar[int] = 4  # draft tokens per step when the user gives none
    knobs: ClassVar[tuple[Knob, ...]] = ()
    aliases: ClassVar[Mapping[str, str]] = {}  # option name -> knob name
    # Options that configure other engines (rendered by vllm()/sglang()), which
    # speccore reads under its own names or not at all: ignored on speccore, reported.
    engine_options: ClassVar[frozenset[str]] = frozenset()
    # Drafts by copying text the target already saw (argmax-style drafts): sampling
    # lowers their acceptance more, and history rows of any draft describe them.
    copies_input: ClassVar[bool] = False
    takes_tree: ClassVar[bool] = False  # a static tree shape (Candidate.tree) is a valid choice
    # Drafts from earlier requests' outputs by design (a scope's cross-request pool, F-S1):
    # measured with one, which holds only other, earlier prompts' outputs (speccore.bench).
    cross_request: ClassVar[bool] = False
    # Head families: the trained-head artifacts (speccore.heads.artifact families) it
    # decodes, each with the version of the family it is (EAGLE-1 layer: 2, decoded with
    # EAGLE-2's dynamic tree; EAGLE-3: 3).
    head_artifacts: ClassVar[Mapping[str, int]] = {}
    engines: ClassVar[frozenset[str]] = frozenset({SPECCORE})
    # Python packages an engine needs beside itself to run the family (apply names them).
    engine_packages: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    skipped_for: ClassVar[frozenset[str]] = frozenset()  # workload fingerprints it is not offered for

    # --- the catalog -----------------------------------------------------------------

    def candidates(self, known: Known) -> list[Shape]:
        """Every configuration of this family the catalog offers for ``known.target``."""
        return []

    def refusal(self, candidate: CandidateLike, known: Known, fingerprint: str) -> str | None:
        """Why the workload or the target rules ``candidate`` out."""
        if fingerprint in self.skipped_for:
            return f"{self.name} is skipped for {fingerprint} workloads"
        return None

    def engine_refusal(self, candidate: CandidateLike, engine: str, *, gpu_kind: str) -> str | None:
        """Why ``engine`` cannot run ``candidate``."""
        if engine not in self.engines:
            return f"{engine} does not implement {self.name}"
        if engine != SPECCORE and (candidate.draft or "").startswith(SELF_PREFIX):
            return f"{engine} cannot build a layer-truncated self draft"
        if engine != SPECCORE and is_head_id(candidate.draft):
            return f"{engine} cannot load a T3 head in speccore's layout"
        if engine == VLLM and candidate.tree:
            return "vLLM takes no static draft tree (speculative_token_tree was removed)"
        return None

    # --- the predictor's model ---------------------------------------------------------

    def draft_cost(self, candidate: CandidateLike, known: Known) -> DraftCost:
        """Memory and work of ``candidate`` beside the target; DraftUnavailable for an unknown source."""
        raise DraftUnavailable(f"no cost model for family '{self.name}'")

    def prior(self, candidate: CandidateLike, known: Known, fingerprint: str) -> float:
        """Per-token acceptance for a greedy ``fingerprint`` workload, before any measurement."""
        raise DraftUnavailable(f"no acceptance prior for family '{self.name}'")

    # --- engines ---------------------------------------------------------------------------

    def vllm(self, candidate: CandidateLike, draft_path: str | None) -> dict[str, Any]:
        """vLLM's ``--speculative-config`` fields; EngineRefusal if vLLM cannot run it.
        ``draft_path``: what the engine loads for the candidate's draft (see external_draft)."""
        raise EngineRefusal(f"vLLM cannot run this candidate: it has no {self.name} method")

    def sglang(self, candidate: CandidateLike, draft_path: str | None) -> dict[str, Any]:
        """SGLang's ``--speculative-*`` settings (SglangConfig fields); EngineRefusal if it cannot."""
        raise EngineRefusal(f"SGLang cannot run this candidate: it has no {self.name} algorithm")

    def speccore_args(self, candidate: CandidateLike, paths: Mapping[str, str]) -> list[str]:
        """``specops generate`` flags that decode ``candidate`` as it was measured."""
        if self.proposer is None:
            raise EngineRefusal(f"speccore cannot run this candidate: {self.name} is not implemented yet")
        draft = candidate.draft
        if self.draft_source == DraftSource.HEAD:
            if not draft:
                raise EngineRefusal(f"speccore cannot run this candidate: {self.name} needs a trained head")
            # What was measured (speccore.candidates): the shape, or a chain of k.
            shape = list(candidate.tree) if candidate.tree else [1] * candidate.k
            flags = ["--head", paths.get(draft, draft), "--tree-shape", ",".join(map(str, shape))]
            return ["--method", self.name, *flags]
        args = ["--method", self.name, "--k", str(candidate.k)]
        if draft and self.draft_source == DraftSource.DATASTORE and not draft.startswith(BUILTIN_PREFIX):
            args += ["--datastore", paths.get(draft, draft)]
        elif draft and self.draft_source == DraftSource.MODEL:
            args += ["--draft", paths.get(draft, draft)]
        return args

    # --- speccore's configuration ------------------------------------------------------------

    def knob_values(self, options: Mapping[str, Option]) -> dict[str, KnobValue]:
        """The proposer's knobs: the candidate's options (aliases resolved) over the defaults.

        Options for other engines are skipped; any other unknown name is refused, so
        that a misspelt knob is not measured as its default.
        """
        known = {k.name: k for k in self.knobs}
        values = {k.name: k.default for k in self.knobs}
        given: dict[str, str] = {}  # knob -> the option name that set it
        for key, value in options.items():
            name = self.aliases.get(key, key)
            if key in self.engine_options:
                continue
            if name not in known:
                names = ", ".join(sorted({*known, *self.aliases})) or "none"
                raise FamilyError(f"unknown option '{key}' for {self.name}; it reads {names}")
            coerced = known[name].coerce(value)
            if name in given and values[name] != coerced:
                raise FamilyError(f"options '{given[name]}' and '{key}' both set {name}, to different values")
            given[name] = key
            values[name] = coerced
        self.check_knobs(values)
        return values

    def check_knobs(self, values: Mapping[str, KnobValue]) -> None:
        """FamilyError if the knob values do not make sense together (the proposer may check more)."""


def slug(ref: str) -> str:
    """A draft ref as a candidate-id part: `self:15` -> `self15`, safe refs unchanged, others hashed."""
    if ref.startswith(SELF_PREFIX) and ref.removeprefix(SELF_PREFIX).isdigit():
        return "self" + ref.removeprefix(SELF_PREFIX)
    if _ID_SAFE.fullmatch(ref):
        return ref
    # Anything else gets a hash so that refs differing only in unsafe characters stay distinct.
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "-", ref).strip("-")[:40]
    return f"{cleaned}-{hashlib.sha256(ref.encode()).hexdigest()[:8]}".lstrip("-")


def shape_label(tree: tuple[int, ...] | list[int] | None) -> str:
    """`t4x2x1` for a tree shape, `chain` for none."""
    return "t" + "x".join(map(str, tree)) if tree else "chain"


def int_option(candidate: CandidateLike, key: str) -> int | None:
    """A positive integer option of ``candidate``, or None; EngineRefusal for any other value."""
    value = candidate.options.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value or value < 1:
        raise EngineRefusal(f"option {key}={value!r} of {candidate.candidate_id} is not a positive integer")
    return int(value)


def external_draft(candidate: CandidateLike, engine: str, draft_path: str | None) -> str:
    """What vLLM or SGLang loads for the candidate's draft; EngineRefusal when they cannot.

    ``draft_path`` is the registry's path for the draft (heads, datastores), or None.
    """
    draft = candidate.draft
    if not draft:
        raise EngineRefusal(
            f"{engine} cannot run this candidate: a {candidate.family} candidate needs a draft model or head"
        )
    if draft.startswith(SELF_PREFIX):
        raise EngineRefusal(
            f"{engine} cannot run this candidate: '{draft}' is a layer-truncated copy of the target "
            "that only speccore builds"
        )
    # What the engine does load instead: vLLM an exported EAGLE-3 head; SGLang only its own
    # EAGLE-3 checkpoints (LlamaForCausalLMEagle3), which specops does not write.
    instead = (
        "train it as EAGLE-3 (`specops heads train --family eagle3`) and `specops heads export` it"
        if engine == "vLLM"
        else f"{engine} loads only its own EAGLE-3 checkpoints, which `specops heads export` does not write"
    )
    if is_head_id(draft):
        raise EngineRefusal(
            f"{engine} cannot run this candidate: '{draft}' is a T3 head in speccore's layout; "
            f"apply it to speccore, or {instead}"
        )
    if draft.startswith(BUILTIN_PREFIX) and draft_path is None:
        raise EngineRefusal(
            f"{engine} cannot run this candidate: '{draft}' is a head speccore ships in its own layout; "
            f"apply it to speccore, or {instead}"
        )
    return draft_path or draft


def sglang_chain(candidate: CandidateLike, algorithm: str, draft_path: str | None = None) -> dict[str, Any]:
    """SGLang's settings for a chain of k drafts (only EAGLE drafts a tree there); the
    draft-token count includes the verified root."""
    if candidate.tree:
        raise EngineRefusal(
            f"SGLang cannot run this candidate: only EAGLE drafts a tree; {candidate.family} must be a chain"
        )
    return {
        "speculative_algorithm": algorithm,
        "speculative_draft_model_path": draft_path,
        "speculative_num_steps": candidate.k,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": candidate.k + 1,
    }


def check_name(name: str) -> str:
    """A family name: lowercase letters, digits and underscores, starting with a letter."""
    if not _NAME.fullmatch(name):
        raise FamilyError(f"invalid family name {name!r}: use {_NAME.pattern}")
    return name
