"""The console's pages under /ui: each loads what it shows through the gateway's own service
functions (so tenant scoping, roles and 404s are the API's) and renders a template; the pages'
script then talks to the API itself. `install` mounts it on the gateway app."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from pydantic import BaseModel, Field

from speccatalog.fingerprint import QUESTIONS, wizard_table
from specops_schemas.api import API_PREFIX, Problem
from specops_schemas.catalog import Fingerprint, GateMethod, Mode, Role
from specops_schemas.security import SECURITY_ADR, JitterMode, SecurityTier
from specops_services.gateway import db, heads, runs, security, tune
from specops_services.gateway.console import fingerprint, session, views
from specops_services.gateway.console.headers import ConsoleHeaders
from specops_services.gateway.http import credentials, params, sse
from specops_services.gateway.http.auth import Principal, Viewer, pool_of, principal_of, require
from specops_services.gateway.http.problems import ProblemError, problem
from specplatform.db import tenant_transaction

HERE = Path(__file__).parent
STATIC = f"{views.UI}/static"
FAVICON = f"{STATIC}/favicon.svg"
# Strict: a name a template uses but its page did not pass is an error, not an empty string.
templates = Jinja2Templates(
    env=Environment(
        loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(), undefined=StrictUndefined
    )
)
router = APIRouter(prefix=views.UI, include_in_schema=False)

Load = Callable[[Principal], Awaitable[dict[str, Any]]]


def install(app: FastAPI) -> None:
    """Mount the console on the gateway: pages, static files, favicon, headers."""
    # The static mount first: the router's catch-all 404 page would otherwise answer its paths.
    app.mount(STATIC, StaticFiles(directory=HERE / "static"), name="console-static")
    app.include_router(router)
    app.add_api_route(
        "/favicon.ico", lambda: RedirectResponse(FAVICON, status_code=308), include_in_schema=False
    )
    app.add_middleware(ConsoleHeaders, prefixes=(views.UI, "/favicon.ico"))


# --- rendering --------------------------------------------------------------------------------


def _render(
    request: Request, name: str, principal: Principal | None, context: dict[str, Any], status: int = 200
) -> Response:
    common = {
        "principal": principal,
        "nav": views.nav(principal.role) if principal else [],
        "csrf": request.cookies.get(credentials.CSRF_COOKIE, ""),
        "static": STATIC,
        "favicon": FAVICON,
        "api": API_PREFIX,
        "views": views,
    }
    response = templates.TemplateResponse(request, name, common | context, status_code=status)
    # A page shows a tenant's data: no cache keeps it once signed out.
    response.headers["Cache-Control"] = "no-store"
    return response


def _error(request: Request, principal: Principal | None, body: Problem) -> Response:
    return _render(request, "error.html", principal, {"problem": body}, status=body.status)


async def _page(request: Request, name: str, load: Load) -> Response:
    """The page for the signed-in principal, its problem as an error page, or the way to sign in."""
    principal = await session.page_principal(request)
    if principal is None:
        return RedirectResponse(views.SIGN_IN, status_code=303)
    try:
        context = await load(principal)
    except ProblemError as exc:
        return _error(request, principal, exc.problem)
    return _render(request, name, principal, context)


async def _events(request: Request, principal: Principal, feed: sse.Feed) -> list[db.EventRow]:
    """Every event of a feed so far: the page shows them, and its script follows on after the last."""
    rows: list[db.EventRow] = []
    async with pool_of(request).connection() as conn, tenant_transaction(conn, principal.tenant_id):
        while True:
            _, batch = await feed.read(conn, rows[-1].seq if rows else 0)
            if not batch:
                return rows
            rows += batch


def _last_seq(rows: list[db.EventRow]) -> int:
    return rows[-1].seq if rows else 0


# --- sign-in ----------------------------------------------------------------------------------


@router.get("")
async def home() -> RedirectResponse:
    return RedirectResponse(f"{views.UI}/runs", status_code=303)


@router.get("/sign-in")
async def sign_in_form(request: Request) -> Response:
    return _sign_in_page(request, None)


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    if await session.form_csrf_refusal(request) is not None:
        return _sign_in_page(request, "The sign-in form had expired; sign in again.")
    token = (await session.form_field(request, "token")).strip()
    principal = await principal_of(pool_of(request), token) if token else None
    if principal is not None:
        return await session.signed_in(request, principal, f"{views.UI}/runs")
    return _sign_in_page(request, "That token is unknown or revoked.")


def _sign_in_page(request: Request, error: str | None) -> Response:
    # 200 with an error too: the form is shown again with the reason, as any invalid form is.
    csrf = session.form_csrf(request)
    response = _render(request, "sign_in.html", None, {"error": error, "csrf": csrf})
    session.set_csrf(request, response, csrf)
    return response


@router.post("/sign-out")
async def sign_out(request: Request) -> Response:
    refusal = await session.form_csrf_refusal(request)
    if refusal is not None:
        return _error(request, None, Problem(title="Forbidden", status=403, detail=refusal))
    return await session.signed_out(request, views.SIGN_IN)


# --- runs -------------------------------------------------------------------------------------


def _before(request: Request) -> str | None:
    """The list page's cursor (`?before=`); one that is no id starts at the newest."""
    before = request.query_params.get("before")
    return before if before and params.is_spec_id(before) else None


