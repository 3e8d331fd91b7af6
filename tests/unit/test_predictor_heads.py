"""T3 heads in T1 plans: a tenant's registry heads (folded from head.transitioned), always
measured; the published EAGLE heads of speccatalog.public_heads in vLLM / SGLang runs of
their exact target; and `apply` rendering them as the engines load them."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from speccatalog.public_heads import PUBLIC_HEADS, public_heads
from speccatalog.targets import KNOWN_TARGETS, HeadRef
from specops_schemas.api import RunCreateRequest, SglangConfig, VllmConfig
from specops_schemas.candidates import Candidate, Prediction, RankedCandidate
from specops_schemas.catalog import Engine, Family
from specops_schemas.engine_flags import EngineCannotRun, engine_config
from specops_services.predictor.logic import make_plan, offered_states, registry_head
from specops_services.predictor.plan import CPU_BENCH, HostInfo, Plan, pick_for_bench, plan_run

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
SMOL = "smollm2-135m-instruct"
HEAD = "hd-" + "a" * 24
CPU_HOST = HostInfo(cuda=False, bench=CPU_BENCH)


def request(model: str, gpu: str, engine: str, **extra: object) -> RunCreateRequest:
    body = {"target": {"model_ref": model, "gpu": gpu, "engine": engine}, "workload": {"fingerprint": "chat"}}
    return RunCreateRequest.model_validate(body | extra)


def drafts(plan: Plan) -> set[str | None]:
    return {r.candidate.draft for r in plan.ranked}


# --- public heads -------------------------------------------------------------------------------


def test_every_public_head_names_a_known_target_exactly_and_a_unique_repo() -> None:
    assert len({h.repo_id for h in PUBLIC_HEADS}) == len(PUBLIC_HEADS)
    for head in PUBLIC_HEADS:
        assert head.target_ref in KNOWN_TARGETS, head
        assert head.family in {Family.EAGLE, Family.MEDUSA}
        assert head.engines <= {"vllm", "sglang"} and head.engines
        assert head.source.startswith("https://huggingface.co/")
        assert (head.tau is None) == (head.tau_source is None)


def test_a_vllm_h100_run_of_llama_8b_lists_the_published_eagle3_head() -> None:
    plan = plan_run(request(LLAMA_8B, "H100-80GB", "vllm"), run_id="r1", host=CPU_HOST)
    assert "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B" in drafts(plan)
    assert "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3" in drafts(plan)
    # SGLang reads another copy of the same head; vLLM does not get it.
    assert "lmsys/sglang-EAGLE3-LLaMA3.1-Instruct-8B" not in drafts(plan)
    eagle3 = [r.candidate for r in plan.ranked if r.candidate.draft == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"]
    assert eagle3 and all(c.family == Family.EAGLE and c.options["eagle_version"] == 3 for c in eagle3)


def test_sglang_gets_its_own_copy_and_speccore_no_public_head() -> None:
    sglang = plan_run(request(LLAMA_8B, "H100-80GB", "sglang"), run_id="r1", host=CPU_HOST)
    assert "lmsys/sglang-EAGLE3-LLaMA3.1-Instruct-8B" in drafts(sglang)
    assert "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B" not in drafts(sglang)
    speccore = plan_run(request(LLAMA_8B, "H100-80GB", "speccore"), run_id="r1", host=CPU_HOST)
    assert not drafts(speccore) & {h.repo_id for h in PUBLIC_HEADS}


def test_a_head_for_llama_3_3_70b_is_not_offered_for_llama_3_1_70b() -> None:
    assert public_heads(LLAMA_70B, "vllm") == []
    assert public_heads("meta-llama/Llama-3.3-70B-Instruct", "vllm")
    plan = plan_run(request(LLAMA_70B, "H200", "vllm"), run_id="r1", host=CPU_HOST)
    assert not drafts(plan) & {h.repo_id for h in PUBLIC_HEADS}


def test_apply_renders_a_public_head_as_vllm_and_sglang_load_it() -> None:
    vllm = Candidate(
        candidate_id="eagle-k3-chain",
        family=Family.EAGLE,
        k=3,
        draft="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        options={"eagle_version": 3},
    )
    config, args = engine_config(vllm, Engine.VLLM)
    assert isinstance(config, VllmConfig)
    assert args[0] == "--speculative-config"
    assert json.loads(args[1]) == {
        "method": "eagle3",
        "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "num_speculative_tokens": 3,
    }
    sglang = vllm.model_copy(update={"draft": "lmsys/sglang-EAGLE3-LLaMA3.1-Instruct-8B"})
    config, args = engine_config(sglang, Engine.SGLANG)
    assert isinstance(config, SglangConfig)
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags["--speculative-algorithm"] == "EAGLE3"
    assert flags["--speculative-draft-model-path"] == "lmsys/sglang-EAGLE3-LLaMA3.1-Instruct-8B"


# --- registry heads -----------------------------------------------------------------------------


def test_registry_heads_map_artifact_families_onto_catalog_families() -> None:
    common = {"target_ref": SMOL, "params": 1000, "artifact_path": "heads/t/x", "acceptance_rate": 0.4}
    eagle3 = registry_head(head_id=HEAD, family="eagle3", num_heads=3, eagle_version=3, **common)
    eagle = registry_head(head_id=HEAD, family="eagle", num_heads=3, eagle_version=None, **common)
    medusa = registry_head(head_id=HEAD, family="medusa", num_heads=4, eagle_version=None, **common)
    assert eagle3 == HeadRef(HEAD, "eagle", SMOL, 3, 3, 1000, 0.4, "heads/t/x")
    assert eagle is not None and (eagle.family, eagle.eagle_version) == ("eagle", 2)
    assert medusa is not None and (medusa.family, medusa.num_heads, medusa.acceptance) == ("medusa", 4, 0.4)
    assert offered_states(False) == {"production"}
    assert offered_states(True) == {"production", "uat"}


def test_the_best_registry_head_is_always_measured() -> None:
    weak = HeadRef(HEAD, "medusa", SMOL, num_heads=2, acceptance=0.01)
    planned = make_plan(
        request(SMOL, "cpu", "speccore"),
        run_id="r1",
        host=CPU_HOST,
        history=[],
        target=None,
        enable_cascade=False,
        heads=[weak],
    )
    assert isinstance(planned, Plan) and planned.bench_plan is not None
    ranked = [r.candidate for r in planned.ranked]
    head_candidates = [c for c in ranked if c.draft == HEAD]
    assert head_candidates
    # Ranked low (acceptance 0.01) and still measured: its best-ranked candidate.
    assert ranked.index(head_candidates[0]) >= len(planned.bench_plan.candidates)
    assert head_candidates[0] in planned.bench_plan.candidates
    picked = [c.candidate_id for c in planned.bench_plan.candidates]
    assert picked == sorted(picked, key=[c.candidate_id for c in ranked].index)


def test_a_registry_head_is_pruned_for_engines_that_cannot_load_it() -> None:
    """A T3 head is in speccore's layout: a vLLM run of its target lists it as pruned, with why."""
    head = HeadRef(HEAD, "medusa", SMOL, num_heads=2, acceptance=0.3)
    plan = plan_run(request(SMOL, "H100-80GB", "vllm"), run_id="r2", host=CPU_HOST, available_heads=[head])
    assert HEAD not in drafts(plan)
    reasons = {p.reason for p in plan.pruned if p.candidate.draft == HEAD}
    assert reasons == {"vllm cannot load a T3 head in speccore's layout"}


