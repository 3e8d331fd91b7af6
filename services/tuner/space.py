"""The search space of a T2 session, built from its T1 run's candidates table; pure.

The T1 run's candidates are what the predictor kept after pruning for the target,
engine and workload: the catalog for this session. The space has

- `family`: the families present (intersected with the request's `families`);
- per family f: `f.draft` (the drafts seen; `none` for families that draft from the
  target alone), `f.tree` for tree families (the shapes seen and `chain`, encoded as
  `4x2x1`), `f.k` (1 .. max(2 x the largest k seen, the family's default k), at most
  16; asked only for a chain: a tree's depth is its k), and one `f.<knob>` per knob of
  the family's spec (its search grid).

On an engine other than speccore, every value is kept only where that engine runs it
(the family's `engine_refusal`: vLLM drafts no static tree, nor suffix's greedy tree,
`use_tree_spec=1`), so no trial is spent on a configuration the engine refuses.

Every value is categorical: a draft or a shape has no order, and k and the knobs come
in small grids that TPE's categorical kernel handles as well as an integer one.
Dimensions are conditional on `family` (define-by-run), so a trial has only its own
family's parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from speccatalog.families import family as family_spec
from speccatalog.families.base import SPECCORE, FamilyError, FamilySpec, shape_label, slug
from specops_schemas.candidates import Candidate, CandidateResult
from specops_schemas.catalog import ErrorStage, Family
from specops_schemas.tune import Dimension

MAX_K = 16
NO_DRAFT = "none"
CHAIN = "chain"
Value = str | int | float


class Suggester(Protocol):
    """What `suggest` needs of an Optuna trial (optuna.Trial has it)."""

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...


@dataclass(frozen=True, slots=True)
class Space:
    """The dimensions (in suggestion order) and each (family, draft)'s base options."""

    dimensions: tuple[Dimension, ...]
    base_options: Mapping[str, Mapping[str, str | int | float | bool]]  # "family/draft" -> options

    def choices(self, name: str) -> list[Any]:
        for d in self.dimensions:
            if d.name == name:
                return list(d.choices)
        raise KeyError(name)

    def names(self) -> set[str]:
        return {d.name for d in self.dimensions}

    def of_family(self, family: str) -> list[Dimension]:
        return [d for d in self.dimensions if d.family == family]

    def size(self) -> int:
        """How many distinct configurations the space holds."""
        total = 0
        for family in self.choices("family"):
            dims = {d.name.split(".", 1)[1]: len(d.choices) for d in self.of_family(family)}
            rest = 1
            for name, n in dims.items():
                if name not in ("k", "tree"):
                    rest *= n
            trees = dims.get("tree", 1) - 1 if "tree" in dims else 0  # shapes other than chain
            total += rest * (trees + dims.get("k", 1))
        return total


def _tree_value(tree: Sequence[int] | None) -> str:
    return "x".join(map(str, tree)) if tree else CHAIN


def _draft_value(draft: str | None) -> str:
    return draft if draft is not None else NO_DRAFT


def build(
    rows: Iterable[CandidateResult],
    allowed: Iterable[Family] | None = None,
    *,
    engine: str = SPECCORE,
    gpu_kind: str = "gpu",
) -> Space:
    """The space of a T1 run's candidates table (only `allowed` families, if given), holding
    what `engine` on a `gpu_kind` host runs."""
    keep = None if allowed is None else {str(f) for f in allowed}
    seen: dict[str, list[Candidate]] = {}
    for row in rows:
        c = row.candidate
        # A draft that did not load for the T1 run will not load for a trial either.
        if row.error_stage == ErrorStage.MODEL_LOAD:
            continue
        if keep is None or str(c.family) in keep:
            seen.setdefault(str(c.family), []).append(c)
    dims: list[Dimension] = []
    base: dict[str, dict[str, str | int | float | bool]] = {}
    if not seen:
        return Space((), {})
    dims.append(Dimension(name="family", choices=list(seen)))
    for family, cands in seen.items():
        spec = family_spec(family)
        runs = _Runs(spec, cands[0], engine, gpu_kind)
        drafts = list(dict.fromkeys(_draft_value(c.draft) for c in cands))
        dims.append(Dimension(name=f"{family}.draft", choices=list(drafts), family=family))
        if spec.takes_tree:
            trees = [t for t in dict.fromkeys(_tree_value(c.tree) for c in cands if c.tree) if runs.tree(t)]
            dims.append(Dimension(name=f"{family}.tree", choices=[CHAIN, *trees], family=family))
        top = min(MAX_K, max(2 * max(c.k for c in cands), spec.default_k))
        dims.append(Dimension(name=f"{family}.k", choices=list(range(1, top + 1)), family=family))
        for knob in spec.knobs:
            grid = [v for v in knob.grid if runs.option(knob.name, v)]
            if grid:  # none of it runs on the engine: not searched (the knob keeps its default)
                dims.append(Dimension(name=f"{family}.{knob.name}", choices=grid, family=family))
        knob_names = {k.name for k in spec.knobs} | set(spec.aliases)
        for c in cands:
            # Engine options (e.g. eagle_version) ride along; the knobs are the trial's own.
            options = {k: v for k, v in c.options.items() if k not in knob_names}
            base.setdefault(f"{family}/{_draft_value(c.draft)}", options)
    return Space(tuple(dims), base)


