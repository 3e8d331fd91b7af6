"""Issue 41's gateway findings on a real nats-server and PostgreSQL: a tenant's storage quota
on `POST datastores` (parallel uploads included), `model_ref` refused outside the configured
models directory without telling what exists, and every budget, duration and count bounded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures import bus
from fixtures.gateway import RUNS, Gateway, run_body, running_gateway
from nats.js import JetStreamContext

from specbus.envelope import new_event
from specops_schemas.api import API_PREFIX
from specops_schemas.security import PolicyChanged, SecurityPolicy

TENANT = "acme"  # the tenant of fixtures.gateway's dev and admin tokens
DATASTORES = f"{API_PREFIX}/datastores"
POLICY = f"{API_PREFIX}/security/policy"
TUNE = f"{API_PREFIX}/tune-sessions"
HEADS_TRAIN = f"{API_PREFIX}/heads/train"
TINY_CONFIG = {"num_hidden_layers": 2, "hidden_size": 64, "vocab_size": 1000, "num_attention_heads": 4}


async def _policy(gw: Gateway, settings: dict[str, Any]) -> None:
    """The tenant's policy as the security service announces it, once the gateway has it."""
    policy = SecurityPolicy.model_validate({"tenant_id": TENANT, "version": 1} | settings)
    changed = PolicyChanged(tenant_id=TENANT, policy=policy)
    await bus.publish_all(
        gw.nats_url, [new_event(changed, tenant_id=TENANT, correlation_id=TENANT, producer="security")]
    )
    query = "SELECT 1 FROM gateway_security_policies WHERE tenant_id = %s AND version = 1"
    await bus.until("the policy in the gateway's read model", lambda: bus.sql(gw.dsn, query, (TENANT,)))


async def _upload(gw: Gateway, text: str, who: str = "dev") -> httpx.Response:
    headers = gw.auth(who, **{"Content-Type": "text/plain"})
    return await gw.client.post(DATASTORES, content=text, params={"name": "corpus"}, headers=headers)


# --- finding 5: storage quota ---------------------------------------------------------------------


async def test_uploads_stop_at_the_tenants_storage_quota_with_the_numbers(
    db: str, nats_url: str, js: JetStreamContext, tmp_path: Path
) -> None:
    async with running_gateway(db, nats_url, artifact_dir=tmp_path) as gw:
        await _policy(gw, {"storage_quota_bytes": 1000, "max_datastores": 3})
        whole = await _upload(gw, "x" * 1001)
        assert whole.status_code == 413, whole.text
        assert whole.headers["content-type"] == "application/problem+json"
        assert whole.json()["type"] == "urn:specops:problem:storage-quota-exceeded"
        assert "whole storage quota" in whole.json()["detail"]
        assert (whole.json()["quota_bytes"], whole.json()["upload_bytes"]) == (1000, 1001)

        first = await _upload(gw, "a" * 600)
        assert first.status_code == 201, first.text
        assert (await _upload(gw, "a" * 600)).status_code == 200  # the same bytes take no more room
        over = await _upload(gw, "b" * 500)
        assert over.status_code == 413, over.text
        numbers = {k: over.json()[k] for k in ("quota_bytes", "used_bytes", "upload_bytes")}
        assert numbers == {"quota_bytes": 1000, "used_bytes": 600, "upload_bytes": 500}
        assert "400 left" in over.json()["detail"]
        for text in ("c" * 100, "d" * 100):
            assert (await _upload(gw, text)).status_code == 201
        counted = await _upload(gw, "e" * 10)
        assert counted.status_code == 413, counted.text
        assert (counted.json()["datastores"], counted.json()["max_datastores"]) == (3, 3)
        # Another tenant's room is its own.
        assert (await _upload(gw, "b" * 500, who="other")).status_code == 201
        listed = await gw.client.get(DATASTORES, headers=gw.auth())
        assert sum(d["size_bytes"] for d in listed.json()["datastores"]) == 800


async def test_parallel_uploads_cannot_both_take_the_last_room(
    db: str, nats_url: str, js: JetStreamContext, tmp_path: Path
) -> None:
    async with running_gateway(db, nats_url, artifact_dir=tmp_path) as gw:
        await _policy(gw, {"storage_quota_bytes": 1000})
        answers = await asyncio.gather(*(_upload(gw, str(i) * 400) for i in range(6)))
        assert sorted(a.status_code for a in answers) == [201, 201, 413, 413, 413, 413]
        listed = await gw.client.get(DATASTORES, headers=gw.auth())
        assert sum(d["size_bytes"] for d in listed.json()["datastores"]) == 800
        stored = list((tmp_path / "datastores" / TENANT).rglob("*.txt"))
        assert len(stored) == 2  # a refused upload leaves nothing in the artifact store


# --- finding 6: model_ref ---------------------------------------------------------------------------


