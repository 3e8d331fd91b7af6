"""Issue 21's acceptance, roles and tenants in the web console: a viewer sees no button they may
not use (start a run, apply, move a head) and the API refuses them anyway, with their session
cookie as with their token; an admin alone has the security page, and saves the tenant's
policy there; another tenant's run is a 404 page. Every page at both widths, without console
errors or serious axe-core violations."""

from __future__ import annotations

import httpx
import pytest
from fixtures.browser import NEEDS_CHROMIUM, Console
from fixtures.console_stack import CPU_HOST, H100_TARGET, Live

from specops_schemas.api import API_PREFIX

pytestmark = [pytest.mark.browser, pytest.mark.slow, NEEDS_CHROMIUM, CPU_HOST]

TRANSITIONS = ("transition-uat", "transition-production", "transition-deprecated")
SECURITY_FIELDS = ("tier", "jitter-mode", "jitter-interval-ms", "opt-out", "gpu-budget-s")
GPU_BUDGET_S = "7200"


def _refusals(live: Live, auth: dict[str, str], cookies: dict[str, str] | None = None) -> dict[str, int]:
    """The statuses of a viewer's attempts at what the console hides from them."""
    calls = {
        "start a run": ("runs", {"target": H100_TARGET, "workload": {"fingerprint": "chat"}}),
        "apply": (f"runs/{live.h100_run_id}/apply", {"engine": "vllm"}),
        "move a head": (f"heads/{live.head_id}/transition", {"to": "uat"}),
    }
    with httpx.Client(base_url=f"{live.stack.url}{API_PREFIX}/", cookies=cookies, headers=auth) as client:
        return {what: client.post(path, json=body).status_code for what, (path, body) in calls.items()}


def test_a_viewer_sees_no_buttons_and_the_api_refuses_them(console: Console, live: Live) -> None:
    console.sign_in(live.token("viewer"))
    assert "viewer" in console.text("whoami")
    assert not console.has("nav-new-run") and not console.has("nav-security")
    console.check("/ui/runs")

    console.open(f"/ui/runs/{live.h100_run_id}")
    console.find("run-status")
    assert not console.has("apply-submit")
    console.check(f"/ui/runs/{live.h100_run_id}")
    console.open("/ui/runs/new")
    assert not console.has("start-run")
    console.open(f"/ui/heads/{live.head_id}")
    console.find("head-state")
    assert not any(console.has(t) for t in TRANSITIONS)
    console.check(f"/ui/heads/{live.head_id}")

    cookies = console.cookies()
    forbidden = dict.fromkeys(("start a run", "apply", "move a head"), 403)
    assert _refusals(live, {"X-Specops-CSRF": cookies["specops_csrf"]}, cookies) == forbidden
    assert _refusals(live, {"Authorization": f"Bearer {live.token('viewer')}"}) == forbidden


def test_the_session_cookie_needs_the_csrf_header(console: Console, live: Live) -> None:
    console.sign_in(live.token("dev"))
    cookies = console.cookies()
    refused = _refusals(live, {}, cookies)
    assert set(refused.values()) == {403}, refused
    with httpx.Client(base_url=f"{live.stack.url}{API_PREFIX}/", cookies=cookies) as client:
        me = client.get("me")
    assert me.status_code == 200 and "acme" in me.json().values(), me.text


def test_the_security_page_is_an_admins(console: Console, live: Live) -> None:
    console.sign_in(live.token("dev"))
    console.open("/ui/security")
    console.shown("error-page")
    assert not console.has("security-form")
    console.check("/ui/security", status=403)

    console.sign_in(live.token("admin"))
    console.find("nav-security").click()
    console.wait(lambda: console.path == "/ui/security", "the security page")
    for testid in SECURITY_FIELDS:
        assert console.find(testid).is_displayed(), testid
    assert console.find("security-adr").get_attribute("href")
    console.fill("gpu-budget-s", GPU_BUDGET_S)
    console.find("security-save").click()
    console.shown("security-saved")
    admin = live.stack.clients["admin"]
    console.wait(
        lambda: (
            admin.request("GET", f"{API_PREFIX}/security/policy").json()["gpu_budget_s"]
            == float(GPU_BUDGET_S)
        ),
        "the saved GPU budget in the API's policy",
    )
    console.check("/ui/security")


def test_another_tenants_run_is_not_found(console: Console, live: Live) -> None:
    console.sign_in(live.token("other"))
    assert "globex" in console.text("whoami")
    assert live.h100_run_id not in {r.get_attribute("data-run-id") for r in console.all("run-row")}
    console.open(f"/ui/runs/{live.h100_run_id}")
    console.shown("error-page")
    console.check(f"/ui/runs/{live.h100_run_id}", status=404)
