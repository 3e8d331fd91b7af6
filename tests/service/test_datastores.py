"""Customer corpora for the rest family on a real nats-server and PostgreSQL: the gateway's
upload, the predictor offering a tenant's datastore in that tenant's runs only, and the
benchmark-runner measuring a rest candidate on an uploaded corpus (smollm2)."""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from pathlib import Path

import pytest
from fixtures import bus
from fixtures.gateway import ServerThread, gateway_settings, issue_tokens, running_gateway
from nats.js import JetStreamContext
from psycopg.types.json import Jsonb

from specbus import RetryPolicy, SpecBroker, consumer_name, publish
from specbus.envelope import Envelope, new_event
from speccatalog.artifacts import corpus_path, datastore_id
from speccore.model_cache import ModelCache
from speccore.models import LoadedModel
from specops.client import SpeculativeClient
from specops.commands import datastores as datastores_cli
from specops_schemas.api import API_PREFIX, RunCreateRequest, Target
from specops_schemas.candidates import Candidate
from specops_schemas.events import BenchPlan, BenchRequested, RunRequested
from specops_schemas.registry import DatastoreRegistered
from specops_services.benchmark_runner.app import subscribe as subscribe_runner
from specops_services.benchmark_runner.runner import BenchmarkRunnerSettings, BenchRunner
from specops_services.gateway.app import create_app
from specops_services.predictor.app import subscribe as subscribe_predictor
from specops_services.predictor.plan import HostInfo
from specops_services.predictor.steps import Planner
from specops_services.quality_gate.runner import GateRunner
from specops_services.quality_gate.settings import QualityGateSettings
from specplatform.db import Pool

DATASTORES = f"{API_PREFIX}/datastores"
SMOLLM = "smollm2-135m-instruct"
FAST = RetryPolicy(max_deliver=3, backoff_s=(0.2, 0.4), ack_wait_s=2.0)
CODE = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"


async def test_upload_is_content_addressed_tenant_scoped_and_announced(
    db: str, nats_url: str, js: JetStreamContext, tmp_path: Path
) -> None:
    jsonl = "\n".join(json.dumps({"text": CODE}) for _ in range(3)) + "\n"
    async with running_gateway(db, nats_url, artifact_dir=tmp_path, datastore_max_bytes=4096) as gw:

        async def upload(
            body: str | bytes, media: str = "application/jsonl", who: str = "dev", **params: str
        ):
            headers = gw.auth(who, **{"Content-Type": media})
            query = {"name": "our code"} | params
            return await gw.client.post(DATASTORES, content=body, params=query, headers=headers)

        first = await upload(jsonl, fingerprints="code")
        again = await upload(jsonl.encode(), media="application/x-ndjson")
        text = await upload(CODE, media="text/plain; charset=utf-8")
        listed = await gw.client.get(DATASTORES, headers=gw.auth("viewer"))
        own = await gw.client.get(f"{DATASTORES}/{first.json()['id']}", headers=gw.auth("viewer"))
        foreign = await gw.client.get(f"{DATASTORES}/{first.json()['id']}", headers=gw.auth("other"))
        foreign_list = await gw.client.get(DATASTORES, headers=gw.auth("other"))
        refused = {
            "viewer": await upload(jsonl, who="viewer"),
            "media": await upload(jsonl, media="application/json"),
            "large": await upload("x" * 5000, media="text/plain"),
            "empty": await upload(" \n\n", media="text/plain"),
            "json": await upload(json.dumps({"text": "ok"}) + "\n{not json\n"),
            "record": await upload(json.dumps({"title": "no text"}) + "\n"),
            "workload": await upload(jsonl, fingerprints="code,poetry"),
        }
        announced = await bus.events(js, "spec.registry.*.datastore_registered", at_least=2)

    assert first.status_code == 201, first.text
    store = first.json()
    assert store["id"] == datastore_id("acme", store["sha256"]) and first.headers["location"].endswith(
        store["id"]
    )
    assert (store["format"], store["documents"], store["fingerprints"]) == ("jsonl", 3, ["code"])
    assert again.status_code == 200 and again.json() == store
    assert text.status_code == 201 and text.json()["format"] == "text" and text.json()["documents"] == 1
    assert (tmp_path / corpus_path("acme", store["sha256"], "jsonl")).read_text() == jsonl
    assert not list((tmp_path / "datastores" / "acme").glob(".upload-*"))
    assert [s["id"] for s in listed.json()["datastores"]] == [text.json()["id"], store["id"]]
    assert own.json() == store
    assert foreign.status_code == 404 and foreign_list.json() == {"datastores": []}
    statuses = {why: r.status_code for why, r in refused.items()}
    assert statuses == {
        "viewer": 403, "media": 415, "large": 413, "empty": 422, "json": 422, "record": 422, "workload": 422
    }  # fmt: skip
    assert "line 2" in refused["json"].json()["detail"] and "line 1" in refused["record"].json()["detail"]
    # One event per new datastore (the repeated upload announced nothing).
    assert [e.payload.datastore_id for e in announced] == [store["id"], text.json()["id"]]
    ds = announced[0].payload
    assert isinstance(ds, DatastoreRegistered) and announced[0].tenant_id == "acme"
    assert (ds.datastore_id, ds.size_bytes, ds.path) == (
        store["id"], len(jsonl), corpus_path("acme", store["sha256"], "jsonl")
    )  # fmt: skip


