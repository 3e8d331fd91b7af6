"""The T3 head registry on a real nats-server and PostgreSQL: the gateway's uploads, POST
heads/train publishing head.requested, its heads projector folding the trainer's and the gate's
events (played by the test, which needs no trainer or gate for it) and publishing the
head.transitioned each verdict leads to, people's transitions with their roles, approvals and
refusals, deprecation forgetting the tenant's cached answers that listed the head, a head
whose event a service parked failed once, the SSE stream, the SDK and the CLI."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import psycopg
import pytest
from fixtures import bus
from fixtures.gateway import ServerThread, gateway_settings, issue_tokens, run_body, running_gateway
from fixtures.head_flows import (
    ARTIFACT,
    HEADS,
    JSONL,
    SHA,
    WAIT_S,
    train_body,
    trainer_flow,
    wait_head,
)
from fixtures.postgres import PostgresCluster
from nats.js import JetStreamContext

from specbus import make_broker
from specbus.dlq import DeadLetter
from specbus.envelope import new_event
from speccatalog.artifacts import head_data_path
from specops.client import SpecopsAPIError, SpeculativeClient
from specops.commands import heads as heads_cli
from specops.runtime.rebuild import diff, rebuild
from specops_schemas.candidates import Candidate, CandidateResult, GateOutcome, Prediction
from specops_schemas.catalog import ErrorStage, Family, GateMethod, Role
from specops_schemas.events import RunCompleted
from specops_schemas.heads import (
    HeadFailed,
    HeadTrainRequest,
)
from specops_services.audit.app import subscribe as subscribe_audit
from specops_services.audit.replay import ReplayStart
from specops_services.gateway.app import create_app
from specops_services.gateway.http.tokens import issue_token
from specplatform.db import create_pool

PREDICTION = Prediction(
    rank=1, score=1.0, acceptance_rate=0.5, mean_acceptance_length=1.9, speedup=1.5, extra_memory_bytes=0
)
GATE = GateOutcome(method=GateMethod.TOPK5, passed=True, score=0.99, threshold=0.95)


def sse_events(text: str) -> list[dict[str, str]]:
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            if line and not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = fields.get(name, "") + value.removeprefix(" ")
        if fields:
            events.append(fields)
    return events


async def test_uploads_train_and_the_gate_verdict(
    db: str, nats_url: str, js: JetStreamContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ENABLE_L4_EAGLE3_TRAINING", raising=False)
    async with running_gateway(db, nats_url, artifact_dir=tmp_path, datastore_max_bytes=4096) as gw:

        async def upload(body: str, media: str = "application/jsonl", who: str = "dev"):
            return await gw.client.post(
                f"{HEADS}/data", content=body, headers=gw.auth(who, **{"Content-Type": media})
            )

        first = await upload(JSONL)
        again = await upload(JSONL, media="application/x-ndjson")
        refused = {
            "viewer": await upload(JSONL, who="viewer"),
            "media": await upload(JSONL, media="text/plain"),
            "json": await upload(JSONL + "{nope\n"),
            "record": await upload(json.dumps({"text": "no prompt"}) + "\n"),
            "empty": await upload("\n\n"),
            "large": await upload("x" * 5000),
        }
        sha = first.json()["sha256"]
        train = await gw.client.post(
            f"{HEADS}/train",
            json=train_body(sha, name="adder"),
            headers=gw.auth(**{"Idempotency-Key": '"k1"'}),
        )
        replay = await gw.client.post(
            f"{HEADS}/train",
            json=train_body(sha, name="adder"),
            headers=gw.auth(**{"Idempotency-Key": '"k1"'}),
        )
        bad = {
            "eagle3": await gw.client.post(
                f"{HEADS}/train", json=train_body(sha, family="eagle3"), headers=gw.auth()
            ),
            "unknown": await gw.client.post(f"{HEADS}/train", json=train_body("d" * 64), headers=gw.auth()),
            "foreign": await gw.client.post(f"{HEADS}/train", json=train_body(sha), headers=gw.auth("other")),
            "viewer": await gw.client.post(f"{HEADS}/train", json=train_body(sha), headers=gw.auth("viewer")),
            "body": await gw.client.post(f"{HEADS}/train", json={"target": "x"}, headers=gw.auth()),
        }
        assert train.status_code == 202, train.text
        head = train.json()
        head_id = head["id"]
        requested = await bus.events(js, f"spec.head.{head_id}.requested")
        # The trainer and the gate, played here: a passing head.
        await bus.publish_all(nats_url, trainer_flow(head_id, head["request"], passed=True))
        validated = await wait_head(gw, head_id, "validated", who="viewer")
        moved = await bus.events(js, f"spec.head.{head_id}.transitioned")

        # A second head fails the gate: rejected, with the reason; its stream ends there.
        second = (await gw.client.post(f"{HEADS}/train", json=train_body(sha), headers=gw.auth())).json()
        await bus.publish_all(nats_url, trainer_flow(second["id"], second["request"], passed=False))
        rejected = await wait_head(gw, second["id"], "rejected")
        stream = sse_events(
            (await gw.client.get(f"{HEADS}/{second['id']}/events", headers=gw.auth("viewer"))).text
        )
        # A third one the trainer cannot train: failed.
        third = (await gw.client.post(f"{HEADS}/train", json=train_body(sha), headers=gw.auth())).json()
        failed_event = new_event(
            HeadFailed(
                head_id=third["id"], error_stage=ErrorStage.TRAINING, message="no example fits max_len"
            ),
            tenant_id="acme",
            correlation_id=third["id"],
            producer="head-trainer",
        )
        await bus.publish_all(nats_url, [failed_event, failed_event])
        failed = await wait_head(gw, third["id"], "failed")
        listed = (await gw.client.get(HEADS, headers=gw.auth("viewer"))).json()
        foreign_list = (await gw.client.get(HEADS, headers=gw.auth("other"))).json()
        foreign_get = await gw.client.get(f"{HEADS}/{head_id}", headers=gw.auth("other"))
        foreign_stream = await gw.client.get(f"{HEADS}/{head_id}/events", headers=gw.auth("other"))
        all_moves = await bus.events(js, "spec.head.*.transitioned", at_least=3)

    assert first.status_code == 201, first.text
    data = first.json()
    assert (data["examples"], data["size_bytes"]) == (6, len(JSONL)) and again.status_code == 200
    assert (tmp_path / head_data_path("acme", sha)).read_text() == JSONL
    assert {why: r.status_code for why, r in refused.items()} == {
        "viewer": 403, "media": 415, "json": 422, "record": 422, "empty": 422, "large": 413
    }  # fmt: skip
    assert "line 7" in refused["json"].json()["detail"]
    assert (head["state"], head["name"], head["family"]) == ("training", "adder", "medusa")
    assert train.headers["location"] == f"{HEADS}/{head_id}" and head_id.startswith("hd-")
    assert replay.status_code == 202 and replay.json()["id"] == head_id
    assert {why: r.status_code for why, r in bad.items()} == {
        "eagle3": 422, "unknown": 422, "foreign": 422, "viewer": 403, "body": 422
    }  # fmt: skip
    assert bad["eagle3"].headers["content-type"].startswith("application/problem+json")
    assert "ENABLE_L4_EAGLE3_TRAINING" in bad["eagle3"].json()["detail"]
    assert len(requested) == 1 and requested[0].payload.train_path == head_data_path("acme", sha)
    assert requested[0].payload.requested_by and requested[0].tenant_id == "acme"

    assert [e["epoch"] for e in validated["epochs"]] == [0, 1]
    assert validated["artifact"]["sha256"] == SHA and validated["gate"]["passed"] is True
    [move] = validated["transitions"]
    assert (move["from_state"], move["to_state"], move["actor"], move["role"]) == (
        "training", "validated", "quality-gate", "service"
    )  # fmt: skip
    assert len(moved) == 1
    announced = moved[0].payload
    assert (announced.tenant_target, announced.family, announced.acceptance_rate) == (
        "smollm2-135m-instruct", "medusa", 0.41
    )  # fmt: skip
    assert announced.artifact == ARTIFACT and moved[0].producer == "gateway"

    assert (rejected["error"], rejected["gate"]["passed"]) == ("lossless; acceptance 0.05 < 0.20", False)
    assert [e["event"] for e in stream] == [
        "head.requested",
        "head.training_started",
        "head.epoch_completed",
        "head.epoch_completed",
        "head.trained",
        "head.gated",
        "head.transitioned",
    ]
    assert [e["id"] for e in stream] == [str(n) for n in range(1, 8)]
    # The duplicate head.failed moved it once.
    assert (failed["error"], [t["to_state"] for t in failed["transitions"]]) == (
        "no example fits max_len",
        ["failed"],
    )
    assert [h["id"] for h in listed["heads"]] == [third["id"], second["id"], head_id]
    assert (
        foreign_list == {"heads": []} and foreign_get.status_code == 404 and foreign_stream.status_code == 404
    )
    assert sorted(e.payload.transition.to_state for e in all_moves) == ["failed", "rejected", "validated"]


async def test_a_head_whose_event_was_parked_fails_once(db: str, nats_url: str, js: JetStreamContext) -> None:
    """A trainer that keeps dying on a head.requested parks it: the head fails with the reason
    (error_stage dead_letter) instead of training for ever, however often its letters come."""
    async with running_gateway(db, nats_url) as gw:
        sha = (
            await gw.client.post(
                f"{HEADS}/data", content=JSONL, headers=gw.auth(**{"Content-Type": "application/jsonl"})
            )
        ).json()["sha256"]
        head_id = (await gw.client.post(f"{HEADS}/train", json=train_body(sha), headers=gw.auth())).json()[
            "id"
        ]
        requested = (await bus.events(js, f"spec.head.{head_id}.requested"))[0]
        letter = DeadLetter(
            service="head_trainer",
            subject=f"spec.head.{head_id}.requested",
            data=base64.b64encode(requested.model_dump_json().encode()),
            deliveries=5,
            error="MemoryError: cannot allocate the target",
        )
        nc = await nats.connect(nats_url)
        try:
            for _ in range(2):  # the same letter twice, as a redrive and a new park would
                await nc.jetstream().publish("spec.dlq.head_trainer", letter.model_dump_json().encode())
        finally:
            await nc.close()
        failed = await wait_head(gw, head_id, "failed")
        moves = await bus.events(js, f"spec.head.{head_id}.transitioned")
        await asyncio.sleep(1.0)  # time for a second letter to fail it again, if it would
        failures = await bus.events(js, f"spec.head.{head_id}.failed")
    assert "head_trainer gave up on head.requested" in failed["error"]
    assert "MemoryError" in failed["error"]
    assert [e.payload.error_stage for e in failures] == [ErrorStage.DEAD_LETTER]
    assert [m.payload.transition.to_state for m in moves] == ["failed"]


async def audited_moves(dsn: str, nats_url: str, head_id: str, *, at_least: int) -> list[str]:
    """The subjects of the head's head.transitioned in audit_log, recorded by the real audit recorder."""
    pool = create_pool(dsn, max_size=2)
    broker = make_broker(nats_url, service="audit-test")
    subscribe_audit(broker, pool, service=f"audit-test-{head_id}", fetch_timeout_s=0.5)
    await pool.open()
    await broker.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                cur = await conn.execute(
                    "SELECT subject FROM audit_log WHERE type = 'head.transitioned' AND subject LIKE %s"
                    " ORDER BY seq",
                    (f"spec.head.{head_id}.%",),
                )
                subjects = [r[0] for r in await cur.fetchall()]
            if len(subjects) >= at_least or time.monotonic() > deadline:
                return subjects
            await asyncio.sleep(0.1)
    finally:
        await broker.stop()
        await pool.close()


