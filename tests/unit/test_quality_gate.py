"""The quality gate's seven methods: real candidates pass, a lossy one fails.

Every speccore family is lossless, so on the real model an n-gram and a
draft-model candidate pass every measured method with the best possible score.
speccore's opt-in lossy acceptance rule emits draft tokens the target would not
pick; `exact` must fail it, and the bound is the caller's to set.
"""

from __future__ import annotations

import math

import pytest
import torch

from speccore.candidates import ignored_options
from speccore.errors import SpecError
from speccore.sampling import SamplingParams
from speccore.verify import Block, verify_block
from specops_schemas.candidates import Candidate
from specops_schemas.catalog import GateMethod
from specops_services.quality_gate.decoding import LOSSY_OPTION, build_engine
from specops_services.quality_gate.gate import QualityGate, evaluate, pending, skipped
from specops_services.quality_gate.logit_kl import kl_per_position
from specops_services.quality_gate.sample import GateSample, Thresholds
from specprompts.mmlu import parse_answer
from specprompts.structured import structured_tasks, violations

# Tiny on purpose: 2 prompts x 24 tokens, 4 MMLU questions, 2 structured tasks.
SAMPLE = GateSample(
    n_prompts=2,
    max_new_tokens=24,
    batch_size=2,
    mmlu_questions=4,
    mmlu_new_tokens=3,
    structured_tasks=2,
    structured_new_tokens=32,
)
NGRAM = Candidate(candidate_id="ngram-k8", family="ngram", k=8)
DRAFT = Candidate(candidate_id="self6-k3", family="draft_model", draft="self:6", k=3)
# Also accepts any n-gram draft the target gives >= 1 %: on these prompts the target rates
# several of them at ~3 % while preferring another token.
LOSSY = Candidate(candidate_id="lossy-ngram", family="ngram", k=8, options={LOSSY_OPTION: 0.01})
# A one-layer draft whose tokens are accepted whenever the target gives them 1e-6:
# many fall outside the target's top 5.
VERY_LOSSY = Candidate(
    candidate_id="lossy-self1", family="draft_model", draft="self:1", k=3, options={LOSSY_OPTION: 1e-6}
)
LOOKAHEAD = Candidate(candidate_id="lookahead-k4", family="lookahead", k=4)
MEASURED = [
    GateMethod.EXACT,
    GateMethod.TOPK5,
    GateMethod.LOGIT_KL,
    GateMethod.MMLU_SLICE,
    GateMethod.CONSTRAINT_VIOLATION,
]


# --- without a model --------------------------------------------------------------


def test_skipped_passes_unmeasured_and_asks_for_an_audit_row() -> None:
    outcome = skipped("research run, opted out")
    assert outcome.method == GateMethod.SKIPPED
    assert outcome.passed is True
    assert outcome.score is None
    assert outcome.details["audit"] is True
    assert outcome.details["reason"] == "research run, opted out"


def test_pending_has_no_verdict() -> None:
    outcome = pending()
    assert outcome.method == GateMethod.PENDING
    assert outcome.passed is None


def test_bad_settings_are_refused() -> None:
    with pytest.raises(SpecError, match="finite"):
        Thresholds(logit_kl=math.nan)
    with pytest.raises(SpecError, match="no threshold"):
        Thresholds().of(GateMethod.SKIPPED)
    with pytest.raises(SpecError, match="n_prompts"):
        GateSample(n_prompts=0)


def test_kl_is_zero_for_equal_logits_and_matches_the_formula() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    assert kl_per_position(logits, logits.clone(), 1.0).tolist() == [0.0, 0.0, 0.0]
    p, q = torch.tensor([[0.5, 0.5]]).log(), torch.tensor([[0.9, 0.1]]).log()
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert kl_per_position(p, q, 1.0).item() == pytest.approx(expected)


