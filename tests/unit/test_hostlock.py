"""The host-wide device lock: one holder at a time across processes, spans journaled, waiters stoppable."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from specplatform.hostlock import DeviceLock, LockAbandoned, device_lock_name

HOLD_S = 0.4


def _hold_in_another_process(directory: Path, seconds: float) -> subprocess.Popen[bytes]:
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from specplatform.hostlock import DeviceLock\n"
        f"with DeviceLock(Path({str(directory)!r}), 'cpu').held('bench of run other'):\n"
        "    print('held', flush=True)\n"
        f"    time.sleep({seconds})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
    return proc


def test_a_second_process_waits_and_the_journal_shows_no_overlap(tmp_path: Path) -> None:
    other = _hold_in_another_process(tmp_path, HOLD_S)
    lock = DeviceLock(tmp_path, "cpu")
    with lock.held("bench of run mine"):
        acquired = time.time()
    assert other.wait(10) == 0
    theirs, mine = lock.spans()
    assert (theirs.purpose, mine.purpose) == ("bench of run other", "bench of run mine")
    assert theirs.pid == other.pid and mine.pid != other.pid
    assert not theirs.overlaps(mine) and mine.started_at >= theirs.ended_at
    assert mine.waited_s > HOLD_S / 2 and acquired >= theirs.ended_at


def test_threads_of_one_process_are_serialised_too(tmp_path: Path) -> None:
    lock = DeviceLock(tmp_path, "cpu")

    def hold(name: str) -> None:
        with lock.held(name):
            time.sleep(0.05)

    threads = [threading.Thread(target=hold, args=(f"gate {i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = lock.spans()
    assert len(spans) == 4
    assert not any(a.overlaps(b) for i, a in enumerate(spans) for b in spans[i + 1 :])


def test_a_waiter_told_to_stop_gives_up_and_other_devices_are_free(tmp_path: Path) -> None:
    other = _hold_in_another_process(tmp_path, 5.0)
    try:
        stop = threading.Event()
        threading.Timer(0.2, stop.set).start()
        with pytest.raises(LockAbandoned), DeviceLock(tmp_path, "cpu").held("bench of run late", stop):
            pytest.fail("the lock was taken while another process held it")
        with DeviceLock(tmp_path, "cuda-GPU-1").held("bench on another device"):
            pass
    finally:
        other.kill()
        other.wait()
    # The kernel released the killed holder's lock.
    with DeviceLock(tmp_path, "cpu").held("bench after the kill"):
        pass


def test_device_lock_names() -> None:
    assert device_lock_name("cpu") == "cpu"
    assert device_lock_name("not-a-device") == "cpu"
    if not torch.cuda.is_available():
        assert device_lock_name("auto") == "cpu"
