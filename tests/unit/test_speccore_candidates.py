"""A catalog candidate becomes the speccore configuration the runner measures and the
gate decodes: the same mapping for both, options for other engines set aside."""

from __future__ import annotations

import pytest

from speccore.candidates import ignored_options, speccore_candidate
from speccore.errors import SpecError
from specops_schemas.candidates import Candidate


def test_options_speccore_reads_and_flags_for_other_engines() -> None:
    candidate = Candidate(
        candidate_id="n",
        family="ngram",
        k=4,
        # min_match and prompt_lookup_min: other names of ngram_min; eagle_version is EAGLE's.
        options={"min_match": 2, "ngram_max": 3, "prompt_lookup_min": 2, "eagle_version": 3},
    )
    spec = speccore_candidate(candidate)
    assert spec.family == "ngram"
    assert (spec.config.k, spec.config.knobs["ngram_min"], spec.config.knobs["ngram_max"]) == (4, 2, 3)
    assert ignored_options(candidate) == ["eagle_version"]
    two_values = {"min_match": 2, "prompt_lookup_min": 1}
    for bad in ({"ngram_max": "3"}, {"ngram_max": True}, {"ngram_max": 0}, {"ngram_mx": 3}, two_values):
        with pytest.raises(SpecError):
            speccore_candidate(Candidate(candidate_id="b", family="ngram", k=4, options=bad))


def test_draft_sources_go_where_each_family_reads_them() -> None:
    rest = speccore_candidate(Candidate(candidate_id="r", family="rest", k=6, draft="/ds.npz")).config
    assert (rest.datastore, rest.draft, rest.head) == ("/ds.npz", None, None)
    draft = speccore_candidate(Candidate(candidate_id="d", family="draft_model", k=3, draft="self:9")).config
    assert (draft.draft, draft.datastore, draft.head) == ("self:9", None, None)
    head = speccore_candidate(Candidate(candidate_id="m", family="medusa", k=4, draft="builtin:medusa"))
    assert (head.config.head, head.config.draft) == ("builtin:medusa", None)


def test_head_candidates_draft_their_shape_or_a_chain_of_k() -> None:
    chain = speccore_candidate(Candidate(candidate_id="e", family="eagle", k=3, draft="h")).config
    assert chain.tree_shape == (1, 1, 1)
    tree = speccore_candidate(Candidate(candidate_id="e", family="eagle", k=3, draft="h", tree=[4, 2, 1]))
    assert tree.config.tree_shape == (4, 2, 1)
    with pytest.raises(SpecError, match="takes no tree shape"):
        speccore_candidate(Candidate(candidate_id="n", family="ngram", k=3, tree=[2, 1]))
    with pytest.raises(SpecError, match="nodes"):  # 8**3 nodes: more than a verify step holds
        speccore_candidate(Candidate(candidate_id="e", family="eagle", k=3, draft="h", tree=[8, 8, 8]))


def test_families_speccore_does_not_run_are_refused() -> None:
    with pytest.raises(SpecError, match="cannot run family 'mtp'"):
        speccore_candidate(Candidate(candidate_id="m", family="mtp", k=2))
