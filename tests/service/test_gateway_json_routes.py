"""Every route of the gateway that takes a JSON body refuses one sent without a JSON
`Content-Type` (what `curl -d` sends) with a 415 problem naming the header: the seed's own curl
examples send none (issue 44; the refusal itself is specplatform.json_body's)."""

from __future__ import annotations

from fixtures.gateway import running_gateway
from nats.js import JetStreamContext

from specops_schemas.api import API_PREFIX

SOME_ID = "spec-0123456789abcdef"


async def test_every_json_route_answers_a_form_body_with_a_415_naming_the_header(
    db: str, nats_url: str, js: JetStreamContext
) -> None:
    async with running_gateway(db, nats_url) as gw:
        # The OpenAPI document lists each operation whose body is JSON.
        routes = [
            (method.upper(), path)
            for path, item in gw.app.openapi()["paths"].items()
            for method, operation in item.items()
            if "application/json" in operation.get("requestBody", {}).get("content", {})
        ]
        answers = {}
        for method, path in routes:
            url = path.format(**{name: SOME_ID for name in _params(path)})
            headers = gw.auth("admin", **{"Content-Type": "application/x-www-form-urlencoded"})
            answers[(method, path)] = await gw.client.request(method, url, content="{}", headers=headers)

    checked = {path.removeprefix(API_PREFIX) for _, path in routes}
    assert {"/runs", "/tune-sessions", "/runs/{run_id}/apply", "/heads/train", "/security/policy"} <= checked
    for route, answer in answers.items():
        assert answer.status_code == 415, (route, answer.text)
        assert answer.headers["content-type"] == "application/problem+json", route
        assert "-H 'Content-Type: application/json'" in answer.json()["detail"], route


def _params(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{") and part.endswith("}")]
