"""One live stack and one Chromium for every browser test (package scope: started by the
first test that needs them, stopped after the last), and the data the tests share: a small head
submitted as soon as the stack is up (it trains while the first tests drive pages), a T1 run
predicted for an H100 (completed at once, for the pages that only show a run), and the T1 run a
developer starts from the new-run form (measured here; its page, winner and tune session)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fixtures.browser import Console, start_chromium
from fixtures.console_stack import H100_TARGET, TARGET, Live, console_stack, submit_head

# The new-run form as the developer fills it: a T1 run on `code` here, where the built-in heads
# measure well above `none`.
FORM = {
    "model-ref": TARGET["model_ref"],
    "gpu": TARGET["gpu"],
    "engine": TARGET["engine"],
    "mode": "interactive",
    "quality-gate": "topk5",
    "fingerprint": "code",
}


@pytest.fixture(scope="package")
def live() -> Iterator[Live]:
    with pytest.MonkeyPatch.context() as monkeypatch, console_stack(monkeypatch) as stack:
        dev = stack.clients["dev"]
        head = submit_head(dev)
        run = dev.runs.create(target=H100_TARGET, workload="chat")
        yield Live(stack, head.id, run.id)


@pytest.fixture(scope="package")
def console(live: Live) -> Iterator[Console]:
    driver = start_chromium()
    try:
        yield Console(driver, live.stack.url)
    finally:
        driver.quit()


@pytest.fixture(scope="package")
def form_run(console: Console, live: Live) -> str:
    """The id of a T1 run a developer started from the new-run form; the browser is left on the
    run page the form led to, right after it loaded."""
    console.sign_in(live.token("dev"))
    console.find("nav-new-run").click()
    console.wait(lambda: console.path == "/ui/runs/new", "the new-run form")
    return console.submit_new_run(FORM)
