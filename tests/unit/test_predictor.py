"""The T1 predictor's pure logic: catalog pruning, the acceptance model, scoring, plan."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specbus.subjects import ID_PATTERN
from speccatalog import families as family_specs
from speccatalog.hardware import (
    Deployment,
    HardwareProfile,
    TargetDoesNotFit,
    UnknownHardware,
    deploy,
    fits_beside,
    resolve_profile,
)
from speccatalog.targets import (
    DatastoreRef,
    HeadRef,
    InvalidModelConfig,
    TargetInfo,
    UnknownModel,
    parse_hf_config,
    resolve_target,
)
from specops_schemas.api import Priorities, RunCreateRequest
from specops_schemas.candidates import Candidate, GateOutcome, Measurement, Prediction, RankedCandidate
from specops_schemas.catalog import Engine, ErrorStage, Family, Fingerprint, GateMethod, Mode
from specops_schemas.events import CandidateFailure, RunCompleted
from specops_services.predictor.catalog import build_catalog, enumerate_candidates, known_for
from specops_services.predictor.logic import make_plan
from specops_services.predictor.model import (
    Estimate,
    HistoryRow,
    Workload,
    draft_cost,
    expected_tokens,
    expected_tokens_tree,
    invert_mean_length,
    predict,
)
from specops_services.predictor.plan import (
    BenchDefaults,
    EngineNotInstalled,
    HostInfo,
    Plan,
    UploadedDatastore,
    error_stage,
    plan_run,
)
from specops_services.predictor.scoring import Decision, assemble_results, choose_winner, pareto_front, rank

LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
CPU_HOST = HostInfo(cuda=False)


def request(
    model: str = "smollm2-135m-instruct",
    gpu: str = "cpu",
    engine: str = "speccore",
    fingerprint: str = "chat",
    **goal: object,
) -> RunCreateRequest:
    body: dict[str, object] = {
        "target": {"model_ref": model, "gpu": gpu, "engine": engine},
        "workload": {"fingerprint": fingerprint},
    }
    if goal:
        body["goal"] = goal
    return RunCreateRequest.model_validate(body)


def families(found: Plan | list[Candidate]) -> set[Family]:
    candidates = [r.candidate for r in found.ranked] if isinstance(found, Plan) else found
    return {c.family for c in candidates}


# --- catalog pruning --------------------------------------------------------------------------


def test_rest_is_pruned_for_chat_but_offered_for_code() -> None:
    store = DatastoreRef("corpus-1", tokenizer="smollm2", size_bytes=10 << 20)
    chat = plan_run(request(fingerprint="chat"), run_id="r1", host=CPU_HOST, available_datastores=[store])
    code = plan_run(request(fingerprint="code"), run_id="r2", host=CPU_HOST, available_datastores=[store])
    assert Family.REST not in families(chat)
    assert any("rest is skipped for chat" in p.reason for p in chat.pruned)
    rest_drafts = {r.candidate.draft for r in code.ranked if r.candidate.family == Family.REST}
    assert rest_drafts == {"corpus-1", "builtin:code"}


def test_uploaded_corpora_are_offered_with_the_targets_tokenizer_for_their_workloads() -> None:
    code_only = UploadedDatastore("ds-code", corpus_bytes=7 << 20, fingerprints=frozenset({"code"}))
    rag_only = UploadedDatastore("ds-rag", corpus_bytes=7 << 20, fingerprints=frozenset({"rag"}))
    planned = make_plan(
        request(fingerprint="code"),
        run_id="r1",
        host=CPU_HOST,
        history=[],
        target=None,
        enable_cascade=False,
        datastores=[code_only, rag_only],
    )
    assert isinstance(planned, Plan)
    rest = {r.candidate.draft: r for r in planned.ranked if r.candidate.family == Family.REST}
    assert {"ds-code", "builtin:code"} <= set(rest) and "ds-rag" not in rest
    assert any("ds-rag is not built for code" in p.reason for p in planned.pruned)
    # 8 bytes a token at ~3.5 bytes of text a token: 16 MiB for a 7 MiB corpus.
    assert rest["ds-code"].prediction.extra_memory_bytes >= 16 << 20


def test_lookahead_is_pruned_for_creative() -> None:
    creative = plan_run(request(fingerprint="creative"), run_id="r1", host=CPU_HOST)
    chat = plan_run(request(fingerprint="chat"), run_id="r1", host=CPU_HOST)
    assert Family.LOOKAHEAD not in families(creative)
    assert Family.LOOKAHEAD in families(chat)


def test_mtp_target_gets_mtp_and_no_draft_model() -> None:
    deepseek = plan_run(
        request("deepseek-ai/DeepSeek-V3", gpu="H200", engine="vllm", fingerprint="code"),
        run_id="r1",
        host=CPU_HOST,
    )
    assert Family.MTP in families(deepseek)
    assert Family.DRAFT_MODEL not in families(deepseek)
    assert any("native MTP" in p.reason and p.candidate.family == Family.DRAFT_MODEL for p in deepseek.pruned)
    llama = plan_run(request(LLAMA_70B, gpu="H100-80GB", engine="vllm"), run_id="r1", host=CPU_HOST)
    assert Family.MTP not in families(llama)
    assert Family.DRAFT_MODEL in families(llama)


def test_engines_only_get_families_and_shapes_they_run() -> None:
    head = HeadRef("eagle-head", Family.EAGLE, LLAMA_70B, eagle_version=3)
    medusa = HeadRef("medusa-head", Family.MEDUSA, LLAMA_70B, num_heads=4)
    vllm = plan_run(
        request(LLAMA_70B, gpu="H200", engine="vllm"),
        run_id="r",
        host=CPU_HOST,
        available_heads=[head, medusa],
    )
    sglang = plan_run(
        request(LLAMA_70B, gpu="H200", engine="sglang"),
        run_id="r",
        host=CPU_HOST,
        available_heads=[head, medusa],
    )
    assert families(vllm) == {Family.NGRAM, Family.DRAFT_MODEL, Family.EAGLE, Family.MEDUSA, Family.SUFFIX}
    assert all(r.candidate.tree is None for r in vllm.ranked)
    # vLLM's suffix method drafts a path: the greedy-tree candidates are speccore's only.
    assert not any(r.candidate.options.get("use_tree_spec") for r in vllm.ranked)
    assert Family.SUFFIX not in families(sglang)
    assert Family.MEDUSA not in families(sglang)
    assert any(r.candidate.tree for r in sglang.ranked if r.candidate.family == Family.EAGLE)
    assert not any((r.candidate.draft or "").startswith("self:") for r in vllm.ranked + sglang.ranked)
    speccore = plan_run(request(fingerprint="code"), run_id="r", host=CPU_HOST)
    assert families(speccore) <= set(family_specs.runnable())
    assert any(r.candidate.draft == "self:15" for r in speccore.ranked)


def test_heads_for_other_targets_are_ignored() -> None:
    other = HeadRef("eagle-8b", Family.EAGLE, "meta-llama/Llama-3.1-8B-Instruct")
    plan = plan_run(
        request(LLAMA_70B, gpu="H200", engine="vllm"), run_id="r", host=CPU_HOST, available_heads=[other]
    )
    assert Family.EAGLE not in families(plan)


def test_cascade_only_behind_its_flag() -> None:
    target = resolve_target(LLAMA_70B)
    off = enumerate_candidates(known_for(target))
    on = enumerate_candidates(known_for(target, enable_cascade=True))
    assert Family.CASCADE not in families(off)
    assert Family.CASCADE in families(on)
    # No engine implements cascade today, so the flag alone adds nothing to a real plan.
    dep = deploy(target, resolve_profile("H200"), context_tokens=4096, batch=1)
    assert Family.CASCADE not in families(
        build_catalog(dep, Fingerprint.CHAT, Engine.SGLANG, known_for(target, enable_cascade=True)).kept
    )


def test_candidate_ids_are_valid_unique_and_deterministic() -> None:
    heads = [HeadRef("registry/eagle:v1", Family.EAGLE, LLAMA_70B), HeadRef("m", Family.MEDUSA, LLAMA_70B)]
    first = plan_run(
        request(LLAMA_70B, gpu="H200", engine="sglang"), run_id="r", host=CPU_HOST, available_heads=heads
    )
    again = plan_run(
        request(LLAMA_70B, gpu="H200", engine="sglang"), run_id="r", host=CPU_HOST, available_heads=heads
    )
    ids = [r.candidate.candidate_id for r in first.ranked] + [p.candidate.candidate_id for p in first.pruned]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(ID_PATTERN, i) for i in ids)
    assert first.ranked == again.ranked
    assert first.pareto_front == again.pareto_front


# --- hardware ---------------------------------------------------------------------------------


def test_70b_on_default_cpu_is_a_validation_error() -> None:
    with pytest.raises(TargetDoesNotFit, match="cpu-<N>GB") as err:
        plan_run(request(LLAMA_70B, gpu="cpu"), run_id="r", host=CPU_HOST)
    assert error_stage(err.value) == ErrorStage.VALIDATION


def test_70b_on_a_big_cpu_host_is_not_measurable_and_keeps_only_drafts_that_fit() -> None:
    req = request(LLAMA_70B, gpu="cpu-320GB", fingerprint="code")
    plan = plan_run(req, run_id="r", host=CPU_HOST)
    assert not plan.measurable_here
    assert plan.bench_plan is None
    assert "cannot be loaded here" in (plan.not_measurable_reason or "")
    profile = resolve_profile("cpu-320GB")
    target = resolve_target(LLAMA_70B)
    context = plan.deployment.context_tokens
    assert all(fits(target, r.candidate, profile, context) for r in plan.ranked)
    # fp32 on CPU: the 8B draft (32 GB) does not fit beside the 282 GB target; the 1B one does.
    drafts = {r.candidate.draft for r in plan.ranked if r.candidate.family == Family.DRAFT_MODEL}
    assert "meta-llama/Llama-3.2-1B-Instruct" in drafts
    assert "meta-llama/Llama-3.1-8B-Instruct" not in drafts
    assert any(
        p.candidate.draft == "meta-llama/Llama-3.1-8B-Instruct" and "does not fit" in p.reason
        for p in plan.pruned
    )


def test_large_targets_shard_over_devices() -> None:
    assert (
        deploy(resolve_target(LLAMA_70B), resolve_profile("H100-80GB"), context_tokens=4096, batch=1).devices
        == 2
    )
    assert (
        deploy(
            resolve_target("deepseek-ai/DeepSeek-V3"), resolve_profile("H200"), context_tokens=4096, batch=1
        ).devices
        == 8
    )


def test_unknown_gpu_and_model_are_validation_errors() -> None:
    with pytest.raises(UnknownHardware, match="H100-80GB"):
        resolve_profile("TPU-v5")
    with pytest.raises(UnknownModel, match="smollm2-135m-instruct") as err:
        resolve_target("no-such/model")
    assert error_stage(err.value) == ErrorStage.VALIDATION
    assert resolve_profile("h100").name == "H100-80GB"
    assert resolve_profile("cpu-64GB").memory_bytes == 64 * 1024**3


def test_self_draft_adds_no_weights() -> None:
    target = resolve_target("smollm2-135m-instruct")
    cost = draft_cost(
        Candidate(candidate_id="c", family=Family.DRAFT_MODEL, draft="self:15", k=4), known_for(target)
    )
    assert cost.extra_params == 0
    assert cost.kv_elems_per_token == target.kv_elems_per_token // 2


def test_local_config_is_parsed_like_the_known_entry() -> None:
    config = {
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "vocab_size": 49152,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }
    parsed = parse_hf_config(config, "/models/smol")
    known = resolve_target("smollm2-135m-instruct")
    assert parsed.kv_elems_per_token == known.kv_elems_per_token
    assert parsed.params == pytest.approx(known.params, rel=0.01)
    assert parsed.local
    with pytest.raises(InvalidModelConfig, match="num_hidden_layers"):
        parse_hf_config({"hidden_size": 8}, "/models/broken")


def fits(target: TargetInfo, candidate: Candidate, profile: HardwareProfile, context: int) -> bool:
    """Whether target + draft + both KV caches fit `profile` at batch 1."""
    try:
        dep = deploy(target, profile, context_tokens=context, batch=1)
    except TargetDoesNotFit:
        return False
    return fits_beside(dep, draft_cost(candidate, known_for(target)))


# --- acceptance and speedup model -------------------------------------------------------------


def test_expected_tokens_formula() -> None:
    assert expected_tokens(0.5, 3) == pytest.approx(1.875)  # 1 + .5 + .25 + .125
    assert expected_tokens(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens_tree(0.6, [1, 1, 1]) == pytest.approx(expected_tokens(0.6, 3))
    assert expected_tokens_tree(0.6, [4, 2, 1]) > expected_tokens(0.6, 3)


@given(st.floats(0.0, 0.99), st.integers(1, 12))
def test_expected_tokens_is_bounded_monotone_and_invertible(a: float, k: int) -> None:
    e = expected_tokens(a, k)
    assert 1.0 <= e <= k + 1
    assert expected_tokens(min(a + 0.01, 1.0), k) >= e
    assert expected_tokens(a, k + 1) >= e
    assert invert_mean_length(e, k) == pytest.approx(a, abs=1e-6)


def _smollm_chat() -> tuple[Deployment, Workload]:
    target = resolve_target("smollm2-135m-instruct")
    dep = deploy(target, resolve_profile("cpu"), context_tokens=4096, batch=1)
    return dep, Workload(Fingerprint.CHAT, temperature=0.0, latency_batch=1, throughput_batch=8)


def test_priors_reproduce_the_measured_cpu_bench() -> None:
    dep, wl = _smollm_chat()
    ngram = predict(
        Candidate(candidate_id="n", family=Family.NGRAM, k=10), dep, wl, known_for(dep.target), gpu="cpu"
    )
    selfdraft = predict(
        Candidate(candidate_id="d", family=Family.DRAFT_MODEL, draft="self:12", k=4),
        dep,
        wl,
        known_for(dep.target),
        gpu="cpu",
    )
    # smollm2-135m-instruct-chat-greedy-cpu2.json: ngram E[N] 1.22 (1.24x), self:12 1.09 (0.36x).
    assert ngram.mean_acceptance_length == pytest.approx(1.22, abs=0.02)
    assert selfdraft.mean_acceptance_length == pytest.approx(1.09, abs=0.02)
    assert ngram.latency_speedup > 1.0 > selfdraft.latency_speedup
    assert selfdraft.latency_speedup == pytest.approx(0.36, abs=0.1)


def test_history_moves_the_prediction_toward_observations() -> None:
    dep, wl = _smollm_chat()
    cand = Candidate(candidate_id="n", family=Family.NGRAM, k=4)
    prior = predict(cand, dep, wl, known_for(dep.target), gpu="cpu")
    row = HistoryRow(
        Family.NGRAM,
        Fingerprint.CHAT,
        temperature=0.0,
        k=4,
        acceptance=0.5,
        speedup=1.6,
        mean_acceptance_length=expected_tokens(0.7, 4),
        target_ref="smollm2-135m-instruct",
        gpu="cpu",
    )
    one = predict(cand, dep, wl, known_for(dep.target), gpu="cpu", history=[row])
    many = predict(cand, dep, wl, known_for(dep.target), gpu="cpu", history=[row] * 200)
    assert prior.acceptance < one.acceptance < many.acceptance <= 0.7
    assert many.acceptance == pytest.approx(0.7, abs=0.01)
    assert prior.latency_speedup < one.latency_speedup
    # 200 rows measured at 1.6x: the cost correction lands the prediction near what was measured.
    assert many.latency_speedup == pytest.approx(1.6, rel=0.05)
    # Rows of another fingerprint or temperature bucket say nothing about this one.
    other = [HistoryRow(Family.NGRAM, Fingerprint.CODE, 0.0, 4, 0.9, 3.0, target_ref="x")]
    sampled = [HistoryRow(Family.NGRAM, Fingerprint.CHAT, 0.8, 4, 0.9, 3.0, target_ref="x")]
    assert (
        predict(cand, dep, wl, known_for(dep.target), gpu="cpu", history=other).acceptance == prior.acceptance
    )
    assert (
        predict(cand, dep, wl, known_for(dep.target), gpu="cpu", history=sampled).acceptance
        == prior.acceptance
    )


def test_sampling_lowers_acceptance() -> None:
    dep, greedy = _smollm_chat()
    sampled = Workload(Fingerprint.CHAT, temperature=0.7, latency_batch=1, throughput_batch=8)
    cand = Candidate(candidate_id="l", family=Family.LOOKAHEAD, k=3)
    assert (
        predict(cand, dep, sampled, known_for(dep.target), gpu="cpu").acceptance
        < predict(cand, dep, greedy, known_for(dep.target), gpu="cpu").acceptance
    )


# --- scoring ----------------------------------------------------------------------------------


def estimate(cid: str, latency: float, throughput: float, memory: int = 0) -> Estimate:
    return Estimate(
        candidate=Candidate(candidate_id=cid, family=Family.NGRAM, k=4),
        acceptance=0.5,
        mean_acceptance_length=1.9,
        draft_cost_ratio=0.0,
        verify_overhead=0.1,
        latency_speedup=latency,
        throughput_speedup=throughput,
        extra_memory_bytes=memory,
    )


def test_ranking_follows_priorities() -> None:
    fast_stream = estimate("fast-stream", latency=2.0, throughput=1.0)
    high_volume = estimate("high-volume", latency=1.2, throughput=1.8)
    by_throughput = rank([fast_stream, high_volume], Priorities(throughput=1.0), Mode.INTERACTIVE)
    by_latency = rank([fast_stream, high_volume], Priorities(latency=1.0), Mode.INTERACTIVE)
    assert [r.candidate.candidate_id for r in by_throughput] == ["high-volume", "fast-stream"]
    assert [r.candidate.candidate_id for r in by_latency] == ["fast-stream", "high-volume"]
    assert [r.prediction.rank for r in by_latency] == [1, 2]
    # Weights are normalised: 7/3 ranks and scores like 0.7/0.3.
    a = rank([fast_stream, high_volume], Priorities(throughput=7, latency=3), Mode.INTERACTIVE)
    b = rank([fast_stream, high_volume], Priorities(throughput=0.7, latency=0.3), Mode.INTERACTIVE)
    assert [(r.candidate.candidate_id, round(r.prediction.score, 9)) for r in a] == [
        (r.candidate.candidate_id, round(r.prediction.score, 9)) for r in b
    ]
    # Interactive runs report the per-stream speedup, batch runs the aggregate one.
    assert rank([fast_stream], Priorities(latency=1), Mode.BATCH)[0].prediction.speedup == 1.0


def test_pareto_front_on_a_hand_built_set() -> None:
    points = [
        ("zero-mem", 1.2, 0),
        ("dominated", 1.1, 10),  # slower and bigger than zero-mem
        ("mid", 1.8, 100),
        ("equal-mid", 1.8, 100),  # ties dominate nobody
        ("worse-mid", 1.7, 150),
        ("top", 2.5, 1000),
        ("same-speed-bigger", 2.5, 2000),
    ]
    assert pareto_front(points) == ["zero-mem", "mid", "equal-mid", "top"]
    assert pareto_front([]) == []


def ranked_row(cid: str, rank_: int, speedup: float) -> RankedCandidate:
    return RankedCandidate(
        candidate=Candidate(candidate_id=cid, family=Family.NGRAM, k=4),
        prediction=Prediction(
            rank=rank_,
            score=speedup,
            acceptance_rate=0.5,
            mean_acceptance_length=1.9,
            speedup=speedup,
            extra_memory_bytes=0,
        ),
    )


def measurement(cid: str, speedup: float, tpot: float = 0.1) -> Measurement:
    return Measurement(
        candidate_id=cid,
        reps=2,
        tokens_per_s=10 * speedup,
        tokens_per_s_stdev=0.1,
        speedup=speedup,
        acceptance_rate=0.4,
        mean_acceptance_length=1.6,
        per_position_acceptance=[0.4],
        ttft_s=0.1,
        tpot_s=tpot,
        extra_memory_bytes=0,
    )


def gate(passed: bool) -> GateOutcome:
    return GateOutcome(method=GateMethod.TOPK5, passed=passed, score=0.99 if passed else 0.7, threshold=0.95)


def completed(decision: Decision) -> RunCompleted:
    return RunCompleted(
        run_id="r1",
        cache_hit=False,
        measured=decision.measured,
        winner=decision.winner,
        candidates=decision.candidates,
        pareto_front=decision.pareto_front,
    )


def test_gate_failure_disqualifies_even_the_fastest() -> None:
    ranked = [ranked_row("fastest", 1, 3.0), ranked_row("safe", 2, 1.5), ranked_row("crashed", 3, 1.2)]
    rows = assemble_results(
        ranked,
        gate_method=GateMethod.TOPK5,
        measurements={"fastest": measurement("fastest", 3.0), "safe": measurement("safe", 1.4)},
        gates={"fastest": gate(False), "safe": gate(True)},
        failures=[CandidateFailure(candidate_id="crashed", error_stage=ErrorStage.MODEL_LOAD, message="oom")],
    )
    by_id = {r.candidate.candidate_id: r for r in rows}
    assert by_id["fastest"].quality_preserved == 0.0
    assert by_id["fastest"].error_stage == ErrorStage.QUALITY_REGRESSION
    assert by_id["crashed"].error_stage == ErrorStage.MODEL_LOAD
    decision = choose_winner(rows, priorities=Priorities(throughput=1), baseline=measurement("baseline", 1.0))
    assert decision.measured
    assert decision.winner is not None and decision.winner.candidate.candidate_id == "safe"
    assert "fastest" not in decision.pareto_front
    completed(decision)


def test_an_ungated_measurement_cannot_win_unless_the_gate_is_skipped() -> None:
    ranked = [ranked_row("a", 1, 2.0)]
    measured = {"a": measurement("a", 2.0)}
    rows = assemble_results(ranked, gate_method=GateMethod.TOPK5, measurements=measured)
    assert rows[0].error_stage == ErrorStage.QUALITY_GATE
    assert (
        choose_winner(rows, priorities=Priorities(throughput=1), baseline=measurement("baseline", 1.0)).winner
        is None
    )
    skipped = assemble_results(ranked, gate_method=GateMethod.SKIPPED, measurements=measured)
    assert choose_winner(
        skipped, priorities=Priorities(throughput=1), baseline=measurement("baseline", 1.0)
    ).winner


def test_nothing_that_loses_to_the_baseline_wins() -> None:
    ranked = [ranked_row("slow", 1, 1.3)]
    rows = assemble_results(
        ranked,
        gate_method=GateMethod.TOPK5,
        measurements={"slow": measurement("slow", 0.8)},
        gates={"slow": gate(True)},
    )
    decision = choose_winner(rows, priorities=Priorities(throughput=1), baseline=measurement("baseline", 1.0))
    assert decision.measured and decision.winner is None
    completed(decision)


def test_measured_winner_follows_priorities() -> None:
    ranked = [ranked_row("throughput", 1, 1.5), ranked_row("latency", 2, 1.4)]
    rows = assemble_results(
        ranked,
        gate_method=GateMethod.TOPK5,
        measurements={
            "throughput": measurement("throughput", 1.6, tpot=0.09),
            "latency": measurement("latency", 1.3, tpot=0.05),
        },
        gates={"throughput": gate(True), "latency": gate(True)},
    )
    base = measurement("baseline", 1.0, tpot=0.1)
    by_thr = choose_winner(rows, priorities=Priorities(throughput=1), baseline=base).winner
    by_lat = choose_winner(rows, priorities=Priorities(latency=1), baseline=base).winner
    assert by_thr is not None and by_thr.candidate.candidate_id == "throughput"
    assert by_lat is not None and by_lat.candidate.candidate_id == "latency"


def test_unmeasurable_target_wins_with_the_predicted_best() -> None:
    plan = plan_run(request(LLAMA_70B, gpu="H100-80GB", engine="vllm"), run_id="r1", host=CPU_HOST)
    assert not plan.measurable_here
    rows = assemble_results(plan.ranked, gate_method=GateMethod.TOPK5)
    decision = choose_winner(rows, priorities=Priorities(throughput=1), baseline=None)
    assert not decision.measured
    assert decision.winner is not None
    assert decision.winner.candidate == plan.ranked[0].candidate
    assert decision.winner.measurement is None
    completed(decision)


# --- plan -------------------------------------------------------------------------------------


def test_offline_alias_on_a_cpu_host_gets_a_quick_bench_of_distinct_families() -> None:
    plan = plan_run(request(fingerprint="code"), run_id="run-1", host=CPU_HOST)
    assert plan.measurable_here and plan.not_measurable_reason is None
    bench = plan.bench_plan
    assert bench is not None
    assert (bench.reps, bench.n_prompts, bench.max_new_tokens) == (2, 3, 48)
    assert bench.sampling.temperature == 0.0
    assert len(bench.candidates) == 3
    assert len({c.family for c in bench.candidates}) == 3
    assert bench.candidates[0] == plan.ranked[0].candidate
    event = plan.run_predicted()
    assert event.candidates[0].prediction.rank == 1
    assert set(event.pareto_front) <= {r.candidate.candidate_id for r in event.candidates}
    tiny = dataclasses.replace(CPU_HOST, bench=BenchDefaults(reps=1, n_prompts=1, max_new_tokens=8))
    small = plan_run(request(fingerprint="code"), run_id="run-1", host=tiny).bench_plan
    assert small is not None and (small.reps, small.n_prompts, small.max_new_tokens) == (1, 1, 8)
    one = dataclasses.replace(
        CPU_HOST, bench=BenchDefaults(reps=1, n_prompts=1, max_new_tokens=8, candidates=1)
    )
    single = plan_run(request(fingerprint="code"), run_id="run-1", host=one).bench_plan
    assert single is not None and single.candidates == [plan.ranked[0].candidate]


def test_measurable_only_where_the_host_matches() -> None:
    gpu_host = HostInfo(cuda=True, gpu_profile="H100-80GB")
    assert not plan_run(request(), run_id="r", host=gpu_host).measurable_here
    assert plan_run(request(gpu="H100-80GB"), run_id="r", host=gpu_host).measurable_here
    assert not plan_run(request(gpu="H200"), run_id="r", host=gpu_host).measurable_here
    with pytest.raises(EngineNotInstalled, match="specops engines install vllm"):
        plan_run(request(engine="vllm"), run_id="r", host=CPU_HOST)
    with_vllm = dataclasses.replace(CPU_HOST, engines=frozenset({Engine.SPECCORE, Engine.VLLM}))
    vllm_cpu = plan_run(request(engine="vllm"), run_id="r", host=with_vllm).bench_plan
    assert vllm_cpu is not None and vllm_cpu.target.engine == Engine.VLLM
    chat = plan_run(request(fingerprint="chat"), run_id="r", host=CPU_HOST)
    assert chat.bench_plan is not None and chat.bench_plan.sampling.temperature > 0.0


def test_vllm_and_sglang_are_measured_where_the_host_says_it_measures_them() -> None:
    """SPECOPS_MEASURED_ENGINES: the benchmark-runner measures them over HTTP there."""
    gpu_host = HostInfo(cuda=True, gpu_profile="H100-80GB", hub_access=True)
    vllm = request(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100-80GB", engine="vllm")
    predicted = plan_run(vllm, run_id="r", host=gpu_host)
    assert not predicted.measurable_here and "vllm is not measured here" in str(
        predicted.not_measurable_reason
    )
    host = dataclasses.replace(gpu_host, engines=frozenset({Engine.SPECCORE, Engine.VLLM}))
    measured = plan_run(vllm, run_id="r", host=host)
    assert measured.bench_plan is not None and measured.bench_plan.target.engine == Engine.VLLM
    assert not plan_run(request(engine="sglang", gpu="H100-80GB"), run_id="r", host=host).measurable_here
