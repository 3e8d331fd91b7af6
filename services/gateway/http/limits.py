"""The gateway's body limit refusal: a body over `gateway_max_body_bytes` is a 413 problem,
refused before it is read into memory (specplatform.body_limit.BodyLimit). A route that
streams its body to disk (`POST datastores`) has a limit of its own instead (`per_path`)."""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import Scope

from specops_schemas.api import Problem
from specops_services.gateway.http.problems import problem_response


def body_too_large(scope: Scope, max_bytes: int) -> Response:
    body = Problem(
        type="urn:specops:problem:body-too-large",
        title="Content Too Large",
        status=413,
        detail=f"the request body is over {max_bytes} bytes, this gateway's limit",
        instance=scope["path"],
    )
    return problem_response(body)