def test_sdk_and_cli_upload_and_list(
    db: str, nats_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens = asyncio.run(issue_tokens(db))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"prompt": "def add(a, b):", "completion": " return a + b"}) + "\n")
    source = tmp_path / "lib.py"
    source.write_text(CODE)
    settings = gateway_settings(db, nats_url, artifact_dir=tmp_path / "artifacts")
    with ServerThread(create_app(settings)) as server:
        with SpeculativeClient(server.url, tokens["dev"]) as client:
            store = client.datastores.upload(corpus, fingerprints=["code"])
            same = client.datastores.upload(corpus.read_bytes(), name="again", jsonl=True)
            assert client.datastores.get(store.id) == store
        parser = argparse.ArgumentParser()
        datastores_cli.add_parsers(parser.add_subparsers(dest="command", required=True))
        auth = ["--url", server.url, "--token", tokens["dev"]]
        upload = parser.parse_args(["datastores", "upload", str(source), "--name", "lib", *auth])
        assert upload.handler(upload) == 0
        # The last line: the gateway's broker logs on stdout too.
        uploaded_id = capsys.readouterr().out.splitlines()[-1]
        ls = parser.parse_args(["datastores", "ls", "--json", *auth])
        assert ls.handler(ls) == 0
        listed = json.loads(capsys.readouterr().out.splitlines()[-1])
        viewer = parser.parse_args(
            ["datastores", "upload", str(source), "--url", server.url, "--token", tokens["viewer"]]
        )
        assert viewer.handler(viewer) == 2
        assert "403" in capsys.readouterr().err

    assert (store.name, store.format, store.documents, store.fingerprints) == (
        "corpus.jsonl",
        "jsonl",
        1,
        ["code"],
    )
    assert same == store
    assert [s["id"] for s in listed] == [uploaded_id, store.id] and listed[0]["format"] == "text"


def _run_requested(dsn: str, tenant: str, fingerprint: str = "code") -> Envelope[RunRequested]:
    """A run as the gateway creates it: its row, then its `run.requested`."""
    run_id = str(uuid.uuid4())
    request = RunCreateRequest.model_validate(
        {
            "target": {"model_ref": SMOLLM, "gpu": "cpu", "engine": "speccore"},
            "workload": {"fingerprint": fingerprint},
        }
    )
    bus.sql(dsn, "INSERT INTO tenants (id, name) VALUES (%s, %s) ON CONFLICT DO NOTHING", (tenant, tenant))
    bus.sql(
        dsn,
        "INSERT INTO runs (id, tenant_id, request) VALUES (%s, %s, %s)",
        (run_id, tenant, Jsonb(request.model_dump(mode="json"))),
    )
    payload = RunRequested(run_id=run_id, request=request, requested_by="token-1")
    return new_event(payload, tenant_id=tenant, correlation_id=run_id, producer="gateway")


def _registered(tenant: str, sha256: str, fingerprints: list[str]) -> Envelope[DatastoreRegistered]:
    ds_id = datastore_id(tenant, sha256)
    payload = DatastoreRegistered(
        datastore_id=ds_id,
        name="corpus",
        sha256=sha256,
        size_bytes=len(CODE),
        format="text",
        documents=1,
        fingerprints=fingerprints,
        path=corpus_path(tenant, sha256, "text"),
    )
    return new_event(payload, tenant_id=tenant, correlation_id=ds_id, producer="gateway")


