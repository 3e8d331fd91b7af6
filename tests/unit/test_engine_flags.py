"""Apply: a winner becomes vLLM / SGLang / speccore flags named exactly as the engines name them."""

from __future__ import annotations

import json

import pytest

from speccatalog import engine_args, families
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


def test_vllm_ngram_carries_the_measured_window_without_options() -> None:
    """vLLM fills a missing window as min = max = 5; speccore measured its defaults, 1..4."""
    body = vllm_json(cand(Family.NGRAM, 4))
    assert (body["prompt_lookup_min"], body["prompt_lookup_max"]) == (1, 4)


@pytest.mark.parametrize(
    "options", [{"prompt_lookup_min": 2, "prompt_lookup_max": 3}, {"min_match": 2, "max_match": 3}]
)
def test_vllm_ngram_takes_the_windows_other_names(options: dict[str, int]) -> None:
    body = vllm_json(cand(Family.NGRAM, 4, options=options))
    assert (body["prompt_lookup_min"], body["prompt_lookup_max"]) == (2, 3)


def test_vllm_ngram_refuses_a_window_whose_min_exceeds_its_max() -> None:
    with pytest.raises(EngineCannotRun, match="ngram_min <= ngram_max, got 5, 3"):
        engine_config(cand(Family.NGRAM, 4, options={"ngram_min": 5, "ngram_max": 3}), Engine.VLLM)


def test_apply_names_the_package_vllms_suffix_needs() -> None:
    suffix = apply_response("run-1", cand(Family.SUFFIX, 16), Engine.VLLM)
    ngram = apply_response("run-1", cand(Family.NGRAM, 4), Engine.VLLM)
    assert suffix.requires == ["arctic-inference"] and ngram.requires == []


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


def test_sglang_ngram_drafts_the_measured_chain() -> None:
    # SGLang's _handle_ngram sets eagle_topk from --speculative-ngram-max-bfs-breadth
    # (default 10): the breadth flags, not --speculative-eagle-topk, make it a chain.
    ngram, args = sglang(cand(Family.NGRAM, 6, options={"ngram_min": 2, "ngram_max": 5}))
    assert args == [
        "--speculative-algorithm",
        "NGRAM",
        "--speculative-num-steps",
        "6",
        "--speculative-num-draft-tokens",
        "7",
        "--speculative-ngram-min-bfs-breadth",
        "1",
        "--speculative-ngram-max-bfs-breadth",
        "1",
    ]
    assert ngram.speculative_eagle_topk is None
    # The match-window flags are gone from SGLang's parser; they must never be rendered.
    assert not any("match-window" in arg for arg in args)


def test_sglang_ngram_is_offered_on_a_cpu_host() -> None:
    """SGLang's `_handle_ngram` accepts cuda, cpu and xpu (sglang 0.5.23)."""
    ngram = families.family("ngram")
    assert ngram.engine_refusal(cand(Family.NGRAM, 5), "sglang", gpu_kind="cpu") is None


@pytest.mark.parametrize("family", [Family.MEDUSA, Family.REST, Family.LOOKAHEAD, Family.CASCADE])
def test_sglang_refuses_families_it_lacks(family: Family) -> None:
    with pytest.raises(EngineCannotRun, match="SGLang"):
        engine_config(cand(family, 3, draft="x"), Engine.SGLANG)


def test_sglang_refuses_a_head_in_speccores_layout() -> None:
    # SGLang's EAGLE-3 drafts are its own LlamaForCausalLMEagle3 checkpoints: no export helps.
    with pytest.raises(EngineCannotRun, match="only its own EAGLE-3 checkpoints"):
        engine_config(cand(Family.EAGLE, 3, draft="builtin:eagle"), Engine.SGLANG)
    with pytest.raises(EngineCannotRun, match="`specops heads export` it"):
        engine_config(cand(Family.EAGLE, 3, draft="builtin:eagle"), Engine.VLLM)


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


# --- flags checked against the engines' pinned source (speccatalog.engine_args) -----------