EXPORTED = HeadRef(HEAD, "eagle", SMOL, num_heads=3, eagle_version=3, acceptance=0.3, export="speculators")
VLLM_HOST = HostInfo(cuda=False, bench=CPU_BENCH, engines=frozenset({Engine.SPECCORE, Engine.VLLM}))


def test_a_registry_heads_speculators_export_is_what_the_predictor_offers_vllm() -> None:
    common = {"target_ref": SMOL, "params": 1000, "artifact_path": "heads/t/x", "acceptance_rate": 0.4}
    exported = registry_head(
        head_id=HEAD,
        family="eagle3",
        num_heads=3,
        eagle_version=3,
        speculators_path="heads/t/x/speculators",
        **common,
    )
    assert exported is not None and exported.export == "speculators"
    assert registry_head(head_id=HEAD, family="eagle3", num_heads=3, eagle_version=3, **common).export is None


def test_an_exported_eagle3_head_is_measured_in_a_vllm_run_of_its_target() -> None:
    plan = plan_run(request(SMOL, "cpu", "vllm"), run_id="r3", host=VLLM_HOST, available_heads=[EXPORTED])
    assert plan.bench_plan is not None
    [picked] = [c for c in plan.bench_plan.candidates if c.draft == HEAD]
    assert picked.options == {"eagle_version": 3, "export": "speculators"} and picked.tree is None
    # vLLM takes chains only: the head's tree shapes are pruned, its chains kept.
    kept = [r.candidate for r in plan.ranked if r.candidate.draft == HEAD]
    assert {c.k for c in kept} == {3, 5} and all(c.tree is None for c in kept)
    # The benchmark-runner and apply pass the head's directory; vLLM loads the export in it.
    config, args = engine_config(picked, Engine.VLLM, draft_paths={HEAD: "/store/heads/acme/d1"})
    assert isinstance(config, VllmConfig)
    assert json.loads(args[1]) == {
        "method": "eagle3",
        "model": "/store/heads/acme/d1/speculators",
        "num_speculative_tokens": picked.k,
    }


