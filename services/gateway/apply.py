"""A winner applied: what `POST runs/{id}/apply` and `POST tune-sessions/{id}/apply` share once
each has found its run or session — the tenant's policy checked, the candidate picked, and its
engine flags rendered with the directories of the trained heads it names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specops_schemas import engine_flags
from specops_schemas.api import ApplyRequest, Problem, ProblemFieldError
from specops_schemas.candidates import Candidate
from specops_schemas.catalog import Engine
from specops_services.gateway import heads, security
from specops_services.gateway.http.auth import Principal
from specops_services.gateway.http.problems import ProblemError, problem
from specops_services.gateway.idempotency import Reply
from specplatform.db import Connection

ENGINE_CANNOT_RUN = "urn:specops:problem:engine-cannot-run"
UNKNOWN_CANDIDATE = "urn:specops:problem:unknown-candidate"


@dataclass(frozen=True, slots=True)
class Applicable:
    """What apply needs of a run or a tune session."""

    spec_id: str
    action: str
    """The audited action a policy refusal names (`run.apply`, `tune.apply`)."""
    conflict: str | None
    """Why it cannot be applied now (still running, no winner…), or None."""
    not_applicable: str
    """The problem type of that conflict."""
    pick: Callable[[str | None], Candidate]
    """The winner (None) or the named candidate; LookupError when that one cannot be applied."""
    measured_on: Engine
    """The engine it was measured on: the flags' engine unless the request names another."""


async def apply_winner(
    conn: Connection, principal: Principal, target: Applicable, body: ApplyRequest, artifact_root: Path
) -> Reply:
    """The chosen candidate as engine flags (200); 409 while the tenant opts out of speculation or
    `target` cannot be applied, 422 for a candidate it cannot apply or an engine that cannot run it."""
    await security.require_speculation(conn, principal, target.action, status=409)
    if target.conflict is not None:
        raise problem(409, target.conflict, type=target.not_applicable)
    try:
        chosen = target.pick(body.candidate_id)
    except LookupError as exc:
        raise _unknown_candidate(str(exc)) from None
    engine = body.engine or target.measured_on
    paths = await heads.artifact_paths(conn, principal.tenant_id, [chosen.draft], artifact_root)
    try:
        response = engine_flags.apply_response(target.spec_id, chosen, engine, draft_paths=paths)
    except engine_flags.EngineCannotRun as exc:
        raise problem(422, str(exc), type=ENGINE_CANNOT_RUN) from None
    return Reply(200, response.model_dump(mode="json"), {})


def _unknown_candidate(detail: str) -> ProblemError:
    return ProblemError(
        Problem(
            type=UNKNOWN_CANDIDATE,
            title="Request body is invalid",
            status=422,
            detail=detail,
            errors=[ProblemFieldError(pointer="#/candidate_id", detail=detail)],
        )
    )