async def test_predictor_offers_a_tenants_datastore_in_its_own_runs_only(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    registered = _registered("acme", "a" * 64, ["code"])
    ds_id = registered.payload.datastore_id

    def register(broker: SpecBroker, pool: Pool, service: str) -> None:
        planner = Planner(host=HostInfo(cuda=False))
        subscribe_predictor(broker, pool, planner, service=service, retry=FAST, fetch_timeout_s=0.5)

    async with bus.serving(db, nats_url, "pred", register) as service:
        await bus.acked(js, consumer_name(service, "datastore_registered"), await publish(js, registered))
        runs = {name: _run_requested(db, tenant) for name, tenant in (("own", "acme"), ("other", "globex"))}
        runs["chat"] = _run_requested(db, "acme", "chat")
        for event in runs.values():
            await publish(js, event)
        predicted = {
            name: (await bus.events(js, f"spec.run.{event.correlation_id}.predicted"))[0].payload
            for name, event in runs.items()
        }

    drafts = {
        name: {c.candidate.draft for c in p.candidates if c.candidate.family == "rest"}
        for name, p in predicted.items()
    }
    assert ds_id in drafts["own"] and "builtin:code" in drafts["own"]
    assert ds_id not in drafts["other"] and "builtin:code" in drafts["other"]
    assert drafts["chat"] == set()  # rest is skipped for chat
    assert bus.sql(db, "SELECT tenant_id FROM predictor_datastores WHERE datastore_id = %s", (ds_id,)) == [
        ("acme",)
    ]


@pytest.mark.slow
async def test_runner_measures_a_rest_candidate_on_an_uploaded_corpus(
    db: str,
    nats_url: str,
    js: JetStreamContext,
    smollm: LoadedModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPECOPS_CACHE_DIR", str(tmp_path / "cache"))
    sha256 = "b" * 64  # the store names a corpus by its sha256; this test only needs the name
    corpus = tmp_path / "artifacts" / corpus_path("acme", sha256, "text")
    corpus.parent.mkdir(parents=True)
    corpus.write_text(CODE * 20)
    uploaded = Candidate(candidate_id="rest-k4-up", family="rest", k=4, draft=datastore_id("acme", sha256))
    missing = Candidate(candidate_id="rest-k4-gone", family="rest", k=4, draft=datastore_id("acme", "c" * 64))
    plan = BenchPlan(
        run_id=f"run-{uuid.uuid4().hex[:10]}",
        target=Target(model_ref=SMOLLM, gpu="cpu", engine="speccore"),
        fingerprint="code",
        mode="interactive",
        quality_gate="topk5",
        candidates=[uploaded, missing],
        reps=1,
        n_prompts=1,
        max_new_tokens=8,
    )
    bench_id = f"bench-{uuid.uuid4().hex[:10]}"
    bus.open_run(db, "acme", plan.run_id)
    event = new_event(
        BenchRequested(bench_id=bench_id, plan=plan),
        tenant_id="acme",
        correlation_id=plan.run_id,
        producer="predictor",
    )
    settings = BenchmarkRunnerSettings(
        bench_device="cpu", bench_dtype="float32", threads=2, artifact_dir=tmp_path / "artifacts"
    )
    runner = BenchRunner(settings, ModelCache(loader=lambda ref, device, dtype: smollm))

    def register(broker: SpecBroker, pool: Pool, service: str) -> None:
        subscribe_runner(broker, pool, runner, service=service, retry=FAST, fetch_timeout_s=0.5)

    async with bus.serving(db, nats_url, "br", register):
        await publish(js, event)
        [done] = await bus.events(js, f"spec.bench.{bench_id}.completed", wait_s=300.0)

    completed = done.payload
    [measured] = completed.results
    assert measured.candidate_id == "rest-k4-up" and measured.reps == 1 and measured.speedup > 0
    [failure] = completed.failures
    assert (
        failure.candidate_id == "rest-k4-gone"
        and "no corpus in tenant acme's artifact store" in failure.message
    )
    assert list((tmp_path / "cache" / "datastores").glob("upload-bbbbbbbbbbbbbbbb-*.npz"))


@pytest.mark.slow
def test_gate_decodes_a_rest_candidate_with_an_uploaded_corpus(
    smollm: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECOPS_CACHE_DIR", str(tmp_path / "cache"))
    sha256 = "d" * 64
    corpus = tmp_path / "artifacts" / corpus_path("acme", sha256, "text")
    corpus.parent.mkdir(parents=True)
    corpus.write_text(CODE * 20)
    uploaded = Candidate(candidate_id="rest-k4-up", family="rest", k=4, draft=datastore_id("acme", sha256))
    plan = BenchPlan(
        run_id="run-gate",
        target=Target(model_ref=SMOLLM, gpu="cpu", engine="speccore"),
        fingerprint="code",
        mode="interactive",
        quality_gate="exact",
        candidates=[uploaded],
        reps=1,
        n_prompts=1,
        max_new_tokens=8,
    )
    settings = QualityGateSettings(
        gate_prompts=1, gate_new_tokens=8, gate_batch_size=1, threads=2, artifact_dir=tmp_path / "artifacts"
    )
    runner = GateRunner(settings, ModelCache(loader=lambda ref, device, dtype: smollm))
    passed = runner.evaluate(plan, uploaded, tenant_id="acme")
    # Another tenant's bench cannot reach acme's corpus (F-S1): the gate fails closed, with the reason.
    foreign = runner.evaluate(plan, uploaded, tenant_id="globex")
    assert passed.passed is True, passed.details
    assert (
        foreign.passed is False and "no corpus in tenant globex's artifact store" in foreign.details["error"]
    )
