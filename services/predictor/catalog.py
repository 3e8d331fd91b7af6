"""The candidate catalog: every family's configurations for a target, then pruning.

Each family's spec (speccatalog.families) enumerates its candidates and says why a
workload, a target or an engine rules one out (speccatalog.families for what vLLM,
SGLang and speccore run); this module only loops over the specs and adds the
hardware rule: the draft, heads, datastore and draft KV cache must fit beside the
target. Cascade is enumerated only with ENABLE_L4_CASCADE.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from speccatalog import families
from speccatalog.families.base import DraftUnavailable, Known, Shape
from speccatalog.hardware import Deployment, fits_beside
from speccatalog.targets import DatastoreRef, HeadRef, TargetInfo
from specops_schemas.candidates import Candidate
from specops_schemas.catalog import Engine, Fingerprint

ENABLE_CASCADE_FLAG = "ENABLE_L4_CASCADE"


@dataclass(frozen=True, slots=True)
class Pruned:
    candidate: Candidate
    reason: str


@dataclass(frozen=True, slots=True)
class Catalog:
    kept: list[Candidate]
    pruned: list[Pruned]


def known_for(
    target: TargetInfo,
    *,
    heads: Iterable[HeadRef] = (),
    datastores: Iterable[DatastoreRef] = (),
    enable_cascade: bool = False,
) -> Known:
    """What the specs may know while planning for `target`."""
    return Known(
        target=target,
        heads={h.head_id: h for h in heads},
        datastores={s.datastore_id: s for s in datastores},
        enable_cascade=enable_cascade,
    )


def candidate(shape: Shape) -> Candidate:
    return Candidate(
        candidate_id=shape.candidate_id,
        family=shape.family,
        draft=shape.draft,
        k=shape.k,
        tree=list(shape.tree) if shape.tree else None,
        options=dict(shape.options),
    )


def enumerate_candidates(known: Known) -> list[Candidate]:
    """Every configuration the catalog knows for the target, before pruning (deterministic order)."""
    return [candidate(shape) for spec in families.families().values() for shape in spec.candidates(known)]


def engine_rejects(cand: Candidate, engine: Engine, *, gpu_kind: str) -> str | None:
    """Why `engine` cannot run `cand`, or None if it can."""
    return families.family(cand.family).engine_refusal(cand, str(engine), gpu_kind=gpu_kind)


def build_catalog(deployment: Deployment, fingerprint: Fingerprint, engine: Engine, known: Known) -> Catalog:
    """Enumerate for the deployment's target (`known`: its drafts, heads and datastores), then
    prune by workload, target, engine and memory."""
    kept: list[Candidate] = []
    pruned: list[Pruned] = []
    for cand in enumerate_candidates(known):
        spec = families.family(cand.family)
        reason = spec.refusal(cand, known, str(fingerprint)) or engine_rejects(
            cand, engine, gpu_kind=deployment.profile.kind
        )
        if reason is None:
            try:
                cost = spec.draft_cost(cand, known)
            except DraftUnavailable as err:
                reason = str(err)
            else:
                if not fits_beside(deployment, cost):
                    reason = f"draft does not fit beside {known.target.ref} on {deployment.profile.name}"
        if reason is None:
            kept.append(cand)
        else:
            pruned.append(Pruned(cand, reason))
    return Catalog(kept, pruned)
