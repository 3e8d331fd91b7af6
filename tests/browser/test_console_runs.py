"""Issue 21's acceptance, a developer's side of T1 in the web console: sign in with a token,
the runs list, the new-run form (the fingerprint wizard, inference from pasted prompts), a run
started from it whose events arrive on its page live, the winner hero, the candidates, the
flags of `apply` and their copy button, and the cache-hit badge of the same request again.
Every page at a laptop's and a phone's width, without console errors or serious axe-core
violations."""

from __future__ import annotations

import itertools
import shlex

import pytest
from fixtures.browser import NEEDS_CHROMIUM, Console, shows_number
from fixtures.console_stack import CPU_HOST, WAIT_S, Live
from selenium.webdriver.common.by import By

from specops_schemas.catalog import Fingerprint

pytestmark = [pytest.mark.browser, pytest.mark.slow, NEEDS_CHROMIUM, CPU_HOST]

CODE_PROMPTS = "\n\n".join(
    (
        "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n    # finish this function",
        "Fix the bug in this Python code:\n```python\nfor i in range(10) print(i)\n```",
        "import numpy as np\n\nclass Matrix:\n    def __init__(self, rows):\n        self.rows = rows",
    )
)
# Where a copy button may say that it copied, besides its text.
COPIED_HINTS = ("class", "data-state", "aria-label", "title")


def test_sign_in_with_a_token(console: Console, live: Live) -> None:
    console.open("/ui/sign-in")
    console.driver.delete_all_cookies()
    console.open("/ui/runs")
    assert console.path == "/ui/sign-in", "a page without a session leads to the sign-in form"
    console.check("/ui/sign-in")
    console.fill("token-input", "not-a-token")
    console.find("sign-in-submit").click()
    console.shown("sign-in-error")

    console.sign_in(live.token("dev"))
    who = console.text("whoami")
    assert "acme" in who and "developer" in who, who
    for link in ("nav-runs", "nav-new-run", "nav-tune", "nav-heads"):
        assert console.find(link).is_displayed(), link
    assert not console.has("nav-security"), "only admins see the security page"
    cookies = {c["name"]: c for c in console.driver.get_cookies()}
    session, csrf = cookies["specops_session"], cookies["specops_csrf"]
    assert session["httpOnly"] and session["sameSite"] == "Strict", session
    assert not csrf["httpOnly"], "the page's script reads the CSRF cookie to send it back as a header"
    rows = console.wait(lambda: console.all("run-row"), "the runs table's rows")
    assert live.h100_run_id in {row.get_attribute("data-run-id") for row in rows}
    console.check("/ui/runs")

    console.find("sign-out").click()
    console.wait(lambda: console.path == "/ui/sign-in", "the sign-in form after signing out")
    console.open("/ui/runs")
    assert console.path == "/ui/sign-in"


def test_fingerprint_wizard_and_inference(console: Console, live: Live) -> None:
    console.sign_in(live.token("dev"))
    console.open("/ui/runs/new")
    groups = [
        console.find(f"wizard-q{i}").find_elements(By.CSS_SELECTOR, 'input[type="radio"]') for i in (1, 2, 3)
    ]
    assert all(groups), "each wizard question is a group of radio buttons"
    # The answers drive the fingerprint: some two sets of answers give two different ones.
    seen = set()
    for answers in itertools.product(*groups):
        for radio in answers:
            radio.click()
        seen.add(console.value("fingerprint"))
        if len(seen) > 1:
            break
    assert len(seen) > 1 and seen <= set(Fingerprint), seen

    console.fill("sample-prompts", CODE_PROMPTS)
    console.find("infer-fingerprint").click()
    console.wait(lambda: console.value("fingerprint") == "code", "the fingerprint inferred from code prompts")
    console.check("/ui/runs/new")


def test_run_events_arrive_live(console: Console, live: Live, form_run: str) -> None:
    console.mark()
    shown_at_load = len(console.all("event-item"))
    console.wait(
        lambda: console.same_document() and len(console.all("event-item")) > shown_at_load,
        "an event appended to the open page",
    )
    console.wait(lambda: "completed" in console.text("run-status").lower(), "the run to complete", WAIT_S)
    events = list(live.stack.clients["dev"].runs.stream(form_run))
    items = console.wait(
        lambda: (items := console.all("event-item")) and len(items) == len(events) and items,
        f"{len(events)} event items",
    )
    assert [e.type for e in events][-1] == "run.completed"
    assert "run.completed" in items[-1].text or "run.completed" in console.text("event-log")


def test_winner_hero_candidates_and_apply(console: Console, live: Live, form_run: str) -> None:
    dev = live.stack.clients["dev"]
    run = dev.runs.wait(form_run, timeout=WAIT_S)
    assert run.status == "completed" and run.winner is not None, (
        run.status,
        run.error,
        [
            (c.candidate.candidate_id, c.measurement and c.measurement.speedup, c.error_message)
            for c in run.candidates
        ],
    )
    print(
        "FORMRUN",
        [(c.candidate.candidate_id, c.measurement and c.measurement.speedup) for c in run.candidates],
    )
    winner, measured = run.winner, run.winner.measurement
    assert measured is not None
    console.sign_in(live.token("dev"))
    console.open(f"/ui/runs/{form_run}")

    assert winner.candidate.family in console.text("hero-family")
    for testid in ("hero-draft", "hero-shape", "hero-gate"):
        assert console.text(testid), f"{testid} is empty"
    assert shows_number(console.text("hero-measured-speedup"), measured.speedup)
    assert shows_number(console.text("hero-predicted-speedup"), winner.prediction.speedup)
    assert shows_number(console.text("hero-acceptance"), measured.acceptance_rate)
    assert shows_number(console.text("hero-mean-accept-len"), measured.mean_acceptance_length)
    assert not console.has("cache-hit-badge"), "a measured run is no cache hit"
    assert len(console.all("candidate-row")) == len(run.candidates)

    console.choose("apply-engine", "speccore")
    console.find("apply-submit").click()
    flags = console.wait(lambda: console.text("apply-flags"), "the applied flags")
    expected = dev.runs.apply(form_run, engine="speccore").cli_args
    assert all(arg in flags or shlex.quote(arg) in flags for arg in expected), (flags, expected)
    copy = console.find("copy-flags")
    copy.click()
    console.wait(
        lambda: (
            "copied" in " ".join(filter(None, (copy.text, *map(copy.get_attribute, COPIED_HINTS)))).lower()
        ),
        "the copy button's copied state",
    )
    assert console.clipboard().strip() == flags
    console.check(f"/ui/runs/{form_run}")

    asked = run.request
    again = dev.runs.create(target=asked.target, workload=asked.workload, mode=asked.mode, goal=asked.goal)
    assert again.cache_hit, "the same request again is answered from the winner cache"
    console.open(f"/ui/runs/{again.id}")
    console.shown("cache-hit-badge")
    console.check(f"/ui/runs/{again.id}")
    console.open("/ui/runs")
    rows = {row.get_attribute("data-run-id"): row for row in console.all("run-row")}
    hit, measured_run = (console.text_in(rows[r], "run-cache-hit") for r in (again.id, form_run))
    assert hit and hit != measured_run, (hit, measured_run)
    assert winner.candidate.family in console.text_in(rows[form_run], "run-winner")
    assert shows_number(console.text_in(rows[form_run], "run-speedup"), measured.speedup)
