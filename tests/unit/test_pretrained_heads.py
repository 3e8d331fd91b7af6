"""The heads committed for smollm2-135m-instruct: loaded as they are (never retrained
in tests), traceable to the target and data they were trained on, lossless, and
useful — they get drafts accepted on held-out prompts."""

from __future__ import annotations

from pathlib import Path

import pytest

from speccore.engine import Engine, Request
from speccore.heads.artifact import read_config
from speccore.heads.builtin import builtin_heads
from speccore.proposers.base import ProposerConfig
from speccore.training.chunks import chunk_files
from speccore.training.data import read_examples
from speccore.training.features import target_fingerprint
from speccore.training.run import data_sha256

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HEADS = ROOT / "libs/speccore/heads/pretrained/smollm2-135m-instruct"
DATA = ROOT / "artifacts/heads/smollm2-135m-instruct/data"


@pytest.mark.parametrize("family", ["medusa", "eagle"])
def test_committed_head_records_what_it_was_trained_on(smollm, family):
    config = read_config(HEADS / family)
    prov = config.provenance
    assert config.family == family and prov["target"] == "smollm2-135m-instruct"
    assert prov["target_weights"] == target_fingerprint(smollm)
    data = ROOT / prov["data"]["path"]  # a JSONL file, or a chunk directory (each file checked)
    assert data_sha256(data) == prov["data"]["sha256"]
    trained_on = chunk_files(data)[0] if data.is_dir() else [data]
    assert prov["steps"] > 0 and prov["train_seconds"] > 0 and prov["hardware"]
    # The curve starts untrained and ends with the held-out acceptance the config quotes.
    assert prov["curve"][0]["epoch"] == 0 and prov["curve"][-1]["heldout"] == prov["heldout_acceptance"]
    held = {ex.prompt for ex in read_examples(DATA / "heldout.jsonl")}
    assert not held & {ex.prompt for path in trained_on for ex in read_examples(path)}


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_committed_head_drafts_accepted_tokens_losslessly(smollm, method):
    prompts = [
        smollm.encode_prompt(ex.prompt, chat=True) for ex in list(read_examples(DATA / "heldout.jsonl"))[:2]
    ]
    requests = [Request(p, max_new_tokens=32) for p in prompts]
    reference = [g.token_ids for g in Engine(smollm, "none").generate(requests)]
    # Candidates name the shipped heads builtin:<name>; speccore finds them for the target.
    gens = Engine(smollm, method, ProposerConfig(head=f"builtin:{method}")).generate(requests)
    assert [g.token_ids for g in gens] == reference
    accepted = sum(g.metrics.accepted_tokens for g in gens)
    steps = sum(g.metrics.verify_steps for g in gens)
    assert accepted / steps > 0.2  # an untrained head gets almost nothing accepted


def test_t1_offers_the_shipped_heads_for_their_model() -> None:
    from specops_schemas.api import RunCreateRequest
    from specops_services.predictor.plan import HostInfo, plan_run

    request = RunCreateRequest.model_validate(
        {
            "target": {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"},
            "workload": {"fingerprint": "chat"},
        }
    )
    plan = plan_run(request, run_id="r", host=HostInfo(cuda=False))
    heads = {r.candidate.draft for r in plan.ranked if r.candidate.family in ("medusa", "eagle")}
    assert heads == {"builtin:medusa", "builtin:eagle"}
    # The predictor starts from each shipped head's held-out chain acceptance (its config's
    # curve: EAGLE 0.69, Medusa 0.28), scaled alike for the workload, not from its family's
    # literature prior (EAGLE 0.72, Medusa 0.50).
    shipped = {h.head_id: h.acceptance for h in builtin_heads("smollm2-135m-instruct")}
    scale = {
        r.candidate.draft: r.prediction.acceptance_rate / shipped[r.candidate.draft]
        for r in plan.ranked
        if r.candidate.draft in heads
    }
    assert scale["builtin:eagle"] == pytest.approx(scale["builtin:medusa"])
    gemma = request.target.model_copy(update={"model_ref": "gemma-3-270m"})
    other = plan_run(request.model_copy(update={"target": gemma}), run_id="r", host=HostInfo(cuda=False))
    assert not {r.candidate.family for r in other.ranked} & {"medusa", "eagle"}
