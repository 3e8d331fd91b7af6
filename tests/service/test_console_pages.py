"""The web console (/ui) over HTTP against a live gateway on a real PostgreSQL and nats-server:
sign-in, the session cookie and its CSRF rule, every page for each role, the buttons a role
may not use left out, the headers and static assets. (The pages' script is tested in a real
browser by tests/browser/.)"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from fixtures import bus
from fixtures.flows import completed_run, start, tuner_flow, wait_session
from fixtures.gateway import Gateway, running_gateway
from fixtures.head_flows import HEADS, validated_head

from specops_schemas.catalog import Role
from specops_schemas.tune import TuneCompleted
from specops_services.gateway.http.tokens import issue_token

UI = "/ui"
ROLES = ("viewer", "dev", "reviewer", "admin")


@pytest.fixture
async def gw(db: str, nats_url: str, tmp_path: Path) -> AsyncIterator[Gateway]:
    async with running_gateway(db, nats_url, artifact_dir=tmp_path) as gateway:
        gateway.tokens["reviewer"] = (await issue_token(db, tenant_id="acme", role=Role.HEAD_REVIEWER)).secret
        yield gateway


def browser(gw: Gateway) -> httpx.AsyncClient:
    """A client with a cookie jar of its own, as one browser is."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=gw.app), base_url="http://gateway.test")


async def submit_sign_in(client: httpx.AsyncClient, token: str) -> httpx.Response:
    """The sign-in form, shown and submitted."""
    form = await client.get(f"{UI}/sign-in")
    assert {"token-input", "sign-in-submit"} <= ids_in(form.text)
    return await client.post(f"{UI}/sign-in", data={"token": token, "csrf": client.cookies["specops_csrf"]})


@asynccontextmanager
async def sign_in(gw: Gateway, who: str) -> AsyncIterator[httpx.AsyncClient]:
    """A browser signed in with `who`'s token."""
    async with browser(gw) as client:
        response = await submit_sign_in(client, gw.tokens[who])
        assert response.status_code == 303 and response.headers["location"] == f"{UI}/runs"
        yield client


def ids_in(html: str) -> set[str]:
    return set(re.findall(r'data-testid="([^"]+)"', html))


async def test_sign_in_sets_the_session_and_a_bad_token_is_refused(gw: Gateway) -> None:
    async with browser(gw) as anonymous:
        page = await anonymous.get(f"{UI}/runs")
        assert page.status_code == 303 and page.headers["location"] == f"{UI}/sign-in"
        bad = await submit_sign_in(anonymous, "spk_not-a-token")
        assert bad.status_code == 200 and "sign-in-error" in ids_in(bad.text)
        assert "specops_session" not in anonymous.cookies
        # Another site's form (no CSRF field) cannot sign the browser in, even with a good token.
        forged = await anonymous.post(f"{UI}/sign-in", data={"token": gw.tokens["dev"]})
        assert forged.status_code == 200 and "sign-in-error" in ids_in(forged.text)
        assert "specops_session" not in anonymous.cookies

    async with sign_in(gw, "dev") as dev:
        cookies = dev.cookies
        assert cookies["specops_session"] and cookies["specops_csrf"]
        page = await dev.get(f"{UI}/runs")
        assert page.status_code == 200 and page.headers["cache-control"] == "no-store"
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
        assert "cache-hit-badge" not in ids_in(page)
        seen = (await viewer.get(f"{UI}/runs/{run_id}")).text
        assert "winner-hero" in ids_in(seen)
        assert not {"apply-submit", "apply-engine", "nav-new-run", "start-run"} & ids_in(seen)
        # The same request again is answered from the winner cache.
        hit = await gw.create()
        assert hit.status_code == 200 and hit.json()["cache_hit"], hit.text
        cached = (await viewer.get(f"{UI}/runs/{hit.json()['id']}")).text
        assert {"winner-hero", "cache-hit-badge"} <= ids_in(cached)
        row = re.search(
            rf'data-run-id="{hit.json()["id"]}".*?</tr>', (await viewer.get(f"{UI}/runs")).text, re.S
        )
        assert row is not None and "cache hit" in row.group(0)