@dataclass(frozen=True, slots=True)
class _Runs:
    """Whether the engine runs a family's T1 candidate with one value changed."""

    spec: FamilySpec
    probe: Candidate
    engine: str
    gpu_kind: str

    def _runs(self, changed: Candidate) -> bool:
        return self.spec.engine_refusal(changed, self.engine, gpu_kind=self.gpu_kind) is None

    def tree(self, value: str) -> bool:
        return self._runs(self.probe.model_copy(update={"tree": [int(n) for n in value.split("x")]}))

    def option(self, name: str, value: Value) -> bool:
        return self._runs(self.probe.model_copy(update={"options": {**self.probe.options, name: value}}))


def suggest(trial: Suggester, space: Space) -> dict[str, Value]:
    """Optuna's define-by-run: the family first, then that family's dimensions.

    A tree family asks for `k` only for a chain (a tree's depth is its k). Dimensions
    a PartialFixedSampler fixed are still suggested (with the same choices): the
    sampler answers them with their fixed value.
    """
    family = trial.suggest_categorical("family", space.choices("family"))
    params: dict[str, Value] = {"family": family}
    for dim in space.of_family(family):
        if dim.name == f"{family}.k" and params.get(f"{family}.tree", CHAIN) != CHAIN:
            continue
        params[dim.name] = trial.suggest_categorical(dim.name, list(dim.choices))
    return params


def to_candidate(params: Mapping[str, Any], space: Space, trial: int) -> Candidate:
    """The candidate a trial's parameters describe; its id (`t<n>-<family>-k<k>-...`) is unique
    per trial, so a bench never confuses two trials of the same configuration."""
    family = str(params["family"])
    spec = family_spec(family)
    draft_value = str(params.get(f"{family}.draft", NO_DRAFT))
    draft = None if draft_value == NO_DRAFT else draft_value
    tree_value = str(params.get(f"{family}.tree", CHAIN))
    tree = [int(n) for n in tree_value.split("x")] if tree_value != CHAIN else None
    k = len(tree) if tree else int(params[f"{family}.k"])
    knobs = {
        knob.name: knob.coerce(params[f"{family}.{knob.name}"])
        for knob in spec.knobs
        if f"{family}.{knob.name}" in params
    }
    options = {**space.base_options.get(f"{family}/{draft_value}", {}), **knobs}
    parts = [f"t{trial}", family.replace("_", ""), f"k{k}"]
    if tree:
        parts.append(shape_label(tree))
    if draft:
        parts.append(slug(draft))
    # Ids take no dots: a float knob of 0.5 reads 0p5.
    parts += [str(v) if isinstance(v, int) else f"{v:g}".replace(".", "p") for v in knobs.values()]
    candidate_id = "-".join(parts)[:128]
    return Candidate(
        candidate_id=candidate_id, family=Family(family), draft=draft, k=k, tree=tree, options=options
    )


def infeasible(candidate: Candidate) -> str | None:
    """Why a suggested configuration must not be measured (its knobs conflict), or None.

    The sampler's choices are fixed grids, so a conflict (ngram_min > ngram_max) cannot be
    ruled out by constraining the suggestion without a dynamic value space, which TPE
    refuses; such a trial is failed without a bench instead (the built-in grids never
    conflict today: this guards plugins and future grids).
    """
    try:
        family_spec(candidate.family).knob_values(candidate.options)
    except FamilyError as exc:
        return f"infeasible configuration: {exc}"
    return None


def to_params(candidate: Candidate, space: Space) -> dict[str, Value] | None:
    """A T1 candidate as the space's parameters (to enqueue it as a seed); None if it lies outside."""
    family = str(candidate.family)
    if family not in space.choices("family"):
        return None
    spec = family_spec(family)
    params: dict[str, Value] = {"family": family, f"{family}.draft": _draft_value(candidate.draft)}
    names = space.names()
    if f"{family}.tree" in names:
        params[f"{family}.tree"] = _tree_value(candidate.tree)
    if not candidate.tree:
        params[f"{family}.k"] = candidate.k
    try:
        knobs = spec.knob_values(candidate.options)
    except FamilyError:
        return None
    params.update({f"{family}.{name}": value for name, value in knobs.items()})
    for name, value in params.items():
        if value not in space.choices(name):
            return None
    return params
