"""Issue 21's acceptance, T2 in the web console: a tune session's card whose best-so-far chart
grows while the page is open (one point per completed trial, from the session's event
stream), each trial with its mean ± sigma, and the sessions list. Both widths, no console
errors, no serious axe-core violations."""

from __future__ import annotations

import pytest
from fixtures.browser import NEEDS_CHROMIUM, Console
from fixtures.console_stack import CPU_HOST, WAIT_S, Live
from selenium.webdriver.remote.webelement import WebElement

pytestmark = [pytest.mark.browser, pytest.mark.slow, NEEDS_CHROMIUM, CPU_HOST]

# Two trials of n-gram, the chart watched from before the second; the budget is far beyond them.
TRIALS = 2
BUDGET_MINUTES = 10.0


def _points(console: Console) -> list[WebElement]:
    return console.all("chart-point", console.find("best-so-far-chart"))


@pytest.mark.long  # a whole T2 session (two minutes here); the tuner's service tests run in make test
def test_the_best_so_far_chart_grows_live(console: Console, live: Live, form_run: str) -> None:
    dev = live.stack.clients["dev"]
    run = dev.runs.wait(form_run, timeout=WAIT_S)
    assert run.status == "completed", (run.status, run.error)
    console.sign_in(live.token("dev"))
    session = dev.tune_sessions.create(
        run.id, budget_minutes=BUDGET_MINUTES, max_trials=TRIALS, families=["ngram"]
    )
    console.open(f"/ui/tune/{session.id}")
    assert console.find("best-so-far-chart").tag_name == "svg"
    console.mark()
    points_at_load = len(_points(console))
    assert points_at_load < TRIALS, "the session had finished before its page could watch it"
    console.wait(
        lambda: console.same_document() and len(_points(console)) > points_at_load,
        "a new point on the open page's chart",
    )
    console.wait(lambda: len(_points(console)) == TRIALS, f"{TRIALS} points on the chart")

    done = dev.tune_sessions.get(session.id)
    console.open(f"/ui/tune/{session.id}")
    rows = console.all("trial-row")
    assert len(rows) == len(done.trials) == TRIALS
    assert all("±" in row.text for row in rows), [row.text for row in rows]
    assert console.find("tune-card").is_displayed()
    assert not console.has("tune-terminated"), "a session that ran out of trials was not auto-terminated"
    console.check(f"/ui/tune/{session.id}")
    console.find("nav-tune").click()
    console.wait(lambda: console.path == "/ui/tune", "the tune sessions list")
    # A row names its session in its link or its data.
    assert any(session.id in row.get_attribute("outerHTML") for row in console.all("tune-row"))
    console.check("/ui/tune")
