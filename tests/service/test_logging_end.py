"""A pytest session that starts services' brokers ends without `--- Logging error ---`.

The session runs in a subprocess on a generated test file: its tests start a service's
broker (once inside `capsys`, whose stream closes with the test), and at interpreter exit,
after pytest has closed its captured streams, every logger the session set up writes a
record, as a daemon thread of a service still running would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

SESSION = """
import asyncio
import atexit
import logging
import os

import pytest

from specbus import make_broker


def log_everywhere_at_exit() -> None:
    for name in ["", *logging.root.manager.loggerDict]:
        logging.getLogger(name).critical("logged after the session")


atexit.register(log_everywhere_at_exit)


async def serve(service: str) -> None:
    # A service's broker starts (its subscriber logs that it waits for messages) and stops.
    broker = make_broker(os.environ["PROBE_NATS_URL"], service=service)

    @broker.subscriber(f"probe.{service}")
    async def handle(body: str) -> None:
        pass

    await broker.start()
    await broker.stop()


def test_a_service_starts() -> None:
    asyncio.run(serve("probe"))


def test_a_service_starts_while_stdout_is_captured(capsys: pytest.CaptureFixture[str]) -> None:
    asyncio.run(serve("probe-captured"))


def test_a_later_service_logs_without_error(capfd: pytest.CaptureFixture[str]) -> None:
    asyncio.run(serve("probe-later"))
    assert "Logging error" not in capfd.readouterr().err
"""


def test_a_session_with_service_brokers_ends_without_logging_errors(nats_url: str, tmp_path: Path) -> None:
    (tmp_path / "test_session.py").write_text(SESSION)
    env = os.environ | {
        "PROBE_NATS_URL": nats_url,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "fixtures.logging_guard"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "3 passed" in output
    assert "Logging error" not in output
    # The records logged at exit still reach the terminal, through logging's last resort.
    assert "logged after the session" in done.stderr