def test_violations_count_unparseable_replies_and_schema_errors() -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"const": "get_weather"}, "city": {"type": "string"}},
        "required": ["name", "city"],
        "additionalProperties": False,
    }
    assert violations('{"name": "get_weather", "city": "Oslo"}', schema) == (0, None)
    assert violations('```json\n{"name": "get_weather", "city": "Oslo"}\n```', schema)[0] == 1
    assert violations('{"name": "get_weather", "city": "Os', schema)[0] == 1  # cut off by the budget
    count, problem = violations('{"name": "web_search", "extra": 1}', schema)
    assert count == 3  # wrong const, missing city, unexpected property
    assert problem is not None


def test_answer_letter_is_the_first_standalone_one() -> None:
    assert parse_answer(" B") == 1
    assert parse_answer(" The answer is C.") == 2
    assert parse_answer(" Answer") is None


def test_lossy_acceptance_is_opt_in() -> None:
    # Target argmax is token 1 everywhere; the draft guesses token 2, which the target gives ~24 %.
    logits = torch.tensor([[[0.0, 2.0, 1.0, -5.0]] * 2])  # [1, 2, vocab]
    block = Block(
        tokens=torch.tensor([[0, 2]]),
        parents=torch.tensor([[-1, 0]]),
        acceptable=torch.tensor([[False, True]]),
    )
    args = (block, logits, SamplingParams(), [None])
    assert verify_block(*args).accepted_nodes == [[0]]
    assert verify_block(*args, lossy_accept_threshold=0.2).accepted_nodes == [[0, 1]]
    assert verify_block(*args, lossy_accept_threshold=0.5).accepted_nodes == [[0]]


# --- on the real model ------------------------------------------------------------


@pytest.fixture(scope="module")
def gate(smollm) -> QualityGate:
    # The two kinds with the shortest prompts (~250 tokens; tool calls carry ~550): prefill dominates.
    tasks = [t for t in structured_tasks(4) if t.kind in ("answer_json", "triage")]
    return QualityGate(smollm, SAMPLE, tasks=tasks)


@pytest.mark.slow
@pytest.mark.parametrize("candidate", [NGRAM, DRAFT], ids=lambda c: c.candidate_id)
@pytest.mark.parametrize("method", MEASURED, ids=str)
def test_lossless_candidates_pass_every_method(gate, candidate: Candidate, method: GateMethod) -> None:
    outcome = gate.evaluate(method, candidate)
    assert outcome.passed is True, outcome.details
    assert outcome.threshold == Thresholds().of(method)
    assert outcome.details["candidate_id"] == candidate.candidate_id
    best = {
        GateMethod.EXACT: 1.0,
        GateMethod.TOPK5: 1.0,
        GateMethod.LOGIT_KL: 0.0,
        GateMethod.MMLU_SLICE: 0.0,
        GateMethod.CONSTRAINT_VIOLATION: 0.0,
    }[method]
    assert outcome.score == pytest.approx(best, abs=1e-9)


CHAT_SAMPLING = SamplingParams(temperature=0.7)  # what T1 plans for chat (predictor.plan)


@pytest.mark.slow
@pytest.mark.parametrize("candidate", [NGRAM, DRAFT, LOOKAHEAD], ids=lambda c: c.candidate_id)
def test_lossless_candidates_pass_topk5_when_sampling(gate, candidate: Candidate) -> None:
    outcome = gate.evaluate(GateMethod.TOPK5, candidate, CHAT_SAMPLING)
    assert outcome.passed is True, outcome.details
    # The target's own sampler leaves its top 5 now and then: an absolute share would
    # have failed these lossless candidates (it did, at 0.90-0.94, before the score
    # was measured against the target's expected share).
    assert outcome.details["target_expected_share"] < 1.0
    assert outcome.score is not None and 0.95 <= outcome.score <= 1.1


@pytest.mark.slow
def test_a_rule_accepting_unlikely_drafts_fails_topk5_when_sampling(gate) -> None:
    outcome = gate.evaluate(GateMethod.TOPK5, VERY_LOSSY, CHAT_SAMPLING)
    assert outcome.passed is False, outcome.details
    assert outcome.details["outside_top5"] > 0


