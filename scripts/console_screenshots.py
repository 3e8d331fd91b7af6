"""`make screenshots`: the web console's main pages as PNGs (docs/console/, shown in the README).

Starts the browser tests' live stack (tests/fixtures/console_stack.py: `specops up` on a scratch
state dir, small benches, the real 135M model) and makes what a tenant's pages would show: a
small head trained and moved to uat, a T1 run on `code` started from the new-run form (with
the fingerprint wizard answered) and measured here, the same request again (a winner-cache
hit), a run predicted for an H100, and a tune session on the measured run. Then an admin's
headless Chromium (tests/fixtures/browser.py) captures each page whole, at a laptop's width,
and the run page at a phone's too. About two minutes on two cores.

    .venv/bin/python scripts/console_screenshots.py --out docs/console
"""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The stack and the browser are the browser tests' own fixtures, not a copy of them.
sys.path.insert(0, str(ROOT / "tests"))

import pytest  # noqa: E402
from fixtures.browser import LAPTOP, PHONE, Console, start_chromium  # noqa: E402
from fixtures.console_stack import (  # noqa: E402
    H100_TARGET,
    TARGET,
    WAIT_S,
    ConsoleStack,
    console_stack,
    submit_head,
    trained_head,
)
from selenium.webdriver.common.by import By  # noqa: E402

from specops.client import Run  # noqa: E402
from specops_schemas.heads import HeadResponse  # noqa: E402

WORKLOAD = "code"
SAMPLE_PROMPTS = (
    "def merge_intervals(intervals):\n    # return the merged list, sorted by start\n\n"
    "Write a Python function that parses an ISO 8601 date and returns a datetime.\n\n"
    "Fix the bug:\n```python\nfor i in range(len(xs)) print(xs[i])\n```"
)
TUNE_TRIALS = 5
# A head as issue 18's acceptance test trains one (three epochs, three Medusa heads, 160
# examples): a curve and a measured acceptance worth showing, a minute or so of training.
SCREENSHOT_HEAD = {
    "train_lines": 160,
    "epochs": 3,
    "num_heads": 3,
    "max_len": 128,
    "draft_vocab": 2048,
    "gate": {"min_acceptance": 0.0, "n_prompts": 2, "max_new_tokens": 16, "reps": 1},
}
TUNE_BUDGET_MINUTES = 10.0


def capture(console: Console, path: Path) -> None:
    """The whole page as loaded, not just the window, as a PNG."""
    size = console.driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = console.driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def new_run_from_form(console: Console) -> str:
    """A developer's T1 run on WORKLOAD from the new-run form, the wizard answered and then the
    fingerprint inferred from pasted prompts; the run's id."""
    console.open("/ui/runs/new")
    for question in ("wizard-q1", "wizard-q2", "wizard-q3"):
        console.find(question).find_element(By.CSS_SELECTOR, 'input[type="radio"]').click()
    console.fill("sample-prompts", SAMPLE_PROMPTS)
    console.find("infer-fingerprint").click()
    console.wait(lambda: console.value("fingerprint") == WORKLOAD, f"the fingerprint inferred as {WORKLOAD}")
    return console.submit_new_run(
        {"model-ref": TARGET["model_ref"], "gpu": TARGET["gpu"], "engine": TARGET["engine"]}
    )


def make_data(stack: ConsoleStack, console: Console) -> tuple[Run, Run, str, HeadResponse]:
    """The head, the runs and the session the pages show; the new-run form is captured on the way."""
    dev = stack.clients["dev"]
    head = submit_head(dev, **SCREENSHOT_HEAD)
    dev.runs.create(target=H100_TARGET, workload="chat")
    console.sign_in(stack.tokens["dev"])
    run_id = new_run_from_form(console)
    run = dev.runs.wait(run_id, timeout=WAIT_S)
    if run.winner is None:
        raise SystemExit(f"run {run.id} measured no winner; run the script again on a quieter machine")
    asked = run.request
    hit = dev.runs.create(target=asked.target, workload=asked.workload, mode=asked.mode, goal=asked.goal)
    families = sorted({"ngram", run.winner.candidate.family})
    session = dev.tune_sessions.create(
        run.id, budget_minutes=TUNE_BUDGET_MINUTES, max_trials=TUNE_TRIALS, families=families
    )
    for _ in dev.tune_sessions.stream(session.id):  # to the session's last event
        pass
    head = trained_head(dev, head.id)
    if head.state == "validated":
        head = dev.heads.transition(head.id, "uat")
    return run, hit, session.id, head


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "console", help="where the PNGs go")
    args = parser.parse_args()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as monkeypatch, console_stack(monkeypatch) as stack:
        driver = start_chromium(LAPTOP)
        try:
            console = Console(driver, stack.url)
            console.open("/ui/sign-in")
            capture(console, out / "sign-in.png")
            run, hit, session_id, head = make_data(stack, console)

            console.sign_in(stack.tokens["admin"])
            console.open("/ui/runs/new")
            console.fill("sample-prompts", SAMPLE_PROMPTS)
            console.find("infer-fingerprint").click()
            console.wait(lambda: console.value("fingerprint") == WORKLOAD, "the inferred fingerprint")
            capture(console, out / "new-run.png")
            pages = {
                "runs": "/ui/runs",
                "run-cache-hit": f"/ui/runs/{hit.id}",
                "tune-sessions": "/ui/tune",
                "tune-session": f"/ui/tune/{session_id}",
                "heads": "/ui/heads",
                "head": f"/ui/heads/{head.id}",
                "security": "/ui/security",
            }
            for name, path in pages.items():
                console.open(path)
                capture(console, out / f"{name}.png")
            console.open(f"/ui/runs/{run.id}")
            console.find("apply-submit").click()
            console.wait(lambda: console.text("apply-flags"), "the applied flags")
            capture(console, out / "run.png")
            driver.set_window_size(*PHONE)
            console.open(f"/ui/runs/{run.id}")
            capture(console, out / "run-phone.png")
        finally:
            driver.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
