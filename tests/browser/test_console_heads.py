"""Issue 21's acceptance, the head registry in the web console: a head moves through its
lifecycle by the buttons of the roles that may make each move (a developer: validated -> uat;
a head reviewer: uat -> production, with the rationale box required; a developer: production ->
deprecated, with its reason), and nobody sees a button their role may not use or a move the
lifecycle has not. The head is watched training first: its page follows it to `validated`.
Both widths, no console errors, no serious axe-core violations."""

from __future__ import annotations

import pytest
from fixtures.browser import NEEDS_CHROMIUM, Console
from fixtures.console_stack import CPU_HOST, WAIT_S, Live, trained_head

pytestmark = [pytest.mark.browser, pytest.mark.slow, NEEDS_CHROMIUM, CPU_HOST]

RATIONALE = "held-out acceptance checked by hand"
RETIRED = "replaced by a head trained on more data"


def _state(console: Console) -> str:
    return console.text("head-state").lower()


def test_a_head_moves_through_its_lifecycle_by_role(console: Console, live: Live) -> None:
    dev = live.stack.clients["dev"]
    page = f"/ui/heads/{live.head_id}"
    # Submitted when the stack came up: opened while it trains, the page follows it to its verdict.
    console.sign_in(live.token("dev"))
    console.open(page)
    assert "training" in _state(console)
    console.find("train-progress")
    console.wait(lambda: "validated" in _state(console), "the page to show the head validated", WAIT_S)
    head = trained_head(dev, live.head_id)
    assert head.state == "validated", (head.state, head.error)

    console.find("nav-heads").click()
    console.wait(lambda: console.path == "/ui/heads", "the head registry")
    rows = {row.get_attribute("data-head-id"): row for row in console.all("head-row")}
    assert "validated" in console.text_in(rows[head.id], "head-state").lower()
    console.check("/ui/heads")
    console.open(page)
    for testid in ("head-metrics", "head-provenance", "train-progress"):
        assert console.text(testid), f"{testid} is empty"
    assert not console.has("transition-production"), "validated -> production is no legal move"
    console.check(page)
    console.find("transition-uat").click()
    console.wait(lambda: "uat" in _state(console), "the head in uat")
    console.open(page)
    assert not console.has("transition-production"), "a developer may not approve production"
    assert not console.has("transition-uat")

    console.sign_in(live.token("reviewer"))
    console.open(page)
    rationale = console.find("rationale")
    assert rationale.is_displayed()
    console.find("transition-production").click()
    # Without a rationale the move is refused: by the form's own check or the API's 422.
    console.wait(
        lambda: (
            console.has("transition-error")
            or console.driver.execute_script("return arguments[0].matches(':invalid')", rationale)
        ),
        "the refusal of a promotion without rationale",
    )
    assert dev.heads.get(head.id).state == "uat"
    console.fill("rationale", RATIONALE)
    console.find("transition-production").click()
    console.wait(lambda: "production" in _state(console), "the head in production")
    moved = dev.heads.get(head.id)
    assert moved.state == "production" and moved.transitions[-1].rationale == RATIONALE
    console.check(page)

    # Retired by a developer, with its reason: later T1 runs of the tenant no longer offer it.
    console.sign_in(live.token("dev"))
    console.open(page)
    assert not console.has("transition-uat") and not console.has("transition-production")
    console.fill("rationale", RETIRED)
    console.find("transition-deprecated").click()
    console.wait(lambda: "deprecated" in _state(console), "the head deprecated")
    assert not any(console.has(f"transition-{to}") for to in ("uat", "production", "deprecated"))
    assert dev.heads.get(head.id).transitions[-1].rationale == RETIRED
