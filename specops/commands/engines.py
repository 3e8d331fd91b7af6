"""`specops engines` and `specops engines install NAME`: which engines can be launched and
measured on this host, and the environments that make them so (specplatform.engines).

Wiring: `add_parsers(sub)` on the top-level subparsers; each parser sets `handler`.
"""

from __future__ import annotations

import argparse
import json
import subprocess

from speccore.errors import SpecError
from specops.commands.tables import table
from specplatform import engines


def add_parsers(sub: argparse._SubParsersAction) -> None:
    cmd = sub.add_parser(
        "engines",
        help="which engines run on this host (speccore always; vLLM where its environment is installed)",
    )
    cmd.add_argument("--json", action="store_true", help="print one JSON object")
    cmd.set_defaults(handler=run_list)
    cmd_sub = cmd.add_subparsers(dest="engines_command")
    install = cmd_sub.add_parser(
        "install", help="create an engine's own environment with its pinned packages (minutes)"
    )
    install.add_argument("name", choices=sorted(engines.ENVIRONMENTS))
    install.set_defaults(handler=run_install)


def report() -> list[dict[str, object]]:
    """One row per engine: speccore (this environment) and every installable one."""
    rows: list[dict[str, object]] = [
        {"engine": "speccore", "runnable": True, "reason": "in this environment (`specops serve engine`)"}
    ]
    for name in engines.ENVIRONMENTS:
        found = engines.state(name)
        row: dict[str, object] = {"engine": name, "runnable": found.runnable, "reason": found.reason}
        if found.install_command:
            row["install"] = found.install_command
        rows.append(row)
    rows.append(
        {
            "engine": "sglang",
            "runnable": False,
            "reason": "cannot serve on this CPU: sglang 0.5.23 installs (an 11 GB CUDA stack), but "
            "sgl-kernel on the package index has CUDA kernels only and its CPU backend needs "
            "sgl-kernel built from source. Its flags are checked against its pinned source",
        }
    )
    return rows


def run_list(args: argparse.Namespace) -> int:
    rows = report()
    if args.json:
        print(json.dumps({"engine_dir": str(engines.engine_root()), "engines": rows}))
        return 0
    print(f"engine environments: {engines.engine_root()}")
    lines = [
        (
            str(row["engine"]),
            "yes" if row["runnable"] else "no",
            f"{row['reason']}" + (f"  ->  {row['install']}" if "install" in row else ""),
        )
        for row in rows
    ]
    print(table(("engine", "runs", "why"), lines))
    return 0


def run_install(args: argparse.Namespace) -> int:
    try:
        found = engines.install(args.name)
    except subprocess.CalledProcessError as err:
        raise SpecError(f"installing {args.name} failed at `{' '.join(map(str, err.cmd))}`") from None
    print(f"{args.name}: {found.reason}")
    return 0
