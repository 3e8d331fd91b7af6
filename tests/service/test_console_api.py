"""The API the console needs, against a real PostgreSQL and nats-server: `GET me`, the pages of
`GET runs` and `GET tune-sessions`, and the session cookie with its CSRF header (the same rules as
a bearer token: roles, tenants, revocation)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import psycopg
import pytest
from fixtures.flows import SESSIONS, completed_run, start
from fixtures.gateway import (
    RUNS,
    Gateway,
    ServerThread,
    gateway_settings,
    issue_tokens,
    run_body,
    running_gateway,
)

from specops_schemas.api import API_PREFIX, PROBLEM_MEDIA_TYPE
from specops_services.gateway.app import create_app
from specops_services.gateway.http import credentials
from specops_services.gateway.http.sse import TOKEN_REVOKED

ME = f"{API_PREFIX}/me"
SIGN_IN = "/ui/sign-in"
SIGN_OUT = "/ui/sign-out"


@pytest.fixture
async def gw(db: str, nats_url: str) -> AsyncIterator[Gateway]:
    async with running_gateway(db, nats_url) as gateway:
        yield gateway


def problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_MEDIA_TYPE
    body: dict[str, Any] = response.json()
    return body


async def test_me_names_the_tokens_tenant_and_role(gw: Gateway) -> None:
    for who, role, tenant in (
        ("viewer", "viewer", "acme"),
        ("admin", "admin", "acme"),
        ("other", "developer", "globex"),
    ):
        body = (await gw.client.get(ME, headers=gw.auth(who))).json()
        assert (body["tenant_id"], body["role"]) == (tenant, role)
        assert body["token_id"]
    problem(await gw.client.get(ME), 401)


async def test_runs_are_listed_newest_first_in_pages_of_the_tenant(gw: Gateway) -> None:
    done = await completed_run(gw)
    queued = [(await gw.create()).json()["id"] for _ in range(2)]
    foreign = (await gw.create("other")).json()["id"]
    first = (await gw.client.get(RUNS, params={"limit": 2}, headers=gw.auth("viewer"))).json()
    assert [run["id"] for run in first["runs"]] == queued[::-1]
    assert first["next_before"] == queued[0]
    second = (
        await gw.client.get(
            RUNS, params={"limit": 2, "before": first["next_before"]}, headers=gw.auth("viewer")
        )
    ).json()
    assert [run["id"] for run in second["runs"]] == [done] and second["next_before"] is None
    winner = second["runs"][0]
    assert winner["status"] == "completed" and winner["winner_family"] == "ngram"
    assert winner["measured_speedup"] == 1.4 and winner["cache_hit"] is False
    assert run_body()["target"].items() <= winner["target"].items() and winner["fingerprint"] == "chat"
    assert [run["id"] for run in (await gw.client.get(RUNS, headers=gw.auth("other"))).json()["runs"]] == [
        foreign
    ]
    # Another tenant's run is no cursor: an empty page, as an unknown id.
    beyond = await gw.client.get(RUNS, params={"before": foreign}, headers=gw.auth())
    assert beyond.json() == {"runs": [], "next_before": None}
    problem(await gw.client.get(RUNS, params={"limit": 0}, headers=gw.auth()), 422)
    problem(await gw.client.get(RUNS), 401)


async def test_tune_sessions_are_listed_with_their_run(gw: Gateway) -> None:
    run_id = await completed_run(gw)
    session_id = (await start(gw, run_id)).json()["id"]
    body = (await gw.client.get(SESSIONS, headers=gw.auth("viewer"))).json()
    assert body["next_before"] is None
    [row] = body["sessions"]
    assert (row["id"], row["run_id"], row["status"], row["trials"]) == (session_id, run_id, "queued", 0)
    assert row["best_value"] is None and row["auto_terminated"] is False
    assert (await gw.client.get(SESSIONS, headers=gw.auth("other"))).json()["sessions"] == []


@asynccontextmanager
async def cookie_client(
    gw: Gateway, who: str, *, csrf: str | None = "c5rf"
) -> AsyncIterator[httpx.AsyncClient]:
    """A browser signed in to the console with `who`'s token: its session cookie, and the CSRF
    cookie `csrf` (none if None)."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=gw.app), base_url="http://gateway"
    ) as client:
        await _sign_in(client, gw.tokens[who], csrf)
        yield client