async def cached_winner_rows(dsn: str, head_id: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM winner_cache WHERE winner -> 'candidate' ->> 'draft' = %s", (head_id,)
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def test_transitions_roles_approvals_and_deprecation(
    db: str, nats_url: str, js: JetStreamContext, tmp_path: Path, embedded_postgres: PostgresCluster
) -> None:
    since = datetime.now(UTC)
    reviewer = (await issue_token(db, tenant_id="acme", role=Role.HEAD_REVIEWER)).secret
    async with running_gateway(db, nats_url, artifact_dir=tmp_path) as gw:
        gw.tokens["reviewer"] = reviewer
        sha = (
            await gw.client.post(
                f"{HEADS}/data", content=JSONL, headers=gw.auth(**{"Content-Type": "application/jsonl"})
            )
        ).json()["sha256"]
        head = (await gw.client.post(f"{HEADS}/train", json=train_body(sha), headers=gw.auth())).json()
        head_id = head["id"]
        path = f"{HEADS}/{head_id}/transition"

        async def move(to: str, who: str = "dev", rationale: str | None = None, **headers: str):
            body: dict[str, Any] = {"to": to} | ({"rationale": rationale} if rationale else {})
            return await gw.client.post(path, json=body, headers=gw.auth(who, **headers))

        early = await move("uat")  # still training
        await bus.publish_all(nats_url, trainer_flow(head_id, head["request"], passed=True))
        await wait_head(gw, head_id, "validated")
        # A stream opened now follows the moves until deprecation ends it.
        stream = asyncio.create_task(gw.client.get(f"{HEADS}/{head_id}/events", headers=gw.auth("viewer")))
        answers = {
            "skip uat": await move("production", "admin", "straight to prod"),
            "viewer uat": await move("uat", "viewer"),
            "foreign": await move("uat", "other"),
            "bad body": await gw.client.post(path, json={"to": "validated"}, headers=gw.auth()),
            "uat": await move("uat", **{"Idempotency-Key": '"u1"'}),
            "uat replay": await move("uat", **{"Idempotency-Key": '"u1"'}),
            "dev prod": await move("production", "dev", "ship it"),
            "no rationale": await move("production", "reviewer"),
            "prod": await move("production", "reviewer", "acceptance 0.41 on our prompts"),
        }
        async with await psycopg.AsyncConnection.connect(db) as conn:
            cur = await conn.execute(
                "SELECT from_state, to_state, role, rationale FROM speculative_head_approvals"
                " WHERE head_id = %s",
                (head_id,),
            )
            approvals = await cur.fetchall()
        # Cached by the real projector path: a T1 run's answer that the head won, one that listed
        # it among its candidates without winning, and one that never offered it.
        won = CandidateResult(
            candidate=Candidate(candidate_id="medusa-hd", family=Family.MEDUSA, draft=head_id, k=2),
            prediction=PREDICTION,
            gate=GATE,
        )
        other = CandidateResult(
            candidate=Candidate(candidate_id="ngram-k4", family=Family.NGRAM, k=4),
            prediction=PREDICTION,
            gate=GATE,
        )
        for winner, target, listed in (
            (won, {}, [won]),
            (other, {"gpu": "L40S"}, [other, won]),
            (other, {"gpu": "A100-80GB"}, [other]),
        ):
            run_id = (await gw.create(body=run_body(**target))).json()["id"]
            answer = RunCompleted(
                run_id=run_id,
                cache_hit=False,
                measured=False,
                winner=winner,
                candidates=listed,
                pareto_front=[],
            )
            # As the predictor would: after the gateway's own events are on the stream.
            await bus.events(js, f"spec.run.{run_id}.queued")
            await bus.publish_all(
                nats_url, [new_event(answer, tenant_id="acme", correlation_id=run_id, producer="predictor")]
            )
            await gw.wait_status(run_id, "completed")
        cached_before = await cached_winner_rows(db, head_id)
        hit = (await gw.create()).json()
        no_rationale = await move("deprecated")
        gone = await move("deprecated", "dev", "regressed on the new prompts")
        after = (await gw.create()).json()
        listed_after = (await gw.create(body=run_body(gpu="L40S"))).json()
        other_hit = (await gw.create(body=run_body(gpu="A100-80GB"))).json()
        streamed = sse_events((await asyncio.wait_for(stream, WAIT_S)).text)
        deprecated = await bus.events(js, f"spec.head.{head_id}.transitioned", at_least=4)
        # Every move is audited: the audit service records each spec.> event, head.transitioned too.
        audited = await audited_moves(db, nats_url, head_id, at_least=4)
        # include_uat_heads runs neither read the cache nor write it.
        uat_run = (await gw.create(body=run_body(gpu="A100-80GB") | {"include_uat_heads": True})).json()
        # The registry rebuilt from the stream equals the live one (approvals and cache included).
        await bus.events(js, f"spec.run.{uat_run['id']}.requested")
        name = f"rebuilt_{uuid.uuid4().hex[:12]}"
        into = embedded_postgres.create(name)
        try:
            nc = await nats.connect(nats_url)
            try:
                report = await rebuild(nc, into, ReplayStart(since=since))
            finally:
                await nc.close()
            differences = await diff(db, into)
        finally:
            embedded_postgres.drop(name)

    statuses = {why: r.status_code for why, r in answers.items()}
    assert early.status_code == 409
    assert statuses == {
        "skip uat": 409,
        "viewer uat": 403,
        "foreign": 404,
        "bad body": 422,
        "uat": 200,
        "uat replay": 200,
        "dev prod": 403,
        "no rationale": 422,
        "prod": 200,
    }
    for refused in ("skip uat", "viewer uat", "foreign", "dev prod", "no rationale"):
        assert answers[refused].headers["content-type"].startswith("application/problem+json")
    assert answers["uat replay"].headers.get("idempotent-replayed") == "true"
    assert answers["prod"].json()["state"] == "production"
    assert approvals == [("uat", "production", "head_reviewer", "acceptance 0.41 on our prompts")]
    assert cached_before == 1 and hit["cache_hit"] is True
    assert no_rationale.status_code == 422
    assert gone.status_code == 200 and gone.json()["state"] == "deprecated"
    assert await cached_winner_rows(db, head_id) == 0
    assert after["cache_hit"] is False and listed_after["cache_hit"] is False
    assert other_hit["cache_hit"] is True
    assert uat_run["cache_hit"] is False and uat_run["status"] == "queued"
    assert [e.payload.transition.to_state for e in deprecated] == [
        "validated",
        "uat",
        "production",
        "deprecated",
    ]
    assert deprecated[-1].payload.transition.rationale == "regressed on the new prompts"
    assert [e["event"] for e in streamed][-3:] == ["head.transitioned"] * 3
    assert json.loads(streamed[-1]["data"])["payload"]["transition"]["to_state"] == "deprecated"
    assert not report.unwritten
    assert audited == [f"spec.head.{head_id}.transitioned"] * 4
    assert differences == [], differences


def test_sdk_and_cli(db: str, nats_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = asyncio.run(issue_tokens(db))
    data = tmp_path / "train.jsonl"
    data.write_text(JSONL)
    settings = gateway_settings(db, nats_url, artifact_dir=tmp_path / "artifacts")
    with ServerThread(create_app(settings)) as server:
        with SpeculativeClient(server.url, tokens["dev"]) as client:
            uploaded = client.heads.upload(data)
            head = client.heads.submit(
                HeadTrainRequest(target="smollm2-135m-instruct", family="medusa", train_data=uploaded.sha256)
            )
            assert client.heads.get(head.id) == head and [h.id for h in client.heads.list()] == [head.id]
            with pytest.raises(SpecopsAPIError) as refused:
                client.heads.transition(head.id, "uat")
            assert refused.value.problem.status == 409
            asyncio.run(
                bus.publish_all(
                    nats_url, trainer_flow(head.id, head.request.model_dump(mode="json"), passed=True)
                )
            )
            deadline = time.monotonic() + WAIT_S
            while client.heads.get(head.id).state != "validated":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            # A validated head's stream stays open (it may move on): read up to its move.
            events = []
            for event in client.heads.stream(head.id, last_event_id=5):
                events.append(event.type)
                if event.type == "head.transitioned":
                    break
            assert events == ["head.gated", "head.transitioned"]

        parser = argparse.ArgumentParser()
        heads_cli.add_parsers(parser.add_subparsers(dest="command", required=True))
        auth = ["--url", server.url, "--token", tokens["dev"]]

        def cli(*argv: str) -> tuple[int, str]:
            args = parser.parse_args(["heads", *argv, *auth])
            code = args.handler(args)
            return code, capsys.readouterr().out.splitlines()[-1] if code == 0 else capsys.readouterr().err

        code, sha = cli("upload", str(data))
        assert code == 0 and sha == uploaded.sha256
        code, submitted = cli(
            "submit", "--target", "smollm2-135m-instruct", "--family", "medusa", "--train-data", sha
        )
        assert code == 0 and submitted.startswith("hd-")
        code, shown = cli("show", head.id, "--json")
        assert code == 0 and json.loads(shown)["state"] == "validated"
        code, listed = cli("list", "--json")
        assert code == 0 and [h["id"] for h in json.loads(listed)["heads"]] == [submitted, head.id]
        code, moved = cli("transition", head.id, "--to", "uat")
        assert code == 0 and moved.endswith("uat")
        code, err = cli("transition", head.id, "--to", "production", "--rationale", "ship")
        assert code == 2 and "403" in err
