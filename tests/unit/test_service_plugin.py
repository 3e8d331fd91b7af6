"""A service from a separately installed package (tests/plugins/toy_service, found only through
its `specops.services` entry point) is known everywhere a built-in one is: `specops serve`
offers and runs it, `specops up` takes its replicas and starts it before the gateway, and its
NATS user may pull its own consumer and publish its own events. No specops file names it.

Each check runs in a subprocess whose PYTHONPATH holds the plugin's directory (with its
dist-info), as an installed package would be, so this test process never sees it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tests" / "plugins" / "toy_service"
SPECOPS = [sys.executable, "-m", "specops.cli"]

RUNTIME = """
import json
from specops.runtime.nats_auth import service_permissions
from specops.runtime.supervisor import SERVICES, parse_replicas
from specops.runtime.topology import service_users

toy = {u.name: u for u in service_users()}["toy"]
perms = service_permissions(toy)
print(json.dumps({
    "start_order": list(SERVICES),
    "replicas": parse_replicas(["toy=2"]),
    "publish": perms.publish,
    "subscribe": perms.subscribe,
}))
"""


def run(args: list[str], tmp_path: Path, *, plugin: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SPECOPS_STATE_DIR=str(tmp_path))
    if plugin:
        env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_specops_serve_offers_and_runs_the_installed_service_and_only_then(tmp_path: Path) -> None:
    help_text = " ".join(run([*SPECOPS, "serve", "--help"], tmp_path).stdout.split())
    assert ",toy,gateway,engine}" in help_text
    assert "toy" not in run([*SPECOPS, "serve", "--help"], tmp_path, plugin=False).stdout
    served = run([*SPECOPS, "serve", "toy"], tmp_path)
    assert served.stdout.strip() == f"toy served, state dir {tmp_path}"


def test_specops_up_starts_it_before_the_gateway_and_its_nats_user_owns_its_consumer(tmp_path: Path) -> None:
    found = json.loads(run([sys.executable, "-c", RUNTIME], tmp_path).stdout)
    assert found["start_order"][-2:] == ["toy", "gateway"]
    assert found["replicas"]["toy"] == 2
    publish = found["publish"]
    assert "spec.run.*.running" in publish
    assert "$JS.API.CONSUMER.MSG.NEXT.SPEC.toy-noted" in publish
    assert [s for s in publish if s.startswith("$JS.API.CONSUMER.MSG.NEXT.")] == [
        "$JS.API.CONSUMER.MSG.NEXT.SPEC.toy-noted"
    ]
    assert found["subscribe"] == ["_INBOX.svc.toy.>"]
