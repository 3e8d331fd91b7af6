"""The candidate catalog: family x draft source x k x tree shape x options, then pruning.

Pruning rules, each with the reason it reports:

- fingerprint (seed 000, DESIGN.md §3): rest is skipped for chat, lookahead for creative;
- target: draft_model and cascade are skipped for MTP-native targets, mtp needs them;
  medusa/eagle need a head trained for the target, rest a datastore built with its tokenizer;
- engine (reference/engines.md): vLLM runs ngram, draft_model, medusa, eagle/eagle3 and
  mtp (its `suffix` method is suffix decoding, not REST; it has no lookahead) and no
  longer takes a static token tree (`speculative_token_tree` is gone @002e77c1); SGLang
  runs NGRAM (CUDA only), STANDALONE draft models, EAGLE/EAGLE3 and NEXTN (MTP), no
  Medusa; speccore runs the families libs/speccore/proposers registers. Only speccore
  builds a layer-truncated `self:N` draft;
- hardware: the draft, heads, datastore and draft KV cache must fit beside the target;
- cascade is enumerated only with ENABLE_L4_CASCADE.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from speccatalog.hardware import Deployment, fits_beside
from speccatalog.targets import DatastoreRef, HeadRef, TargetInfo
from specops_schemas.candidates import Candidate
from specops_schemas.catalog import Engine, Family, Fingerprint
from specops_services.predictor.resources import SELF_PREFIX, DraftUnavailable, draft_cost

ENABLE_CASCADE_FLAG = "ENABLE_L4_CASCADE"

# Must match speccore.proposers.FAMILIES + HEAD_FAMILIES (a unit test checks it).
SPECCORE_FAMILIES = frozenset(
    {Family.NGRAM, Family.REST, Family.DRAFT_MODEL, Family.LOOKAHEAD, Family.MEDUSA, Family.EAGLE}
)
ENGINE_FAMILIES: dict[Engine, frozenset[Family]] = {
    Engine.VLLM: frozenset({Family.NGRAM, Family.DRAFT_MODEL, Family.MEDUSA, Family.EAGLE, Family.MTP}),
    Engine.SGLANG: frozenset({Family.NGRAM, Family.DRAFT_MODEL, Family.EAGLE, Family.MTP}),
    Engine.SPECCORE: SPECCORE_FAMILIES,
}
SKIPPED_FOR_FINGERPRINT: dict[Fingerprint, frozenset[Family]] = {
    Fingerprint.CHAT: frozenset({Family.REST}),
    Fingerprint.CREATIVE: frozenset({Family.LOOKAHEAD}),
}

NGRAM_K = (2, 4, 6, 8)
NGRAM_MATCH = ((1, 4), (3, 5))  # (ngram_min, ngram_max): speccore's default, and a strict variant
REST_K = (4, 8)
DRAFT_K = (2, 4, 6)
LOOKAHEAD_SHAPES = ((5, 4, 5), (10, 5, 10), (15, 5, 15))  # (window, ngram, guesses)
EAGLE_K = (3, 5)
# (2, 1, 1): 6 nodes, what a CPU verifies at little more than one token's cost (speccore).
TREES = ((2, 1, 1), (4, 2, 1), (4, 2, 2, 1, 1))
MTP_K = (1, 2, 3)
CASCADE_K = 4

_ID_SAFE = re.compile(r"[A-Za-z0-9_-]{1,40}")


@dataclass(frozen=True, slots=True)
class Pruned:
    candidate: Candidate
    reason: str


@dataclass(frozen=True, slots=True)
class Catalog:
    kept: list[Candidate]
    pruned: list[Pruned]


def _slug(ref: str) -> str:
    if ref.startswith(SELF_PREFIX) and ref.removeprefix(SELF_PREFIX).isdigit():
        return "self" + ref.removeprefix(SELF_PREFIX)
    if _ID_SAFE.fullmatch(ref):
        return ref
    # Anything else gets a hash so that refs differing only in unsafe characters stay distinct.
    cleaned = re.sub(r"[^A-Za-z0-9_-]+", "-", ref).strip("-")[:40]
    return f"{cleaned}-{hashlib.sha256(ref.encode()).hexdigest()[:8]}".lstrip("-")


def _shape(tree: tuple[int, ...] | None) -> str:
    return "t" + "x".join(map(str, tree)) if tree else "chain"


def enumerate_candidates(
    target: TargetInfo,
    *,
    heads: Iterable[HeadRef] = (),
    datastores: Iterable[DatastoreRef] = (),
    enable_cascade: bool = False,
) -> list[Candidate]:
    """Every configuration the catalog knows for `target`, before pruning (deterministic order)."""
    out: list[Candidate] = []
    for k in NGRAM_K:
        for lo, hi in NGRAM_MATCH:
            out.append(
                Candidate(
                    candidate_id=f"ngram-k{k}-n{lo}-{hi}",
                    family=Family.NGRAM,
                    k=k,
                    options={"ngram_min": lo, "ngram_max": hi},
                )
            )
    for store in sorted(datastores, key=lambda s: s.datastore_id):
        if store.tokenizer != target.tokenizer:
            continue
        for k in REST_K:
            out.append(
                Candidate(
                    candidate_id=f"rest-k{k}-{_slug(store.datastore_id)}",
                    family=Family.REST,
                    draft=store.datastore_id,
                    k=k,
                )
            )
    drafts = [*target.drafts, *sorted({f"{SELF_PREFIX}{max(1, target.layers // d)}" for d in (4, 2)})]
    for draft in drafts:
        for k in DRAFT_K:
            out.append(
                Candidate(
                    candidate_id=f"draft_model-k{k}-{_slug(draft)}",
                    family=Family.DRAFT_MODEL,
                    draft=draft,
                    k=k,
                )
            )
    for window, ngram, guesses in LOOKAHEAD_SHAPES:
        out.append(
            Candidate(
                candidate_id=f"lookahead-w{window}-n{ngram}-g{guesses}",
                family=Family.LOOKAHEAD,
                k=ngram - 1,
                options={"lookahead_window": window, "lookahead_ngram": ngram, "lookahead_guesses": guesses},
            )
        )
    for head in sorted(heads, key=lambda h: h.head_id):
        if head.target_ref.lower() != target.ref.lower() or head.family not in (Family.MEDUSA, Family.EAGLE):
            continue
        out.extend(_head_candidates(head))
    if target.has_mtp:
        for k in MTP_K:
            out.append(Candidate(candidate_id=f"mtp-k{k}", family=Family.MTP, k=k))
    if enable_cascade and len(target.drafts) >= 2:
        small, medium = target.drafts[0], target.drafts[-1]
        out.append(
            Candidate(
                candidate_id=f"cascade-k{CASCADE_K}-{_slug(small)}-{_slug(medium)}",
                family=Family.CASCADE,
                draft=small,
                k=CASCADE_K,
                options={"medium": medium},
            )
        )
    return out


def _head_candidates(head: HeadRef) -> list[Candidate]:
    if head.family == Family.MEDUSA:
        shapes: list[tuple[int, tuple[int, ...] | None]] = [(head.num_heads, None)]
        shapes += [(len(t), t) for t in TREES if len(t) <= head.num_heads]
        options: dict[str, str | int | float | bool] = {}
    else:
        shapes = [(k, None) for k in EAGLE_K] + [(len(t), t) for t in TREES]
        options = {"eagle_version": head.eagle_version}
    return [
        Candidate(
            candidate_id=f"{head.family}-k{k}-{_shape(tree)}-{_slug(head.head_id)}",
            family=head.family,
            draft=head.head_id,
            k=k,
            tree=list(tree) if tree else None,
            options=options,
        )
        for k, tree in shapes
    ]


def engine_rejects(
    candidate: Candidate, engine: Engine, *, gpu_kind: str, families: frozenset[Family] | None = None
) -> str | None:
    """Why `engine` cannot run `candidate`, or None if it can (`families`: what the engine implements)."""
    if candidate.family not in (ENGINE_FAMILIES[engine] if families is None else families):
        return f"{engine} does not implement {candidate.family}"
    if engine != Engine.SPECCORE and (candidate.draft or "").startswith(SELF_PREFIX):
        return f"{engine} cannot build a layer-truncated self draft"
    if engine == Engine.VLLM and candidate.tree:
        return "vLLM takes no static draft tree (speculative_token_tree was removed)"
    if engine == Engine.SGLANG and candidate.family == Family.MEDUSA:
        return "SGLang has no Medusa algorithm"
    if engine == Engine.SGLANG and candidate.family == Family.NGRAM and gpu_kind != "gpu":
        return "SGLang's NGRAM speculative decoding is CUDA-only"
    return None


def target_rejects(candidate: Candidate, target: TargetInfo, fingerprint: Fingerprint) -> str | None:
    """Why the workload or the target rules `candidate` out, or None."""
    if candidate.family in SKIPPED_FOR_FINGERPRINT.get(fingerprint, frozenset()):
        return f"{candidate.family} is skipped for {fingerprint} workloads"
    if target.has_mtp and candidate.family in (Family.DRAFT_MODEL, Family.CASCADE):
        return f"{target.ref} has native MTP heads; separate drafts are skipped"
    if candidate.family == Family.MTP and not target.has_mtp:
        return f"{target.ref} has no MTP heads"
    return None


def build_catalog(
    deployment: Deployment,
    fingerprint: Fingerprint,
    engine: Engine,
    *,
    heads: Iterable[HeadRef] = (),
    datastores: Iterable[DatastoreRef] = (),
    enable_cascade: bool = False,
    engine_families: Mapping[Engine, frozenset[Family]] | None = None,
) -> Catalog:
    """Enumerate for the deployment's target, then prune by fingerprint, target, engine and memory."""
    target = deployment.target
    head_list, store_list = list(heads), list(datastores)
    head_map = {h.head_id: h for h in head_list}
    store_map = {s.datastore_id: s for s in store_list}
    families = dict(ENGINE_FAMILIES) | dict(engine_families or {})
    kept: list[Candidate] = []
    pruned: list[Pruned] = []
    for cand in enumerate_candidates(
        target, heads=head_list, datastores=store_list, enable_cascade=enable_cascade
    ):
        reason = target_rejects(cand, target, fingerprint) or engine_rejects(
            cand, engine, gpu_kind=deployment.profile.kind, families=families[engine]
        )
        if reason is None and cand.family == Family.REST:
            store = store_map[cand.draft or ""]
            if store.fingerprints and fingerprint not in store.fingerprints:
                reason = f"datastore {store.datastore_id} is not built for {fingerprint} workloads"
        if reason is None:
            try:
                cost = draft_cost(cand, target, heads=head_map, datastores=store_map)
            except DraftUnavailable as err:
                reason = str(err)
            else:
                if not fits_beside(deployment, cost):
                    reason = f"draft does not fit beside {target.ref} on {deployment.profile.name}"
        if reason is None:
            kept.append(cand)
        else:
            pruned.append(Pruned(cand, reason))
    return Catalog(kept, pruned)