async def test_every_page_renders_for_every_role_with_its_navigation(gw: Gateway) -> None:
    run_id = await completed_run(gw)
    head_id = await validated_head(gw)
    pages = [f"{UI}/runs", f"{UI}/runs/{run_id}", f"{UI}/tune", f"{UI}/heads", f"{UI}/heads/{head_id}"]
    for who in ROLES:
        async with sign_in(gw, who) as client:
            for path in pages:
                page = await client.get(path)
                assert page.status_code == 200, (who, path, page.text)
                ids = ids_in(page.text)
                assert {"nav", "nav-runs", "nav-tune", "nav-heads", "whoami", "sign-out"} <= ids, (who, path)
                assert ("nav-security" in ids) == (who == "admin"), (who, path)
                assert ("nav-new-run" in ids) == (who != "viewer"), (who, path)
            new_run = await client.get(f"{UI}/runs/new")
            if who == "viewer":
                assert new_run.status_code == 403 and "error-page" in ids_in(new_run.text)
            else:
                assert {
                    "new-run-form",
                    "model-ref",
                    "gpu",
                    "engine",
                    "mode",
                    "quality-gate",
                    "wizard",
                    "wizard-q1",
                    "wizard-q2",
                    "wizard-q3",
                    "fingerprint",
                    "sample-prompts",
                    "infer-fingerprint",
                    "start-run",
                } <= ids_in(new_run.text)


async def test_an_unknown_or_foreign_resource_is_a_404_page(gw: Gateway) -> None:
    foreign = await completed_run(gw, "other")
    async with sign_in(gw, "dev") as client:
        for path in (f"{UI}/runs/{foreign}", f"{UI}/tune/nope", f"{UI}/heads/hd-{'0' * 24}", f"{UI}/nothing"):
            page = await client.get(path)
            assert page.status_code == 404, path
            assert "error-page" in ids_in(page.text)
            assert "Not Found" in page.text


async def test_tune_pages_show_the_card_chart_data_trials_and_auto_termination(gw: Gateway) -> None:
    run_id = await completed_run(gw)
    session_id = (await start(gw, run_id)).json()["id"]
    flow = tuner_flow(session_id, run_id)
    completed = flow[-1].payload
    assert isinstance(completed, TuneCompleted)
    reason = "80 % of the budget without the top 3 moving by 1 sigma"
    flow[-1] = flow[-1].model_copy(
        update={"payload": completed.model_copy(update={"auto_terminated": True, "reason": reason})}
    )
    await bus.publish_all(gw.nats_url, flow)
    await wait_session(gw, session_id, lambda body: body["status"] == "completed")
    async with sign_in(gw, "viewer") as client:
        listing = (await client.get(f"{UI}/tune")).text
        assert f'data-session-id="{session_id}"' in listing and "tune-row" in ids_in(listing)
        page = (await client.get(f"{UI}/tune/{session_id}")).text
    assert {"tune-card", "best-so-far-chart", "trial-row", "tune-terminated"} <= ids_in(page)
    assert page.count('data-testid="trial-row"') == 3
    assert "1.60 ± 0.04×" in page  # the tuned winner's trial, mean ± sigma
    assert reason in page
    curve = re.search(r'data-curve="([^"]*)"', page)
    assert curve is not None and curve.group(1).count("&#34;trial&#34;") == 3


async def test_head_buttons_follow_the_lifecycle_and_the_role(gw: Gateway) -> None:
    head_id = await validated_head(gw)
    moves = {"transition-uat", "transition-production", "transition-deprecated"}
    shown: dict[str, set[str]] = {}
    for who in ROLES:
        async with sign_in(gw, who) as client:
            listing = (await client.get(f"{UI}/heads")).text
            assert f'data-head-id="{head_id}"' in listing and {"head-row", "head-state"} <= ids_in(listing)
            page = (await client.get(f"{UI}/heads/{head_id}")).text
            assert {"head-state", "head-metrics", "head-provenance", "train-progress"} <= ids_in(page)
            shown[who] = moves & ids_in(page)
    assert shown == {
        "viewer": set(),
        "dev": {"transition-uat", "transition-deprecated"},
        "reviewer": {"transition-uat", "transition-deprecated"},
        "admin": {"transition-uat", "transition-deprecated"},
    }
    moved = await gw.client.post(f"{HEADS}/{head_id}/transition", json={"to": "uat"}, headers=gw.auth())
    assert moved.status_code == 200, moved.text
    for who, expected in (
        ("dev", {"transition-deprecated"}),
        ("reviewer", {"transition-production", "transition-deprecated"}),
        ("viewer", set()),
    ):
        async with sign_in(gw, who) as client:
            page = (await client.get(f"{UI}/heads/{head_id}")).text
        assert moves & ids_in(page) == expected, who
        assert ("rationale" in ids_in(page)) == bool(expected), who