@router.get("/runs")
async def runs_page(request: Request) -> Response:
    async def load(principal: Principal) -> dict[str, Any]:
        page = await runs.list_runs(
            pool_of(request), principal, limit=params.PAGE_DEFAULT, before=_before(request)
        )
        return {"runs": page.runs, "next_before": page.next_before}

    return await _page(request, "runs.html", load)


@router.get("/runs/new")
async def new_run_page(request: Request) -> Response:
    async def load(principal: Principal) -> dict[str, Any]:
        await require(Role.DEVELOPER)(principal)
        return {
            "engines": views.engines(),
            "modes": [mode.value for mode in Mode],
            "gates": [gate.value for gate in GateMethod],
            "fingerprints": list(Fingerprint),
            "questions": QUESTIONS,
            "wizard_table": json.dumps(wizard_table()),
        }

    return await _page(request, "new_run.html", load)


@router.get("/runs/{run_id}")
async def run_page(request: Request, run_id: str) -> Response:
    async def load(principal: Principal) -> dict[str, Any]:
        run = await runs.read_run(pool_of(request), principal, run_id)
        events = await _events(request, principal, runs.event_feed(run_id))
        return {
            "run": run,
            "events": events,
            "last_seq": _last_seq(events),
            "ended": run.status in runs.TERMINAL_STATUSES,
            "terminal_types": " ".join(sorted(runs.TERMINAL_EVENT_TYPES)),
            "hero": views.hero(run.winner) if run.winner else None,
            "can_apply": views.can_apply(principal.role, run),
        }

    return await _page(request, "run.html", load)


class SamplePrompts(BaseModel):
    prompts: str = Field(max_length=1_000_000, description="Sample prompts, separated by blank lines.")


@router.post("/fingerprint")
async def infer_fingerprint(body: SamplePrompts, principal: Viewer) -> JSONResponse:
    """The fingerprint pasted sample prompts look like (the new-run page's `infer-fingerprint`)."""
    inference = fingerprint.inferred(body.prompts)
    if inference is None:
        raise problem(422, "paste at least one sample prompt")
    return JSONResponse(inference)


# --- tune sessions ------------------------------------------------------------------------------


@router.get("/tune")
async def tune_list_page(request: Request) -> Response:
    async def load(principal: Principal) -> dict[str, Any]:
        page = await tune.list_sessions(
            pool_of(request), principal, limit=params.PAGE_DEFAULT, before=_before(request)
        )
        return {"sessions": page.sessions, "next_before": page.next_before}

    return await _page(request, "tune_list.html", load)


@router.get("/tune/{session_id}")
async def tune_page(request: Request, session_id: str) -> Response:
    async def load(principal: Principal) -> dict[str, Any]:
        session_ = await tune.read_session(pool_of(request), principal, session_id)
        events = await _events(request, principal, tune.event_feed(session_id))
        return {
            "session": session_,
            "last_seq": _last_seq(events),
            "ended": session_.status in tune.TERMINAL_STATUSES,
            "terminal_types": " ".join(sorted(tune.TERMINAL_EVENT_TYPES)),
            "curve": views.curve_json(session_),
        }

    return await _page(request, "tune.html", load)


# --- heads ------------------------------------------------------------------------------------


@router.get("/heads")
async def heads_page(request: Request) -> Response:
    async def load(principal: Principal) -> dict[str, Any]:
        return {"heads": (await heads.list_heads(pool_of(request), principal)).heads}

    return await _page(request, "heads.html", load)


@router.get("/heads/{head_id}")
async def head_page(request: Request, head_id: str) -> Response:
    async def load(principal: Principal) -> dict[str, Any]:
        head = await heads.read_head(pool_of(request), principal, head_id)
        events = await _events(request, principal, heads.event_feed(head_id))
        moves = views.head_moves(head.state, principal.role)
        return {
            "head": head,
            "last_seq": _last_seq(events),
            "ended": head.state in heads.FINAL_STATES,
            "moves": moves,
            "needs_rationale": views.needs_rationale(moves),
            "rationale_required": heads.RATIONALE_REQUIRED,
            "progress": views.train_progress(head),
        }

    return await _page(request, "head.html", load)


# --- security ---------------------------------------------------------------------------------


@router.get("/security")
async def security_page(request: Request) -> Response:
    async def load(principal: Principal) -> dict[str, Any]:
        await require(Role.ADMIN)(principal)
        return {
            "policy": await security.read_policy(pool_of(request), principal),
            "tiers": [tier.value for tier in SecurityTier],
            "jitter_modes": [mode.value for mode in JitterMode],
            "adr": SECURITY_ADR,
        }

    return await _page(request, "security.html", load)


# The ADR ships with the source tree (docs/), not with an installed package.
ADR_PATH = HERE.parents[2] / SECURITY_ADR


@router.get("/security/adr")
async def adr_page(request: Request) -> Response:
    async def load(principal: Principal) -> dict[str, Any]:
        text = ADR_PATH.read_text(encoding="utf-8") if ADR_PATH.is_file() else None
        return {"adr": SECURITY_ADR, "text": text}

    return await _page(request, "adr.html", load)


@router.get("/{rest:path}")
async def not_found(request: Request, rest: str) -> Response:
    if not rest:
        return await home()

    async def load(principal: Principal) -> dict[str, Any]:
        raise problem(404, f"the console has no page /ui/{rest}")

    return await _page(request, "error.html", load)
