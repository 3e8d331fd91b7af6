"""The quality gate's verdict on a trained T3 head (services/quality_gate/heads.py): the numbers,
the decision and its reason, the held-out prompts, one verdict id per artifact; and a real
decode of smollm2 with an untrained Medusa head, which must be lossless whatever its quality."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from heads import frequent_ids, save_random_head

from specbus.envelope import new_event
from speccore.bench import RepRun
from speccore.metrics import GenerationMetrics
from speccore.models import LoadedModel
from speccore.split import HELDOUT_FRACTION, is_heldout
from specops_schemas.catalog import ErrorStage
from specops_schemas.heads import HeadArtifact, HeadGateSpec, HeadTrained, HeadTrainRequest
from specops_services.quality_gate import heads, logic

HEAD_ID = "hd-" + "c" * 24
SHA = "d" * 64


def _run(
    method: str, rep: int, tokens: list[list[int]], seconds: float, drafted: int = 0, accepted: int = 0
) -> RepRun:
    metrics = [
        GenerationMetrics(
            new_tokens=len(row), verify_steps=4, drafted_tokens=drafted, accepted_tokens=accepted
        )
        for row in tokens
    ]
    return RepRun(method, rep, tokens, metrics if method == heads.HEAD else [], seconds, None)


def _reps(head_tokens: list[list[int]], *, head_s: float = 1.0) -> list[RepRun]:
    base = [[1, 2, 3], [4, 5, 6]]
    runs = []
    for rep in range(2):
        none = _run(heads.NONE, rep, base, 2.0)
        head = _run(heads.HEAD, rep, head_tokens, head_s, drafted=10, accepted=4)
        runs += [none, RepRun(head.method, rep, head.token_ids, head.metrics, head_s, none.seconds / head_s)]
    return runs


def test_an_identical_decoding_passes_with_its_numbers() -> None:
    result = heads.verdict(
        _reps([[1, 2, 3], [4, 5, 6]]), HeadGateSpec(min_acceptance=0.3), n_prompts=2, hardware="cpu"
    )
    assert result.passed and result.lossless
    assert result.acceptance_rate == pytest.approx(0.4)
    assert result.mean_acceptance_length == pytest.approx((4 + 4) / 4)
    assert result.speedup == pytest.approx(2.0)
    assert result.tokens_per_s == pytest.approx(6.0) and result.baseline_tokens_per_s == pytest.approx(3.0)
    assert "0.400 >= min_acceptance 0.300" in result.reason and "(not required)" in result.reason


def test_a_single_differing_token_fails_as_lossy() -> None:
    result = heads.verdict(
        _reps([[1, 2, 3], [4, 5, 7]]), HeadGateSpec(min_acceptance=0.0), n_prompts=2, hardware="cpu"
    )
    assert not result.passed and not result.lossless
    assert "not lossless: 2 prompt decodings differ" in result.reason


def test_thresholds_name_the_numbers_compared() -> None:
    gate = HeadGateSpec(min_acceptance=0.99, min_speedup=3.0)
    result = heads.verdict(_reps([[1, 2, 3], [4, 5, 6]]), gate, n_prompts=2, hardware="cpu")
    assert not result.passed and result.lossless
    assert "acceptance rate 0.400 < min_acceptance 0.990" in result.reason
    assert "speedup 2.00x < min_speedup 3.00x" in result.reason
    ok, reason = heads.decide(
        HeadGateSpec(min_acceptance=0.2, min_speedup=1.5),
        lossless=True,
        mismatched=0,
        acceptance=0.4,
        speedup=2.0,
    )
    assert ok and "speedup 2.00x >= min_speedup 1.50x" in reason


def test_heldout_prompts_come_from_the_heldout_file_or_the_training_split(tmp_path: Path) -> None:
    prompts = [f"question number {i}" for i in range(400)]
    lines = [json.dumps({"prompt": p, "completion": "an answer"}) for p in prompts]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "held.jsonl").write_text("\n".join(lines[:3]) + "\n")
    assert heads.heldout_prompts(tmp_path, "train.jsonl", "held.jsonl", 2) == prompts[:2]
    split = heads.heldout_prompts(tmp_path, "train.jsonl", None, 64)
    assert split and split == [p for p in prompts if is_heldout(p, HELDOUT_FRACTION)][:64]
    (tmp_path / "empty.jsonl").write_text(lines[0] + "\n")
    if not is_heldout(prompts[0], HELDOUT_FRACTION):
        with pytest.raises(Exception, match="no held-out prompt"):
            heads.heldout_prompts(tmp_path, "empty.jsonl", None, 4)


def _trained(sha: str = SHA) -> HeadTrained:
    artifact = HeadArtifact(
        sha256=sha,
        path=f"heads/acme/{sha}",
        weights_sha256="e" * 64,
        target_weights="fp",
        num_heads=2,
        params=10,
    )
    request = HeadTrainRequest(target="smollm2-135m-instruct", family="medusa", train_data="f" * 64)
    return HeadTrained(
        head_id=HEAD_ID,
        request=request,
        heldout_path=None,
        train_path="head-data/acme/x.jsonl",
        artifact=artifact,
        stopped_by="epochs",
        steps=1,
        tokens_seen=10,
        train_seconds=1.0,
    )


def test_one_verdict_id_per_head_artifact() -> None:
    first = new_event(_trained(), tenant_id="acme", correlation_id=HEAD_ID, producer="head-trainer")
    again = new_event(_trained(), tenant_id="acme", correlation_id=HEAD_ID, producer="head-trainer")
    assert first.event_id != again.event_id
    failed = logic.head_failed(again, ErrorStage.MODEL_LOAD, "no target")
    result = heads.verdict(_reps([[1, 2, 3], [4, 5, 6]]), HeadGateSpec(), n_prompts=2, hardware="cpu")
    gated = logic.head_gated(first, result)
    assert gated.event_id == failed.event_id == logic.head_verdict_id(_trained())
    assert logic.head_verdict_id(_trained("0" * 64)) != gated.event_id
    assert gated.subject == f"spec.head.{HEAD_ID}.gated" and gated.correlation_id == HEAD_ID
    assert {type(gated.payload), type(failed.payload)} <= set(logic.PUBLISHES)


@pytest.mark.slow
def test_an_untrained_medusa_head_decodes_losslessly_on_smollm(smollm: LoadedModel, tmp_path: Path) -> None:
    head_dir = save_random_head(smollm, "medusa", tmp_path / "medusa", frequent_ids(smollm), num_heads=2)
    gate = HeadGateSpec(min_acceptance=0.0, n_prompts=2, max_new_tokens=12, reps=2)
    result = heads.evaluate_head(smollm, head_dir, gate, ["Name three colours.", "What is 2 + 2?"])
    assert result.lossless and result.passed
    assert result.n_prompts == 2 and result.max_new_tokens == 12
    assert 0.0 <= result.acceptance_rate <= 1.0 and result.mean_acceptance_length >= 1.0
    assert result.speedup > 0 and result.hardware


def test_a_head_for_another_target_is_unusable(smollm: LoadedModel, tmp_path: Path) -> None:
    head_dir = save_random_head(
        smollm, "medusa", tmp_path / "wide", frequent_ids(smollm), num_heads=2, hidden_size=64
    )
    with pytest.raises(heads.HeadUnusable):
        heads.evaluate_head(smollm, head_dir, HeadGateSpec(n_prompts=1, max_new_tokens=8, reps=1), ["Hi"])