def _model_dir(parent: Path, name: str) -> Path:
    directory = parent / name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(TINY_CONFIG))
    return directory


async def test_model_ref_takes_paths_only_inside_the_models_dir_and_never_says_what_exists(
    db: str, nats_url: str, js: JetStreamContext, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    inside = _model_dir(models, "tiny")
    outside = _model_dir(tmp_path, "elsewhere")  # a real model directory, outside
    refs = [
        "/etc",
        str(outside),
        str(tmp_path / "no-such-dir"),
        f"{models}/../elsewhere",
        "../elsewhere",
        "./tiny",
        "~/tiny",
        str(models),
    ]
    async with running_gateway(db, nats_url, gateway_models_dir=models) as gw:
        refusals = []
        for ref in refs:
            answer = await gw.create(body=run_body(model_ref=ref, gpu="cpu", engine="speccore"))
            assert answer.status_code == 422, (ref, answer.text)
            body = answer.json()
            refusals.append((body["type"], body["detail"], body["errors"]))
        assert len(set(map(json.dumps, refusals))) == 1, refusals  # one answer whatever exists
        assert refusals[0][0] == "urn:specops:problem:model-ref-refused"
        for ref in ("smollm2-135m-instruct", str(inside), f"{models}/./tiny"):
            ok = await gw.create(body=run_body(model_ref=ref, gpu="cpu", engine="speccore"))
            assert ok.status_code in (200, 202), (ref, ok.text)

    async with running_gateway(db, nats_url) as gw:  # no models directory: no local path
        answer = await gw.create(body=run_body(model_ref=str(inside), gpu="cpu", engine="speccore"))
        assert answer.status_code == 422
        assert answer.json()["type"] == "urn:specops:problem:model-ref-refused"
        # A head's target is a model reference too: the head-trainer would load it.
        for ref in ("/etc", str(outside), str(inside)):
            head = {"target": ref, "family": "medusa", "train_data": "d" * 64}
            trained = await gw.client.post(HEADS_TRAIN, json=head, headers=gw.auth())
            assert trained.status_code == 422, trained.text
            assert (trained.json()["type"], trained.json()["detail"]) == (refusals[0][0], refusals[0][1])


# --- finding 12: bounded budgets ---------------------------------------------------------------------


@pytest.mark.parametrize("number", ["1e30", "Infinity", "NaN", "-1"])
async def test_budgets_durations_and_counts_are_bounded(
    db: str, nats_url: str, js: JetStreamContext, number: str
) -> None:
    bodies = [
        (POLICY, "put", "admin", f'{{"gpu_budget_s": {number}}}', "/gpu_budget_s"),
        (POLICY, "put", "admin", f'{{"storage_quota_bytes": {number}}}', "/storage_quota_bytes"),
        (TUNE, "post", "dev", f'{{"run_id": "spec-1", "budget_minutes": {number}}}', "/budget_minutes"),
        (TUNE, "post", "dev", f'{{"run_id": "spec-1", "seed": {number}}}', "/seed"),
        (
            RUNS,
            "post",
            "dev",
            json.dumps(run_body()).replace('"throughput": 0.7', f'"throughput": {number}'),
            "/goal/priorities/throughput",
        ),
    ]
    async with running_gateway(db, nats_url, gateway_policy_wait_s=0.1) as gw:
        for path, method, who, content, pointer in bodies:
            headers = gw.auth(who, **{"Content-Type": "application/json"})
            answer = await gw.client.request(method, path, content=content, headers=headers)
            assert answer.status_code == 422, (path, content, answer.text)
            assert answer.headers["content-type"] == "application/problem+json"
            assert any(e["pointer"].endswith(pointer) for e in answer.json()["errors"]), answer.json()


# --- issue 42: a JSON body must say so -------------------------------------------------------------


async def test_a_json_body_without_its_content_type_is_a_415_that_names_the_header(
    db: str, nats_url: str, js: JetStreamContext, tmp_path: Path
) -> None:
    body = json.dumps(run_body())
    async with running_gateway(db, nats_url, artifact_dir=tmp_path) as gw:
        for headers in (
            gw.auth("dev", **{"Content-Type": "application/x-www-form-urlencoded"}),  # what curl -d sends
            gw.auth("dev"),  # none at all
        ):
            refused = await gw.client.post(RUNS, content=body, headers=headers)
            assert refused.status_code == 415, refused.text
            assert refused.headers["content-type"] == "application/problem+json"
            assert "-H 'Content-Type: application/json'" in refused.json()["detail"]
        assert (
            await gw.client.post(
                RUNS, content=body, headers=gw.auth("dev", **{"Content-Type": "application/json"})
            )
        ).status_code == 202
        # A route that reads its body itself (an upload) takes what it takes.
        assert (await _upload(gw, "a corpus")).is_success
