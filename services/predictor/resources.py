"""What a candidate costs beside the target: memory it holds and work per verify step.

Sizes are in parameters (the runtime dtype turns them into bytes) except datastores,
whose size is known in bytes. Host-side lookup times are speccore's, measured on the
project machines (bench/results/*-cpu2.json: draft_time_s / verify steps): ngram ~1 ms,
rest and lookahead ~2.5 ms per step. GPU engines are faster at this; using the CPU
number keeps copy-based families honest rather than flattering them.
"""

from __future__ import annotations

from collections.abc import Mapping

from speccatalog.costs import DraftCost
from speccatalog.hardware import HardwareProfile, TargetDoesNotFit, deploy, fits_beside
from speccatalog.targets import (
    KNOWN_TARGETS,
    DatastoreRef,
    HeadRef,
    TargetError,
    TargetInfo,
)
from speccore.heads.trees import shape_nodes
from specops_schemas.candidates import Candidate
from specops_schemas.catalog import Family

NGRAM_LOOKUP_S = 1.0e-3
REST_LOOKUP_S = 2.5e-3
LOOKAHEAD_LOOKUP_S = 2.5e-3
# speccore's REST tree holds at most NODES_PER_DEPTH * k nodes (libs/speccore/proposers/rest.py).
REST_NODES_PER_DEPTH = 4
LOOKAHEAD_POOL_BYTES = 1 << 20
# EAGLE-3 drafts over a reduced vocabulary (SpecForge's llama3-8B-eagle3.json: 32000).
EAGLE3_DRAFT_VOCAB = 32_000
SELF_PREFIX = "self:"
BUILTIN_PREFIX = "builtin:"


class DraftUnavailable(TargetError):
    """A candidate names a draft, head or datastore the predictor does not know."""


def lookahead_nodes(window: int, ngram: int, guesses: int) -> int:
    """Draft nodes of speccore's lookahead block: the Jacobi window plus the guess trie."""
    return (window - 1) + (ngram - 2) * window + guesses * (ngram - 1)


def self_layers(draft: str, target: TargetInfo) -> int:
    """N of a `self:N` draft (the target's first N layers), validated against the target."""
    try:
        n = int(draft.removeprefix(SELF_PREFIX))
    except ValueError:
        raise DraftUnavailable(f"bad draft '{draft}': expected self:N with N a number of layers") from None
    if not 1 <= n < target.layers:
        raise DraftUnavailable(f"draft '{draft}' needs 1 <= N < {target.layers} layers of {target.ref}")
    return n


