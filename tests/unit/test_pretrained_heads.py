"""The heads committed for smollm2-135m-instruct: loaded as they are (never retrained
in tests), traceable to the target and data they were trained on, lossless, and
useful — they get drafts accepted on held-out prompts."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from speccore.engine import Engine, Request
from speccore.heads.artifact import read_config
from speccore.proposers.base import ProposerConfig
from speccore.training.data import read_examples
from speccore.training.features import target_fingerprint

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
    data = ROOT / prov["data"]["path"]
    assert hashlib.sha256(data.read_bytes()).hexdigest() == prov["data"]["sha256"]
    assert prov["steps"] > 0 and prov["train_seconds"] > 0 and prov["hardware"]
    # The curve starts untrained and ends with the held-out acceptance the config quotes.
    assert prov["curve"][0]["epoch"] == 0 and prov["curve"][-1]["heldout"] == prov["heldout_acceptance"]
    held = {ex.prompt for ex in read_examples(DATA / "heldout.jsonl")}
    assert not held & {ex.prompt for ex in read_examples(data)}


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_committed_head_drafts_accepted_tokens_losslessly(smollm, method):
    prompts = [
        smollm.encode_prompt(ex.prompt, chat=True) for ex in list(read_examples(DATA / "heldout.jsonl"))[:2]
    ]
    requests = [Request(p, max_new_tokens=32) for p in prompts]
    reference = [g.token_ids for g in Engine(smollm, "none").generate(requests)]
    gens = Engine(smollm, method, ProposerConfig(head=str(HEADS / method))).generate(requests)
    assert [g.token_ids for g in gens] == reference
    accepted = sum(g.metrics.accepted_tokens for g in gens)
    steps = sum(g.metrics.verify_steps for g in gens)
    assert accepted / steps > 0.2  # an untrained head gets almost nothing accepted