async def test_the_security_page_is_for_admins_only(gw: Gateway) -> None:
    async with sign_in(gw, "admin") as admin:
        page = await admin.get(f"{UI}/security")
        assert page.status_code == 200
        assert {
            "security-form",
            "tier",
            "jitter-mode",
            "jitter-interval-ms",
            "opt-out",
            "gpu-budget-s",
            "security-save",
            "security-saved",
            "security-adr",
        } <= ids_in(page.text)
        adr = re.search(r'data-testid="security-adr" href="([^"]+)"', page.text)
        assert adr is not None and (await admin.get(adr.group(1))).status_code == 200
    for who in ("viewer", "dev", "reviewer"):
        async with sign_in(gw, who) as client:
            refused = await client.get(f"{UI}/security")
        assert refused.status_code == 403, who
        assert "error-page" in ids_in(refused.text) and "security-form" not in ids_in(refused.text)


async def test_headers_static_assets_and_favicon(gw: Gateway) -> None:
    async with browser(gw) as client:
        page = await client.get(f"{UI}/sign-in")
        csp = page.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert page.headers["x-frame-options"] == "DENY"
        assert "<script>" not in page.text and " style=" not in page.text
        for asset, media in (
            ("console.css", "text/css"),
            ("console.js", "javascript"),
            ("favicon.svg", "image/svg+xml"),
        ):
            response = await client.get(f"{UI}/static/{asset}")
            assert response.status_code == 200 and media in response.headers["content-type"], asset
            assert f"/ui/static/{asset}" in page.text or asset == "console.css" or asset == "favicon.svg"
        favicon = await client.get("/favicon.ico", follow_redirects=True)
        assert favicon.status_code == 200 and favicon.headers["content-type"].startswith("image/svg+xml")


async def test_sign_out_needs_the_csrf_field_and_ends_the_session(gw: Gateway) -> None:
    async with sign_in(gw, "dev") as client:
        forged = await client.post(f"{UI}/sign-out", data={"csrf": "guess"})
        assert forged.status_code == 403
        assert (await client.get(f"{UI}/runs")).status_code == 200
        out = await client.post(f"{UI}/sign-out", data={"csrf": client.cookies["specops_csrf"]})
        assert out.status_code == 303 and out.headers["location"] == f"{UI}/sign-in"
        again = await client.get(f"{UI}/runs")
        assert again.status_code == 303 and again.headers["location"] == f"{UI}/sign-in"


async def test_fingerprint_inference_answers_the_signed_in_page_only(gw: Gateway) -> None:
    prompts = {"prompts": "def f(x):\n    return x\n\nSummarize this article: ...\n\nimport os"}
    async with sign_in(gw, "viewer") as client:
        refused = await client.post(f"{UI}/fingerprint", json=prompts)
        assert refused.status_code == 403  # the cookie without the CSRF header
        csrf = {"X-Specops-CSRF": client.cookies["specops_csrf"]}
        inferred = await client.post(f"{UI}/fingerprint", json=prompts, headers=csrf)
        answer = inferred.json()
        assert answer["fingerprint"] == "code" and answer["runner_up"] != "code"
        assert answer["votes"]["code"] >= 2 and sum(answer["votes"].values()) == 3
        empty = await client.post(f"{UI}/fingerprint", json={"prompts": "  "}, headers=csrf)
        assert empty.status_code == 422
    async with browser(gw) as anonymous:
        assert (await anonymous.post(f"{UI}/fingerprint", json=prompts)).status_code == 401
