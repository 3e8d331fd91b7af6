"""The web console (/ui) over HTTP against a live gateway on a real PostgreSQL and nats-server:
sign-in, the session cookie and its CSRF rule, every page for each role, the buttons a role
may not use left out, the headers and static assets. (The pages' script is tested in a real
browser by tests/browser/.)"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from fixtures.flows import completed_run
from fixtures.gateway import Gateway, running_gateway

UI = "/ui"


@pytest.fixture
async def gw(db: str, nats_url: str) -> AsyncIterator[Gateway]:
    async with running_gateway(db, nats_url) as gateway:
        yield gateway


def browser(gw: Gateway) -> httpx.AsyncClient:
    """A client with a cookie jar of its own, as one browser is."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=gw.app), base_url="http://gateway.test")


@asynccontextmanager
async def sign_in(gw: Gateway, who: str) -> AsyncIterator[httpx.AsyncClient]:
    """A browser signed in with `who`'s token."""
    async with browser(gw) as client:
        response = await client.post(f"{UI}/sign-in", data={"token": gw.tokens[who]})
        assert response.status_code == 303 and response.headers["location"] == f"{UI}/runs"
        yield client


def ids_in(html: str) -> set[str]:
    return set(re.findall(r'data-testid="([^"]+)"', html))


async def test_sign_in_sets_the_session_and_a_bad_token_is_refused(gw: Gateway) -> None:
    async with browser(gw) as anonymous:
        page = await anonymous.get(f"{UI}/runs")
        assert page.status_code == 303 and page.headers["location"] == f"{UI}/sign-in"
        form = await anonymous.get(f"{UI}/sign-in")
        assert {"token-input", "sign-in-submit"} <= ids_in(form.text)
        bad = await anonymous.post(f"{UI}/sign-in", data={"token": "spk_not-a-token"})
        assert "sign-in-error" in ids_in(bad.text)
        assert "specops_session" not in anonymous.cookies

    async with sign_in(gw, "dev") as dev:
        cookies = dev.cookies
        assert cookies["specops_session"] and cookies["specops_csrf"]
        page = await dev.get(f"{UI}/runs")
        assert page.status_code == 200
        assert {"nav", "whoami", "sign-out", "runs-table"} <= ids_in(page.text)
        assert "acme" in page.text and "developer" in page.text


async def test_runs_and_run_page_show_the_winner_and_apply_for_developers(gw: Gateway) -> None:
    run_id = await completed_run(gw)
    async with sign_in(gw, "dev") as dev, sign_in(gw, "viewer") as viewer:
        runs = (await dev.get(f"{UI}/runs")).text
        assert f'data-run-id="{run_id}"' in runs
        assert {
            "run-row",
            "run-state",
            "run-winner",
            "run-speedup",
            "run-cache-hit",
            "nav-new-run",
        } <= ids_in(runs)
        page = (await dev.get(f"{UI}/runs/{run_id}")).text
        assert {
            "run-status",
            "event-log",
            "event-item",
            "winner-hero",
            "hero-family",
            "hero-draft",
            "hero-shape",
            "hero-measured-speedup",
            "hero-predicted-speedup",
            "hero-acceptance",
            "hero-mean-accept-len",
            "hero-gate",
            "candidates-table",
            "candidate-row",
            "apply-engine",
            "apply-submit",
            "apply-flags",
            "copy-flags",
        } <= ids_in(page)
        assert "1.40×" in page
        seen = (await viewer.get(f"{UI}/runs/{run_id}")).text
        assert "winner-hero" in ids_in(seen)
        assert not {"apply-submit", "apply-engine", "nav-new-run", "start-run"} & ids_in(seen)
