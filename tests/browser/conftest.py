"""One live stack and one Chromium for every browser test (package scope: started by the
first test that needs them, stopped after the last), and the data the tests share, submitted
as soon as the stack is up so that it trains and measures while the first tests drive pages:
a small head (to be moved through its lifecycle) and a T1 run on `chat` started through the API
(to be looked at by a viewer and tuned)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fixtures.browser import Console, start_chromium
from fixtures.console_stack import TARGET, Live, console_stack, submit_head


@pytest.fixture(scope="package")
def live() -> Iterator[Live]:
    with pytest.MonkeyPatch.context() as monkeypatch, console_stack(monkeypatch) as stack:
        dev = stack.clients["dev"]
        head = submit_head(dev)
        run = dev.runs.create(target=TARGET, workload="chat")
        yield Live(stack, head.id, run.id)


@pytest.fixture(scope="package")
def console(live: Live) -> Iterator[Console]:
    driver = start_chromium()
    try:
        yield Console(driver, live.stack.url)
    finally:
        driver.quit()
