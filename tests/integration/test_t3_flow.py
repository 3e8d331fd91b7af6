"""Issue 18's acceptance test: T3 as a user drives it, through the gateway, on a whole `specops up`.

One runtime (embedded NATS and PostgreSQL, every service its own process, TINY benches), one
tenant with a developer's and a head reviewer's token, another tenant, and the SDK: training
and held-out JSONL uploaded, `heads.submit` of a small Medusa head on smollm2 -> per-epoch
progress -> the quality gate's pass -> `validated`; the refusals (another tenant 404,
validated -> production 409, a developer's promotion to production 403, a promotion without
rationale 422); `uat` (developer) -> `production` (head reviewer, approval row with the
rationale); a new T1 run of the tenant lists and measures the head; deprecation -> the same
request is no cache hit on the answer that listed the head, and the new run does not offer
it. Every move is an event, and the audit log holds each. And the product's T3 example on a
published head: a vLLM H100 run of Llama-3.1-8B-Instruct (predicted here) lists the
published EAGLE-3 head, and `apply` renders the `--speculative-config` that loads it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path

import psycopg
import pytest
import torch
from fixtures.runtime import TINY, started

from specops.client import Run, SpecopsAPIError, SpeculativeClient
from specops_schemas.catalog import Role
from specops_schemas.heads import HeadResponse
from specops_services.gateway.http.tokens import issue_token

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="measures the cpu profile; this host has CUDA"),
]

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "artifacts" / "heads" / "smollm2-135m-instruct" / "data"
TARGET = {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"}
WORKLOAD = "chat"
WAIT_S = 900.0
RATIONALE = "held-out acceptance checked by hand"
PUBLISHED_EAGLE3 = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
# The T1 run must measure a winner, or it cannot be applied: at TINY's 8 new tokens a candidate
# at 1.2x can measure below 1 on a shared host (eagle once measured 0.97 there, 1.19 alone).
MEASURE = {"SPECOPS_BENCH_NEW_TOKENS": "32"}
# A head small enough to train in seconds on two cores, gated on two held-out prompts. The
# threshold is low: three epochs on 160 examples is what this test can afford, not a good
# head (it measured acceptance 0.062 on the gate's prompts, 2026-11-25).
HEAD = {
    "target": TARGET["model_ref"],
    "family": "medusa",
    "name": "support-triage-medusa",
    "epochs": 3,
    "num_heads": 3,
    "max_len": 128,
    "draft_vocab": 2048,
    "gate": {"min_acceptance": 0.03, "n_prompts": 2, "max_new_tokens": 16, "reps": 1},
}


def _lines(path: Path, n: int) -> bytes:
    with path.open("rb") as f:
        return b"".join(itertools.islice(f, n))


def test_t3_through_the_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    start = time.monotonic()
    with started(monkeypatch, env=TINY | MEASURE) as runtime:
        dev, reviewer, globex = (
            asyncio.run(issue_token(runtime.database_url, tenant_id=tenant, role=role))
            for tenant, role in (
                ("t3-acme", Role.DEVELOPER),
                ("t3-acme", Role.HEAD_REVIEWER),
                ("t3-globex", Role.ADMIN),
            )
        )
        with (
            SpeculativeClient(runtime.url, dev.secret) as client,
            SpeculativeClient(runtime.url, reviewer.secret) as reviewing,
            SpeculativeClient(runtime.url, globex.secret) as other,
        ):
            head = _trained(client)
            _refused(client, reviewing, other, head)  # and moved to uat by the developer
            promoted = reviewing.heads.transition(head.id, "production", RATIONALE)
            assert promoted.state == "production"
            _approval(runtime.database_url, head.id, reviewer.token_id)
            measured = _t1_offers(client, head)
            deprecated = client.heads.transition(head.id, "deprecated", "drafts leak a retired product name")
            assert deprecated.state == "deprecated"
            again = _t1_after_deprecation(client, head, measured)
            types = [e.type for e in client.heads.stream(head.id)]
            _published_head_on_vllm(other)
        _audited(runtime.database_url, head.id)
    moves = [f"{t.from_state}->{t.to_state}" for t in deprecated.transitions]
    assert moves == ["training->validated", "validated->uat", "uat->production", "production->deprecated"]
    assert types[0] == "head.requested" and types.count("head.transitioned") == 4, types
    assert types.count("head.epoch_completed") == 4 and "head.gated" in types, types
    print(
        f"T3: head {head.id} gated acceptance {head.gate.acceptance_rate:.3f}, speedup "
        f"{head.gate.speedup:.2f}x; T1 run {measured.id} measured it, {again.id} did not offer it; "
        f"{time.monotonic() - start:.0f} s in all"
    )


def _trained(client: SpeculativeClient) -> HeadResponse:
    """Upload, submit, follow to the gate's verdict: validated, with its curve and measurements."""
    train = client.heads.upload(_lines(DATA / "train.jsonl", 160))
    heldout = client.heads.upload(_lines(DATA / "heldout.jsonl", 6))
    assert train.examples == 160 and heldout.examples == 6
    head = client.heads.submit(train_data=train.sha256, heldout_data=heldout.sha256, **HEAD)
    assert head.state == "training" and head.id.startswith("hd-")
    deadline = time.monotonic() + WAIT_S
    while (head := client.heads.get(head.id)).state == "training":
        assert time.monotonic() < deadline, f"head {head.id} still training after {WAIT_S:g} s"
        time.sleep(2.0)
    assert head.state == "validated", (head.state, head.error, head.gate)
    assert [e.epoch for e in head.epochs] == [0, 1, 2, 3]
    assert head.epochs[-1].train_loss is not None and head.epochs[-1].tokens_seen > 0
    assert head.artifact is not None and head.gate is not None
    assert head.gate.passed and head.gate.lossless and head.gate.n_prompts == 2
    assert head.transitions[-1].actor == "quality-gate"
    assert head.id in {h.id for h in client.heads.list()}
    return head