def bare_cookie(gw: Gateway, session: str) -> httpx.AsyncClient:
    """A client that sends `session` as the session cookie, as a copied cookie would be sent."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=gw.app),
        base_url="http://gateway",
        cookies={"specops_session": session},
    )


async def _sign_in(client: httpx.AsyncClient, token: str, csrf: str | None) -> None:
    await client.get(SIGN_IN)
    signed = await client.post(SIGN_IN, data={"token": token, "csrf": client.cookies["specops_csrf"]})
    assert signed.status_code == 303, signed.text
    client.cookies.delete("specops_csrf")
    if csrf:
        client.cookies.set("specops_csrf", csrf)
    return client


async def test_the_session_cookie_authenticates_and_unsafe_methods_need_the_csrf_header(gw: Gateway) -> None:
    async with cookie_client(gw, "dev") as dev:
        assert (await dev.get(ME)).json()["role"] == "developer"
        assert (await dev.get(RUNS)).status_code == 200
        refused = problem(await dev.post(RUNS, json=run_body()), 403)
        assert refused["type"] == "urn:specops:problem:csrf"
        problem(await dev.post(RUNS, json=run_body(), headers={"X-Specops-CSRF": "wrong"}), 403)
        created = await dev.post(RUNS, json=run_body(), headers={"X-Specops-CSRF": "c5rf"})
        assert created.status_code == 202, created.text
    async with cookie_client(gw, "dev", csrf=None) as no_csrf_cookie:
        problem(await no_csrf_cookie.post(RUNS, json=run_body(), headers={"X-Specops-CSRF": ""}), 403)
    # A bearer token needs no CSRF header, cookie or not.
    assert (await gw.create()).status_code == 202


async def test_a_viewers_cookie_can_do_no_more_than_a_viewers_token(gw: Gateway) -> None:
    run_id = await completed_run(gw)
    csrf = {"X-Specops-CSRF": "c5rf"}
    async with cookie_client(gw, "viewer") as viewer:
        assert (await viewer.get(f"{RUNS}/{run_id}")).status_code == 200
        problem(await viewer.post(RUNS, json=run_body(), headers=csrf), 403)
        problem(await viewer.post(f"{RUNS}/{run_id}/apply", json={}, headers=csrf), 403)
        problem(await viewer.get(f"{API_PREFIX}/security/policy"), 403)
    async with cookie_client(gw, "other") as other:
        problem(await other.get(f"{RUNS}/{run_id}"), 404)


async def test_a_revoked_tokens_cookie_is_refused(gw: Gateway) -> None:
    async with cookie_client(gw, "dev") as dev:
        assert (await dev.get(ME)).status_code == 200
        async with await psycopg.AsyncConnection.connect(gw.dsn, autocommit=True) as conn:
            await conn.execute(
                "UPDATE api_tokens SET revoked_at = now() WHERE secret_sha256 = %s",
                (credentials.hash_token(gw.tokens["dev"]),),
            )
        problem(await dev.get(ME), 401)
    async with bare_cookie(gw, "sps_unknown") as unknown:
        problem(await unknown.get(ME), 401)


async def test_the_cookie_is_a_server_session_not_the_token_and_signing_out_ends_it(gw: Gateway) -> None:
    async with cookie_client(gw, "dev") as dev:
        session = dev.cookies["specops_session"]
        assert session != gw.tokens["dev"] and gw.tokens["dev"] not in session
        assert (await dev.get(ME)).json()["role"] == "developer"
        # The token as a cookie is no session: the cookie names a server-side session only.
        async with bare_cookie(gw, gw.tokens["dev"]) as forged:
            problem(await forged.get(ME), 401)
        out = await dev.post(SIGN_OUT, data={"csrf": "c5rf"})
        assert out.status_code == 303, out.text
        assert "specops_session" not in dev.cookies
    # A copy of the cookie taken before signing out no longer works.
    async with bare_cookie(gw, session) as stolen:
        refused = problem(await stolen.get(ME), 401)
        assert "signed out" in refused["detail"]
        page = await stolen.get("/ui/runs")
        assert page.status_code == 303 and page.headers["location"] == SIGN_IN
    # The token itself lives on, and opens new sessions.
    assert (await gw.client.get(ME, headers=gw.auth("dev"))).status_code == 200
    async with cookie_client(gw, "dev") as again:
        assert (await again.get(ME)).status_code == 200


async def test_sessions_end_when_idle_and_at_their_absolute_expiry(db: str, nats_url: str) -> None:
    idle = running_gateway(db, nats_url, gateway_console_session_idle_s=0.5)
    async with idle as gw, cookie_client(gw, "dev") as dev:
        for _ in range(4):  # used within the idle time, it lives on past it
            await asyncio.sleep(0.3)
            assert (await dev.get(ME)).status_code == 200
        await asyncio.sleep(0.8)
        problem(await dev.get(ME), 401)
    short = running_gateway(db, nats_url, gateway_console_session_max_s=1.0)
    async with short as gw, cookie_client(gw, "dev") as dev:
        for _ in range(3):
            assert (await dev.get(ME)).status_code == 200
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.6)
        problem(await dev.get(ME), 401)


def test_signing_out_ends_the_sessions_open_event_stream(db: str, nats_url: str) -> None:
    tokens = asyncio.run(issue_tokens(db))
    settings = gateway_settings(db, nats_url, gateway_sse_token_check_s=0.2)
    with ServerThread(create_app(settings)) as server, httpx.Client(base_url=server.url) as browser:
        browser.get(SIGN_IN)
        signed = browser.post(SIGN_IN, data={"token": tokens["dev"], "csrf": browser.cookies["specops_csrf"]})
        assert signed.status_code == 303, signed.text
        # Nothing runs it: the run stays queued and its stream would stay open.
        run = browser.post(RUNS, json=run_body(), headers={"X-Specops-CSRF": browser.cookies["specops_csrf"]})
        assert run.status_code == 202, run.text
        with browser.stream("GET", f"{RUNS}/{run.json()['id']}/events") as stream:
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("event:")) == "event: run.queued"
            with httpx.Client(base_url=server.url, cookies=browser.cookies) as tab:
                assert tab.post(SIGN_OUT, data={"csrf": tab.cookies["specops_csrf"]}).status_code == 303
            assert next(line for line in lines if line.startswith("event:")) == "event: error"
            assert TOKEN_REVOKED in next(line for line in lines if line.startswith("data:"))
