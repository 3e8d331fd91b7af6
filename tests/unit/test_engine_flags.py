"""Apply: a winner becomes vLLM / SGLang / speccore flags named exactly as the engines name them."""

from __future__ import annotations

import json

import pytest

from speccatalog.targets import HeadRef
from specops_schemas.api import ApplyResponse, RunCreateRequest, SglangConfig, SpeccoreConfig, VllmConfig
from specops_schemas.candidates import Candidate
from specops_schemas.catalog import Engine, Family
from specops_schemas.engine_flags import EngineCannotRun, apply_response, engine_config
from specops_services.predictor.plan import HostInfo, plan_run

LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"


def cand(family: Family, k: int = 4, **fields: object) -> Candidate:
    return Candidate(candidate_id=f"{family}-k{k}", family=family, k=k, **fields)  # type: ignore[arg-type]


def vllm_json(candidate: Candidate, **kw: object) -> dict[str, object]:
    config, args = engine_config(candidate, Engine.VLLM, **kw)  # type: ignore[arg-type]
    assert isinstance(config, VllmConfig)
    assert args[0] == "--speculative-config" and len(args) == 2
    body = json.loads(args[1])
    assert body == config.model_dump(exclude={"engine"}, exclude_none=True)
    return body  # type: ignore[no-any-return]


def test_vllm_ngram() -> None:
    body = vllm_json(cand(Family.NGRAM, 6, options={"ngram_min": 1, "ngram_max": 4}))
    assert body == {
        "method": "ngram",
        "num_speculative_tokens": 6,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 1,
    }


def test_vllm_draft_model_uses_model_and_draft_tp_1() -> None:
    body = vllm_json(cand(Family.DRAFT_MODEL, draft="meta-llama/Llama-3.2-1B-Instruct"))
    assert body == {
        "method": "draft_model",
        "model": "meta-llama/Llama-3.2-1B-Instruct",
        "num_speculative_tokens": 4,
        "draft_tensor_parallel_size": 1,
    }


def test_vllm_heads_and_mtp() -> None:
    paths = {"head-7": "/registry/heads/head-7"}
    eagle3 = vllm_json(cand(Family.EAGLE, 5, draft="head-7", options={"eagle_version": 3}), draft_paths=paths)
    eagle2 = vllm_json(cand(Family.EAGLE, 5, draft="head-7", options={"eagle_version": 2}), draft_paths=paths)
    medusa = vllm_json(cand(Family.MEDUSA, 4, draft="head-7"), draft_paths=paths)
    assert eagle3 == {"method": "eagle3", "model": "/registry/heads/head-7", "num_speculative_tokens": 5}
    assert eagle2["method"] == "eagle"
    assert medusa == {"method": "medusa", "model": "/registry/heads/head-7", "num_speculative_tokens": 4}
    assert vllm_json(cand(Family.MTP, 1)) == {"method": "mtp", "num_speculative_tokens": 1}


@pytest.mark.parametrize(
    ("candidate", "why"),
    [
        (cand(Family.REST, 8, draft="store"), "no rest"),
        (cand(Family.LOOKAHEAD, 3), "no lookahead"),
        (cand(Family.EAGLE, 3, draft="h", tree=[4, 2, 1]), "tree"),
        (cand(Family.DRAFT_MODEL, draft="self:12"), "only speccore"),
        (cand(Family.DRAFT_MODEL), "needs a draft"),
        (cand(Family.EAGLE, 3, draft="builtin:eagle"), "its own layout"),
        (cand(Family.MEDUSA, 3, draft="hd-0123456789abcdef01234567"), "T3 head in speccore's layout"),
    ],
)
def test_vllm_refuses_what_it_cannot_run(candidate: Candidate, why: str) -> None:
    with pytest.raises(EngineCannotRun, match=why):
        engine_config(candidate, Engine.VLLM)


def sglang(candidate: Candidate) -> tuple[SglangConfig, list[str]]:
    config, args = engine_config(candidate, Engine.SGLANG)
    assert isinstance(config, SglangConfig)
    return config, args


def test_sglang_eagle_tree() -> None:
    config, args = sglang(
        cand(Family.EAGLE, 3, draft="lmsys/eagle3", tree=[4, 2, 1], options={"eagle_version": 3})
    )
    assert args == [
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "lmsys/eagle3",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "4",
        "--speculative-num-draft-tokens",
        "21",  # 4 + 8 + 8 tree nodes plus the verified root
    ]
    assert config.speculative_num_draft_tokens == 21