def draft_cost(
    candidate: Candidate,
    target: TargetInfo,
    *,
    heads: Mapping[str, HeadRef] | None = None,
    datastores: Mapping[str, DatastoreRef] | None = None,
) -> DraftCost:
    """Resources `candidate` needs beside `target`; DraftUnavailable for an unknown draft source."""
    heads = heads or {}
    datastores = datastores or {}
    k = candidate.k
    chain_or_tree = shape_nodes(candidate.tree) if candidate.tree else k
    depth = len(candidate.tree) if candidate.tree else k
    family = candidate.family
    if family == Family.NGRAM:
        return DraftCost(0, 0, 0, 0, 0, 0, False, NGRAM_LOOKUP_S, k)
    if family == Family.REST:
        store = _datastore(candidate, datastores)
        return DraftCost(0, store.size_bytes, 0, 0, 0, 0, False, REST_LOOKUP_S, REST_NODES_PER_DEPTH * k)
    if family == Family.LOOKAHEAD:
        nodes = lookahead_nodes(
            int(candidate.options.get("lookahead_window", 5)),
            int(candidate.options.get("lookahead_ngram", k + 1)),
            int(candidate.options.get("lookahead_guesses", 5)),
        )
        return DraftCost(0, LOOKAHEAD_POOL_BYTES, 0, 0, 0, 0, False, LOOKAHEAD_LOOKUP_S, nodes)
    if family in (Family.DRAFT_MODEL, Family.CASCADE):
        cost = _draft_model(candidate.draft, target, k)
        medium = candidate.options.get("medium")
        if family == Family.CASCADE and isinstance(medium, str):
            # The medium model verifies the small draft's chain once per step, then drafts for the target.
            mid = _draft_model(medium, target, 1)
            return DraftCost(
                cost.extra_params + mid.extra_params,
                0,
                cost.kv_elems_per_token + mid.kv_elems_per_token,
                cost.forward_params,
                cost.forward_layers,
                k + 1,
                False,
                0.0,
                k,
            )
        return cost
    if family == Family.MEDUSA:
        head = _head(candidate, heads, target)
        params = head.params or head.num_heads * (target.hidden * target.hidden + target.lm_head_params)
        return DraftCost(params, 0, 0, params, 1, 1, True, 0.0, chain_or_tree)
    if family == Family.EAGLE:
        head = _head(candidate, heads, target)
        vocab = EAGLE3_DRAFT_VOCAB if head.eagle_version >= 3 else 0
        fusion = (3 if head.eagle_version >= 3 else 2) * target.hidden * target.hidden
        own = head.params or target.layer_params + fusion + vocab * target.hidden
        # EAGLE-1/2 read the target's lm head every draft step; EAGLE-3 its own small one.
        per_step = own + (0 if vocab else target.lm_head_params)
        return DraftCost(
            own, 0, target.kv_elems_per_token // target.layers, per_step, 1, depth, True, 0.0, chain_or_tree
        )
    if family == Family.MTP:
        if not target.has_mtp:
            raise DraftUnavailable(f"{target.ref} has no multi-token-prediction heads")
        # Each step runs one MTP module: a decoder layer, a 2h -> h projection and the shared lm head.
        per_step = target.layer_params + 2 * target.hidden * target.hidden + target.lm_head_params
        return DraftCost(
            target.mtp_params, 0, target.kv_elems_per_token // target.layers, per_step, 1, k, True, 0.0, k
        )
    raise DraftUnavailable(f"no cost model for family '{family}'")  # pragma: no cover - enum is closed


def _draft_model(ref: str | None, target: TargetInfo, k: int) -> DraftCost:
    if ref is None:
        raise DraftUnavailable("a draft_model candidate needs a draft (a model ref or self:N)")
    if ref.startswith(SELF_PREFIX):
        n = self_layers(ref, target)
        # speccore's truncated copy shares the target's modules: only its KV cache is extra.
        return DraftCost(
            0,
            0,
            target.kv_elems_per_token * n // target.layers,
            n * target.layer_params + target.lm_head_params,
            n,
            k,
            False,
            0.0,
            k,
        )
    draft = KNOWN_TARGETS.get(ref)
    if draft is None:
        raise DraftUnavailable(f"unknown draft model '{ref}'")
    if draft.tokenizer != target.tokenizer:
        raise DraftUnavailable(f"draft '{ref}' does not share the tokenizer of {target.ref}")
    return DraftCost(draft.params, 0, draft.kv_elems_per_token, draft.active, draft.layers, k, False, 0.0, k)


def _head(candidate: Candidate, heads: Mapping[str, HeadRef], target: TargetInfo) -> HeadRef:
    head = heads.get(candidate.draft or "")
    if head is None or head.family != candidate.family:
        raise DraftUnavailable(f"no {candidate.family} head '{candidate.draft}' for {target.ref}")
    return head


def _datastore(candidate: Candidate, datastores: Mapping[str, DatastoreRef]) -> DatastoreRef:
    store = datastores.get(candidate.draft or "")
    if store is None:
        raise DraftUnavailable(f"no REST datastore '{candidate.draft}'")
    return store


def fits(
    target: TargetInfo,
    candidate: Candidate,
    profile: HardwareProfile,
    context_tokens: int,
    batch: int,
    *,
    heads: Mapping[str, HeadRef] | None = None,
    datastores: Mapping[str, DatastoreRef] | None = None,
) -> bool:
    """Whether target + draft + both KV caches fit `profile` for `batch` x `context_tokens`."""
    try:
        dep = deploy(target, profile, context_tokens=context_tokens, batch=batch)
    except TargetDoesNotFit:
        return False
    return fits_beside(dep, draft_cost(candidate, target, heads=heads, datastores=datastores))
