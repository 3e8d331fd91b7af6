"""Issue 21's acceptance, a developer's side of T1 in the web console: sign in with a token,
the runs list, the new-run form (the fingerprint wizard, inference from pasted prompts), a run
started from it whose events arrive on its page live, the hero of what it measured and its
candidates; and on a run predicted for an H100 (whose winner no CPU load can change) the flags
of `apply`, their copy button, and the cache-hit badge of the same request again. Every page
at a laptop's and a phone's width, without console errors or serious axe-core violations."""

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
    # The next event comes with the bench's first measured rep: over a minute on a loaded CPU.
    console.wait(
        lambda: console.same_document() and len(console.all("event-item")) > shown_at_load,
        "an event appended to the open page",
        WAIT_S,
    )
    console.wait(lambda: "completed" in console.text("run-status").lower(), "the run to complete", WAIT_S)
    events = list(live.stack.clients["dev"].runs.stream(form_run))
    items = console.wait(
        lambda: (items := console.all("event-item")) and len(items) == len(events) and items,
        f"{len(events)} event items",
    )
    assert [e.type for e in events][-1] == "run.completed"
    assert "run.completed" in items[-1].text or "run.completed" in console.text("event-log")


def test_the_hero_shows_the_measured_winner(console: Console, live: Live, form_run: str) -> None:
    dev = live.stack.clients["dev"]
    run = dev.runs.wait(form_run, timeout=WAIT_S)
    assert run.status == "completed", (run.status, run.error)
    console.sign_in(live.token("dev"))
    console.open(f"/ui/runs/{form_run}")
    assert len(console.all("candidate-row")) == len(run.candidates)
    console.check(f"/ui/runs/{form_run}")
    if run.winner is None:
        # A measured answer: on a CPU busy with other benchmarks nothing may beat `none`.
        assert not console.has("winner-hero")
        speedups = {c.candidate.candidate_id: c.measurement.speedup for c in run.candidates if c.measurement}
        pytest.skip(f"the run measured no candidate above `none` ({speedups}): no winner to show")
    winner, measured = run.winner, run.winner.measurement
    assert measured is not None and winner.gate is not None and winner.gate.passed
    candidate = winner.candidate
    assert candidate.family in console.text("hero-family")
    assert candidate.draft is None or candidate.draft in console.text("hero-draft")
    assert str(candidate.k) in console.text("hero-shape")
    assert "pass" in console.text("hero-gate").lower()
    assert shows_number(console.text("hero-measured-speedup"), measured.speedup)
    assert shows_number(console.text("hero-predicted-speedup"), winner.prediction.speedup)
    assert shows_number(console.text("hero-acceptance"), measured.acceptance_rate)
    assert shows_number(console.text("hero-mean-accept-len"), measured.mean_acceptance_length)
    assert not console.has("cache-hit-badge"), "a measured run is no cache hit"
    console.open("/ui/runs")
    row = next(r for r in console.all("run-row") if r.get_attribute("data-run-id") == form_run)
    assert candidate.family in console.text_in(row, "run-winner")
    assert shows_number(console.text_in(row, "run-speedup"), measured.speedup)


def test_apply_copy_and_the_cache_hit_badge(console: Console, live: Live) -> None:
    """On the run predicted for an H100 (its winner does not depend on this CPU's timings): the
    vLLM flags of `apply`, their copy button, and the same request again, a winner-cache hit."""
    dev = live.stack.clients["dev"]
    run = dev.runs.wait(live.h100_run_id, timeout=WAIT_S)
    assert run.winner is not None, run
    console.sign_in(live.token("dev"))
    console.open(f"/ui/runs/{run.id}")
    assert run.winner.candidate.family in console.text("hero-family")
    assert shows_number(console.text("hero-predicted-speedup"), run.winner.prediction.speedup)
    assert not console.has("cache-hit-badge")
    console.choose("apply-engine", "vllm")
    console.find("apply-submit").click()
    flags = console.wait(lambda: console.text("apply-flags"), "the applied flags")
    expected = dev.runs.apply(run.id, engine="vllm").cli_args
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

    asked = run.request
    again = dev.runs.create(target=asked.target, workload=asked.workload, mode=asked.mode, goal=asked.goal)
    assert again.cache_hit, "the same request again is answered from the winner cache"
    console.open(f"/ui/runs/{again.id}")
    console.shown("cache-hit-badge")
    console.check(f"/ui/runs/{again.id}")
    console.open("/ui/runs")
    rows = {row.get_attribute("data-run-id"): row for row in console.all("run-row")}
    hit, first = (console.text_in(rows[r], "run-cache-hit") for r in (again.id, run.id))
    assert hit and hit != first, (hit, first)
