"""Every error the gateway returns is RFC 9457 `application/problem+json`; nothing else leaks."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any, cast

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specops_schemas.api import (
    PROBLEM_MEDIA_TYPE,
    Problem,
)
from specops_services.gateway.http import params
from specplatform.json_body import NotJson

log = logging.getLogger(__name__)

DATABASE_UNAVAILABLE = "urn:specops:problem:database-unavailable"


class ProblemError(Exception):
    """Raised by handlers and dependencies; rendered as the problem it carries."""

    def __init__(self, problem: Problem, headers: dict[str, str] | None = None) -> None:
        super().__init__(problem.detail or problem.title)
        self.problem = problem
        self.headers = headers or {}


def problem(
    status: int, detail: str | None = None, *, title: str | None = None, **extra: Any
) -> ProblemError:
    """A ProblemError whose title defaults to the status's reason phrase."""
    return ProblemError(
        Problem(title=title or HTTPStatus(status).phrase, status=status, detail=detail, **extra)
    )


def unauthorized(detail: str, *, invalid: bool) -> ProblemError:
    # RFC 6750 §3: a request without credentials gets a bare challenge, a bad token an error code.
    challenge = 'Bearer realm="specops", error="invalid_token"' if invalid else 'Bearer realm="specops"'
    err = problem(401, detail)
    err.headers["WWW-Authenticate"] = challenge
    return err


def problem_response(body: Problem, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        body.model_dump(mode="json", exclude_none=True),
        status_code=body.status,
        headers=headers,
        media_type=PROBLEM_MEDIA_TYPE,
    )


async def _problem_error(request: Request, exc: Exception) -> JSONResponse:
    exc = cast(ProblemError, exc)  # registered for ProblemError only
    body = (
        exc.problem if exc.problem.instance else exc.problem.model_copy(update={"instance": request.url.path})
    )
    return problem_response(body, exc.headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    exc = cast(RequestValidationError, exc)
    return problem_response(Problem.validation(exc.errors(), instance=request.url.path))


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    exc = cast(StarletteHTTPException, exc)
    detail = (
        exc.detail
        if isinstance(exc.detail, str) and exc.detail != HTTPStatus(exc.status_code).phrase
        else None
    )
    body = Problem(
        title=HTTPStatus(exc.status_code).phrase,
        status=exc.status_code,
        detail=detail,
        instance=request.url.path,
    )
    return problem_response(body, dict(exc.headers or {}))


async def _not_json(request: Request, exc: Exception) -> JSONResponse:
    body = Problem(
        type="urn:specops:problem:unsupported-media-type",
        title="Unsupported Media Type",
        status=415,
        detail=str(exc),
        instance=request.url.path,
    )
    return problem_response(body)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    # The cause goes to the log, never to the client.
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return problem_response(
        Problem(
            title="Internal Server Error",
            status=500,
            detail="The server failed to handle this request; it has been logged.",
            instance=request.url.path,
        )
    )


def database_unavailable(instance: str, retry_after_s: int) -> JSONResponse:
    """The 503 of a request the database could not serve, with when to try again."""
    body = Problem(
        type=DATABASE_UNAVAILABLE,
        title="Service Unavailable",
        status=503,
        detail="the database is unreachable; retry after the Retry-After seconds",
        instance=instance,
    )
    return problem_response(body, {"Retry-After": str(retry_after_s)})


def _unavailable(retry_after_s: int) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def answer(request: Request, exc: Exception) -> JSONResponse:
        # An outage fails every request alike: one line each, no traceback.
        log.warning(
            "database unavailable: %s %s answered 503: %s", request.method, request.url.path, first_line(exc)
        )
        return database_unavailable(request.url.path, retry_after_s)

    return answer


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def install(app: FastAPI, *, retry_after_s: int) -> None:
    """Render every error as a problem (a JSON body without a JSON `Content-Type`: a 415); a
    database that cannot be reached (psycopg's OperationalError, the pool's timeout among them)
    as a 503 with `Retry-After: retry_after_s`."""
    app.add_exception_handler(ProblemError, _problem_error)
    app.add_exception_handler(psycopg.OperationalError, _unavailable(retry_after_s))
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(NotJson, _not_json)  # specplatform.json_body.require_json
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries for the problems a route can return."""
    return {status: {"model": Problem, "description": HTTPStatus(status).phrase} for status in statuses}


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema with every error response declared as problem+json.

    FastAPI files additional responses under the route's media type (application/json)
    and adds its own HTTPValidationError 422; both are rewritten to the Problem schema.
    """
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    ref = {"$ref": "#/components/schemas/Problem"}
    for item in schema.get("paths", {}).values():
        for operation in item.values():
            for status, response in operation.get("responses", {}).items():
                if status.isdigit() and int(status) >= 400:
                    response["content"] = {PROBLEM_MEDIA_TYPE: {"schema": ref}}
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    app.openapi_schema = schema
    return schema


def not_found(noun: str, spec_id: str) -> ProblemError:
    """The 404 of a run or tune session the tenant has no `spec_id` of; an off-grammar id is not echoed."""
    if not params.is_spec_id(spec_id):
        return problem(404, f"no {noun} with that id in this tenant")
    return problem(404, f"no {noun} '{spec_id}' in this tenant")