def _refused(
    client: SpeculativeClient, reviewing: SpeculativeClient, other: SpeculativeClient, head: HeadResponse
) -> None:
    for call, status in (
        (lambda: other.heads.get(head.id), 404),
        (lambda: other.heads.transition(head.id, "uat"), 404),
        (lambda: reviewing.heads.transition(head.id, "production", "skip uat"), 409),
    ):
        with pytest.raises(SpecopsAPIError) as err:
            call()
        assert err.value.status == status, err.value
    assert head.id not in {h.id for h in other.heads.list()}
    client.heads.transition(head.id, "uat")
    for call, status in (
        (lambda: client.heads.transition(head.id, "production", "ship it"), 403),
        (lambda: reviewing.heads.transition(head.id, "production"), 422),
    ):
        with pytest.raises(SpecopsAPIError) as err:
            call()
        assert err.value.status == status, err.value
    assert client.heads.get(head.id).state == "uat"


def _approval(database_url: str, head_id: str, reviewer_token: str) -> None:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT actor, rationale FROM speculative_head_approvals WHERE head_id = %s", (head_id,)
        ).fetchall()
    assert rows == [(reviewer_token, RATIONALE)]


def _uses(run: Run, head_id: str) -> list[str]:
    return [c.candidate.candidate_id for c in run.candidates if c.candidate.draft == head_id]


def _t1_offers(client: SpeculativeClient, head: HeadResponse) -> Run:
    """A new T1 run of the tenant lists the production head and measures one of its candidates."""
    run = client.runs.wait(client.runs.create(target=TARGET, workload=WORKLOAD).id, timeout=WAIT_S)
    assert run.status == "completed" and run.measured and not run.cache_hit, run
    offered = _uses(run, head.id)
    assert offered, [c.candidate.candidate_id for c in run.candidates]
    measured = [c for c in run.candidates if c.candidate.draft == head.id and c.measurement is not None]
    assert measured, "the tenant's production head was listed but not measured"
    # apply: speccore loads the head from the registry's artifact; vLLM cannot load its layout.
    chosen = measured[0].candidate.candidate_id
    applied = client.runs.apply(run.id, candidate_id=chosen)
    head_dir = Path(applied.cli_args[applied.cli_args.index("--head") + 1])
    assert head.artifact is not None and str(head_dir).endswith(head.artifact.path)
    assert (head_dir / "head.safetensors").is_file()
    with pytest.raises(SpecopsAPIError) as err:
        client.runs.apply(run.id, engine="vllm", candidate_id=chosen)
    assert err.value.status == 422 and "T3 head" in str(err.value), err.value
    return run


def _t1_after_deprecation(client: SpeculativeClient, head: HeadResponse, before: Run) -> Run:
    """The answer that listed the head is gone from the cache; the new plan leaves the head out."""
    run = client.runs.wait(client.runs.create(target=TARGET, workload=WORKLOAD).id, timeout=WAIT_S)
    assert run.status == "completed" and not run.cache_hit and run.id != before.id, run
    assert not _uses(run, head.id)
    return run


def _published_head_on_vllm(client: SpeculativeClient) -> None:
    target = {"model_ref": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "H100-80GB", "engine": "vllm"}
    run = client.runs.wait(client.runs.create(target=target, workload=WORKLOAD).id, timeout=WAIT_S)
    assert run.status == "completed" and run.measured is False, run
    published = [c for c in run.candidates if c.candidate.draft == PUBLISHED_EAGLE3]
    assert published, [c.candidate.candidate_id for c in run.candidates]
    applied = client.runs.apply(run.id, candidate_id=published[0].candidate.candidate_id)
    config = json.loads(applied.cli_args[applied.cli_args.index("--speculative-config") + 1])
    assert config["method"] == "eagle3" and config["model"] == PUBLISHED_EAGLE3, config


def _audited(database_url: str, head_id: str) -> None:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT type, count(*) FROM audit_log WHERE subject LIKE %s GROUP BY type",
            (f"spec.head.{head_id}.%",),
        ).fetchall()
    counts = dict(rows)
    assert counts.get("head.transitioned") == 4 and counts.get("head.gated") == 1, counts