@pytest.mark.parametrize(
    ("head", "engine", "why"),
    [
        (EXPORTED, "sglang", "sglang cannot load a T3 head: it reads EAGLE drafts in its own layout"),
        (replace(EXPORTED, export=None), "vllm", "through its speculators export, which this head lacks"),
        (replace(EXPORTED, eagle_version=2, export=None), "vllm", "cannot load an EAGLE-1 T3 head"),
        (
            HeadRef(HEAD, "medusa", SMOL, num_heads=2),
            "vllm",
            "vllm cannot load a T3 head in speccore's layout",
        ),
    ],
    ids=["exported-on-sglang", "eagle3-unexported", "eagle1", "medusa"],
)
def test_a_head_an_engine_cannot_load_is_pruned_with_why(head: HeadRef, engine: str, why: str) -> None:
    plan = plan_run(request(SMOL, "H100-80GB", engine), run_id="r4", host=CPU_HOST, available_heads=[head])
    assert HEAD not in drafts(plan)
    reasons = {p.reason for p in plan.pruned if p.candidate.draft == HEAD}
    assert reasons and all(why in r for r in reasons), reasons


def test_apply_refuses_an_exported_head_whose_directory_is_unknown() -> None:
    head = Candidate(
        candidate_id="eagle-k3",
        family=Family.EAGLE,
        k=3,
        draft=HEAD,
        options={"eagle_version": 3, "export": "speculators"},
    )
    with pytest.raises(EngineCannotRun, match="directory of head"):
        engine_config(head, Engine.VLLM)


def _ranked(*cands: tuple[str, str, str | None]) -> list[RankedCandidate]:
    return [
        RankedCandidate(
            candidate=Candidate(candidate_id=cid, family=fam, k=3, draft=draft),  # type: ignore[arg-type]
            prediction=Prediction(
                rank=i + 1,
                score=-i,
                acceptance_rate=0.5,
                mean_acceptance_length=2.0,
                speedup=1.5,
                extra_memory_bytes=0,
            ),
        )
        for i, (cid, fam, draft) in enumerate(cands)
    ]


def test_pick_for_bench_puts_the_first_registry_head_in_and_keeps_rank_order() -> None:
    ranked = _ranked(("a", "ngram", None), ("b", "ngram", None), ("c", "lookahead", None), ("d", "rest", "x"))
    assert [c.candidate_id for c in pick_for_bench(ranked, 3)] == ["a", "c", "d"]
    head = "hd-" + "b" * 24
    ranked = _ranked(
        ("a", "ngram", None),
        ("b", "ngram", None),
        ("c", "lookahead", None),
        ("d", "rest", "x"),
        ("e", "medusa", head),
        ("f", "medusa", HEAD),
    )
    picked = [c.candidate_id for c in pick_for_bench(ranked, 3)]
    assert picked == ["a", "c", "e"]
    assert [c.candidate_id for c in pick_for_bench(ranked, 1)] == ["e"]