def offered(engine: Engine) -> list[Candidate]:
    """Every candidate the predictor ranks for a GPU run on ``engine``, all families included."""
    heads = [
        HeadRef("eagle-70b", Family.EAGLE, LLAMA_70B, eagle_version=3),
        HeadRef("eagle2-70b", Family.EAGLE, LLAMA_70B, eagle_version=2),
        HeadRef("medusa-70b", Family.MEDUSA, LLAMA_70B, num_heads=4),
    ]
    found = []
    for model, fingerprint in [(LLAMA_70B, "chat"), (LLAMA_70B, "code"), ("deepseek-ai/DeepSeek-V3", "code")]:
        request = RunCreateRequest.model_validate(
            {
                "target": {"model_ref": model, "gpu": "H200", "engine": engine.value},
                "workload": {"fingerprint": fingerprint},
            }
        )
        plan = plan_run(request, run_id="r", host=HostInfo(cuda=False), available_heads=heads)
        found += [ranked.candidate for ranked in plan.ranked]
    return found


def test_every_vllm_flag_is_a_speculative_config_field() -> None:
    candidates = offered(Engine.VLLM)
    families_seen = {c.family for c in candidates}
    assert {Family.NGRAM, Family.DRAFT_MODEL, Family.EAGLE, Family.MEDUSA, Family.MTP} <= families_seen
    for candidate in candidates:
        body = vllm_json(candidate)
        assert set(body) <= engine_args.VLLM_KEYS, candidate.candidate_id
        assert body["method"] in engine_args.VLLM_METHODS
        assert body["num_speculative_tokens"] == candidate.k


def test_every_sglang_flag_is_a_server_arg_with_an_accepted_value() -> None:
    candidates = offered(Engine.SGLANG)
    families_seen = {c.family for c in candidates}
    assert {Family.NGRAM, Family.DRAFT_MODEL, Family.EAGLE, Family.MTP} <= families_seen
    for candidate in candidates:
        config, args = sglang(candidate)
        flags = args[0::2]
        assert set(flags) <= set(engine_args.SGLANG_FLAGS), candidate.candidate_id
        assert config.speculative_algorithm in engine_args.SGLANG_ALGORITHMS
        if config.speculative_algorithm == "NGRAM":
            assert "--speculative-eagle-topk" not in flags  # overwritten by the breadth
            assert config.speculative_ngram_max_bfs_breadth == 1
        if config.speculative_eagle_topk == 1 or config.speculative_algorithm == "NGRAM":
            # A chain: SGLang forces num_draft_tokens = num_steps + 1 for topk 1.
            assert config.speculative_num_draft_tokens == config.speculative_num_steps + 1


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"method": "ngram", "num_speculative_tokens": 4, "speculative_token_tree": "[]"}, "no field"),
        ({"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": 8}, "no field"),
        ({"method": "lookahead", "num_speculative_tokens": 4}, "no speculative method"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "positive integer"),
    ],
)
def test_vllm_check_refuses_what_speculative_config_rejects(body: dict[str, object], why: str) -> None:
    with pytest.raises(engine_args.EngineArgsError, match=why):
        engine_args.check_vllm_config(body)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--speculative-ngram-min-match-window-size", "2"], "no launch flag"),
        (["--speculative-ngram-branch-length", "18"], "no launch flag"),
        (["--speculative-algorithm", "MEDUSA"], "takes one of"),
        (["--speculative-num-steps", "0"], "positive integer"),
        (["--speculative-ngram-match-type", "SUFFIX"], "takes one of"),
        (["--speculative-num-steps"], "needs a value"),
    ],
)
def test_sglang_check_refuses_what_server_args_rejects(args: list[str], why: str) -> None:
    with pytest.raises(engine_args.EngineArgsError, match=why):
        engine_args.check_sglang_args(args)


def test_the_renderer_refuses_flags_the_engine_rejects(monkeypatch: pytest.MonkeyPatch) -> None:
    """A family spec (built in or from an entry point) that renders a key the engine lacks
    gets a refusal from apply, never a launch line the engine would stop on."""
    spec = type(families.family("ngram"))
    unknown_key = {"method": "ngram", "num_speculative_tokens": 4, "x": 3}
    monkeypatch.setattr(spec, "vllm", lambda self, c, p: unknown_key)
    with pytest.raises(EngineCannotRun, match="vllm would reject this candidate's flags: .*no field x"):
        engine_config(cand(Family.NGRAM, 4), Engine.VLLM)
    old_window = {
        "speculative_algorithm": "NGRAM",
        "speculative_num_steps": 4,
        "speculative_ngram_branch_length": 18,  # removed from SGLang's parser
    }
    monkeypatch.setattr(spec, "sglang", lambda self, c, p: old_window)
    with pytest.raises(EngineCannotRun, match="no launch flag --speculative-ngram-branch-length"):
        engine_config(cand(Family.NGRAM, 4), Engine.SGLANG)
