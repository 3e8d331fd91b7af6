"""A run whose request asks for `"fingerprint": "auto"` with sample prompts: the gateway infers the
fingerprint at intake, records how on the run, and the run goes on as one of that fingerprint;
the samples' text is on no event."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

from fixtures import bus
from fixtures.gateway import run_body, running_gateway
from nats.js import JetStreamContext

from specbus import RetryPolicy, SpecBroker
from specops_schemas.api import PROBLEM_MEDIA_TYPE
from specops_services.predictor.app import subscribe
from specops_services.predictor.plan import HostInfo
from specops_services.predictor.steps import Planner
from specplatform.db import Pool

LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"
CODE_SAMPLES = [
    'def is_palindrome(text: str) -> bool:\n    """Return True if text reads the same backwards.\n'
    '    >>> is_palindrome(\'abba\')\n    True\n    """\n',
    [
        {"role": "system", "content": "Complete the function."},
        {"role": "user", "content": 'def mean(values: list[float]) -> float:\n    """Arithmetic mean."""\n'},
    ],
]


def predictor(db: str, nats_url: str) -> AbstractAsyncContextManager[str]:
    def register(broker: SpecBroker, pool: Pool, service: str) -> None:
        retry = RetryPolicy(max_deliver=3, backoff_s=(0.2, 0.5), ack_wait_s=5.0)
        subscribe(broker, pool, Planner(host=HostInfo(cuda=False)), service=service, retry=retry)

    return bus.serving(db, nats_url, "pred", register)


async def test_an_auto_run_completes_as_the_fingerprint_its_samples_show(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    # A 70B target on an H100 is not measurable here: the predictor answers it (predicted only).
    body = run_body(model_ref=LLAMA_70B, gpu="H100-80GB", engine="vllm")
    body["workload"] = {"fingerprint": "auto", "samples": CODE_SAMPLES}
    async with running_gateway(db, nats_url) as gw, predictor(db, nats_url):
        created = await gw.create(body=body)
        assert created.status_code == 202, created.text
        run_id = created.json()["id"]
        completed = await gw.wait_status(run_id, "completed")
        [requested] = await bus.events(js, f"spec.run.{run_id}.requested")

    workload = completed["request"]["workload"]
    assert workload["fingerprint"] == "code"
    inferred = workload["inferred"]
    assert inferred["samples"] == 2 and inferred["runner_up"] != "code"
    assert 0 < inferred["runner_up_confidence"] < inferred["confidence"] <= 1
    assert completed["winner"] is not None
    assert requested.payload.request.workload.fingerprint == "code"
    assert "is_palindrome" not in requested.model_dump_json()


async def test_auto_without_samples_is_a_422_problem(db: str, nats_url: str) -> None:
    body = run_body()
    body["workload"] = {"fingerprint": "auto"}
    async with running_gateway(db, nats_url) as gw:
        refused = await gw.create(body=body)
    assert refused.status_code == 422 and refused.headers["content-type"] == PROBLEM_MEDIA_TYPE
    assert 'fingerprint "auto" needs samples' in refused.json()["detail"]