def test_sglang_chains() -> None:
    standalone, args = sglang(cand(Family.DRAFT_MODEL, 4, draft="meta-llama/Llama-3.2-1B-Instruct"))
    assert (standalone.speculative_algorithm, standalone.speculative_draft_model_path) == (
        "STANDALONE",
        "meta-llama/Llama-3.2-1B-Instruct",
    )
    assert (standalone.speculative_num_steps, standalone.speculative_eagle_topk) == (4, 1)
    assert standalone.speculative_num_draft_tokens == 5
    nextn, args = sglang(cand(Family.MTP, 2))
    assert nextn.speculative_algorithm == "NEXTN" and "--speculative-draft-model-path" not in args
    ngram, args = sglang(cand(Family.NGRAM, 6, options={"ngram_min": 2, "ngram_max": 5}))
    assert ngram.speculative_algorithm == "NGRAM"
    assert args[-4:] == [
        "--speculative-ngram-min-match-window-size",
        "2",
        "--speculative-ngram-max-match-window-size",
        "5",
    ]


@pytest.mark.parametrize("family", [Family.MEDUSA, Family.REST, Family.LOOKAHEAD, Family.CASCADE])
def test_sglang_refuses_families_it_lacks(family: Family) -> None:
    with pytest.raises(EngineCannotRun, match="SGLang"):
        engine_config(cand(family, 3, draft="x"), Engine.SGLANG)


def test_sglang_refuses_a_head_in_speccores_layout() -> None:
    with pytest.raises(EngineCannotRun, match="specops heads export"):
        engine_config(cand(Family.EAGLE, 3, draft="builtin:eagle"), Engine.SGLANG)


def test_speccore_gets_the_candidate_itself() -> None:
    c = cand(Family.DRAFT_MODEL, 4, draft="self:12")
    config, args = engine_config(c, Engine.SPECCORE)
    assert isinstance(config, SpeccoreConfig) and config.candidate == c
    assert args == ["--method", "draft_model", "--k", "4", "--draft", "self:12"]
    _, rest_args = engine_config(
        cand(Family.REST, 8, draft="store-1"), Engine.SPECCORE, draft_paths={"store-1": "/ds.npz"}
    )
    assert rest_args[-2:] == ["--datastore", "/ds.npz"]
    _, head_args = engine_config(
        cand(Family.EAGLE, 3, draft="head-7"), Engine.SPECCORE, draft_paths={"head-7": "/heads/h7"}
    )
    # A head candidate gets the tree it was measured with: a chain of k, or its shape.
    assert head_args == ["--method", "eagle", "--head", "/heads/h7", "--tree-shape", "1,1,1"]
    _, tree_args = engine_config(
        cand(Family.MEDUSA, 3, draft="builtin:medusa", tree=[2, 1, 1]), Engine.SPECCORE
    )
    assert tree_args == ["--method", "medusa", "--head", "builtin:medusa", "--tree-shape", "2,1,1"]
    with pytest.raises(EngineCannotRun, match="speccore"):
        engine_config(cand(Family.MTP, 3), Engine.SPECCORE)


def test_apply_response_round_trips() -> None:
    c = cand(Family.NGRAM, 4, options={"ngram_min": 1, "ngram_max": 4})
    response = apply_response("run-1", c, Engine.VLLM)
    assert ApplyResponse.model_validate_json(response.model_dump_json()) == response
    assert response.family == Family.NGRAM and response.candidate_id == c.candidate_id


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_candidate_the_predictor_offers_can_be_applied(engine: str) -> None:
    heads = [
        HeadRef("eagle-70b", Family.EAGLE, LLAMA_70B, eagle_version=3),
        HeadRef("medusa-70b", Family.MEDUSA, LLAMA_70B, num_heads=4),
    ]
    for model, fingerprint in [(LLAMA_70B, "chat"), ("deepseek-ai/DeepSeek-V3", "code")]:
        request = RunCreateRequest.model_validate(
            {
                "target": {"model_ref": model, "gpu": "H200", "engine": engine},
                "workload": {"fingerprint": fingerprint},
            }
        )
        plan = plan_run(request, run_id="r", host=HostInfo(cuda=False), available_heads=heads)
        for ranked in plan.ranked:
            apply_response("r", ranked.candidate, Engine(engine))
