"""`specops up`, `specops down`, `specops status`: the local runtime (specops.runtime.supervisor).

Wiring: `add_parsers(sub)` on the top-level subparsers; each parser sets `handler`,
a function of the parsed args returning the exit code. Failures raise SpecError,
which the CLI prints as one line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from specops.commands.tables import table

if TYPE_CHECKING:
    from specops.runtime.supervisor import RuntimeStatus


def add_parsers(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="start NATS, PostgreSQL and the services (idempotent)")
    up.add_argument(
        "--replicas",
        action="extend",
        nargs="+",
        default=[],
        metavar="SERVICE=N[,SERVICE=N...]",
        help="replicas per service, e.g. `--replicas predictor=2,benchmark-runner=2 gateway=2` "
        "(default 1 each; 0 leaves a service out); gateway replicas share its port",
    )
    up.add_argument("--json", action="store_true", help="print the resulting status as JSON")
    up.set_defaults(handler=run_up)

    down = sub.add_parser("down", help="stop the services, then NATS and PostgreSQL")
    down.set_defaults(handler=run_down)

    status = sub.add_parser(
        "status",
        help="servers, service replicas (alive, and healthy by their /healthz), the watcher and "
        "recent restarts; exit 1 if anything is dead or unhealthy",
    )
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.set_defaults(handler=run_status)


def _progress(message: str) -> None:
    print(f"specops: {message}", file=sys.stderr, flush=True)


def run_up(args: argparse.Namespace) -> int:
    from specops.runtime.supervisor import parse_replicas, up
    from specplatform.settings import Settings

    # Environment only: runtime.env is what `up` writes, not what it reads.
    result = up(Settings(), parse_replicas(args.replicas), progress=_progress)
    _print(result, as_json=args.json)
    # Replicas just started are not healthy yet (loading models, connecting): alive is the test.
    return _exit_code(result, health=False)


def run_down(args: argparse.Namespace) -> int:
    from specops.runtime.supervisor import down
    from specplatform.settings import Settings

    down(Settings(), progress=_progress)
    _progress("stopped")
    return 0


def run_status(args: argparse.Namespace) -> int:
    from specops.runtime.supervisor import status
    from specplatform.settings import Settings

    result = status(Settings())
    _print(result, as_json=args.json)
    return _exit_code(result, health=True)


def _exit_code(result: RuntimeStatus, *, health: bool) -> int:
    problems = result.problems(health=health)
    for problem in problems:
        _progress(problem)
    return 1 if problems else 0


def _print(result: RuntimeStatus, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.to_dict()))
        return
    print(f"state dir  {result.state_dir}")
    if not result.servers and not result.processes:
        print("nothing running (start with `specops up`)")
        return
    print(f"gateway    {result.gateway_url}")
    rows: list[tuple[str, str, str]] = []
    for server in result.servers:
        state = "external" if server.alive is None else ("up" if server.alive else "DEAD")
        extra = f"  pid {server.pid}" if server.pid is not None else ""
        if server.monitor_url:
            extra += f"  monitor {server.monitor_url}"
        rows.append((server.name, state, f"{server.url}{extra}"))
    for proc in result.processes:
        name = f"{proc.service}[{proc.replica}]"
        state = "DEAD" if not proc.alive else ("UNHEALTHY" if proc.healthy is False else "up")
        rows.append((name, state, f"pid {proc.pid}  log {proc.log}"))
        if proc.alive and proc.health is not None:
            rows.append(("", "", f"health: {proc.health}"))
        if proc.metrics_url is not None:
            rows.append(("", "", f"metrics {proc.metrics_url}"))
    if result.watcher is not None:
        watcher = result.watcher
        state = "up" if watcher.alive else "DEAD"
        rows.append(("watcher", state, f"pid {watcher.pid}  log {watcher.log}"))
    print(table(("process", "state", "where"), rows))
    for restart in result.restarts:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(restart.at))
        outcome = f"new pid {restart.pid}" if restart.pid is not None else f"FAILED: {restart.error}"
        print(f"restart  {when}  {restart.component}: {restart.reason}; {outcome}")