@pytest.mark.slow
def test_verify_logits_match_plain_decoding_when_sampling(gate) -> None:
    outcome = gate.evaluate(GateMethod.LOGIT_KL, NGRAM, SamplingParams(temperature=0.8, top_p=0.95))
    assert outcome.passed is True
    assert outcome.score == pytest.approx(0.0, abs=1e-9)
    assert outcome.details["tokens"] > 0


@pytest.mark.slow
def test_lossy_candidate_fails_exact_unless_the_bound_allows_it(gate) -> None:
    outcome = gate.evaluate(GateMethod.EXACT, LOSSY)
    assert outcome.passed is False
    assert outcome.score is not None and 0.5 < outcome.score < 1.0
    assert outcome.details["identical_prompts"] < SAMPLE.n_prompts
    assert isinstance(outcome.details["worst_prompt"], dict)
    assert outcome.details["worst_prompt"]["first_divergence"] is not None

    lenient = gate.evaluate(GateMethod.EXACT, LOSSY, thresholds=Thresholds(exact=0.5))
    assert lenient.passed is True
    assert (lenient.score, lenient.threshold) == (outcome.score, 0.5)


@pytest.mark.slow
def test_lossy_tokens_fail_logit_kl_although_the_logits_agree(gate) -> None:
    outcome = gate.evaluate(GateMethod.LOGIT_KL, LOSSY)
    assert outcome.passed is False
    assert outcome.score is not None and outcome.score <= Thresholds().logit_kl
    assert isinstance(outcome.details["emitted_off_argmax"], int)
    assert outcome.details["emitted_off_argmax"] > 0


@pytest.mark.slow
def test_one_call_evaluate_scores_real_mmlu_answers(smollm) -> None:
    outcome = evaluate(
        GateMethod.MMLU_SLICE,
        target=smollm,
        candidate=NGRAM,
        sample=SAMPLE,
        thresholds=Thresholds(mmlu_slice=0.1),
    )
    assert (outcome.passed, outcome.score, outcome.threshold) == (True, 0.0, 0.1)
    assert outcome.details["questions"] == SAMPLE.mmlu_questions
    # The model's replies carry an answer letter: the slice measures answers, not silence.
    assert outcome.details["baseline_unanswered"] == 0


@pytest.mark.slow
def test_transient_and_opt_out_methods_measure_nothing(gate) -> None:
    assert gate.evaluate("pending", NGRAM).passed is None
    outcome = gate.evaluate("skipped", NGRAM, reason="tenant opted out")
    assert outcome.passed is True
    assert outcome.details == {"audit": True, "reason": "tenant opted out", "measured": False}


@pytest.mark.slow
def test_families_speccore_cannot_run_are_refused(gate) -> None:
    mtp = Candidate(candidate_id="mtp", family="mtp", k=2)
    with pytest.raises(SpecError, match="cannot run family 'mtp'"):
        gate.evaluate(GateMethod.TOPK5, mtp)
    medusa = Candidate(candidate_id="medusa", family="medusa", draft="/nonexistent/heads-1", k=3)
    with pytest.raises(SpecError, match="no head directory at /nonexistent/heads-1"):
        gate.evaluate(GateMethod.TOPK5, medusa)


@pytest.mark.slow
def test_candidate_options_reach_speccore(smollm) -> None:
    # prompt_lookup_min: vLLM's name for ngram_min, which speccore reads too (measured as rendered).
    options = {"ngram_max": 2, "prompt_lookup_min": 2, LOSSY_OPTION: 0.2}
    candidate = Candidate(candidate_id="ngram-2", family="ngram", k=4, options=options)
    engine = build_engine(smollm, candidate)
    assert (engine.proposer.k, engine.proposer.ngram_min, engine.proposer.ngram_max) == (4, 2, 2)
    assert engine.lossy_accept_threshold == 0.2
    assert ignored_options(candidate) == []
    for bad in ({"ngram_max": "two"}, {LOSSY_OPTION: True}, {LOSSY_OPTION: 1.5}):
        with pytest.raises(SpecError):
            build_engine(smollm, Candidate(candidate_id="bad", family="ngram", k=4, options=bad))
