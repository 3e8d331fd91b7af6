"""The architecture contracts of pyproject.toml ([tool.importlinter]) hold: libraries at the
bottom, then the wire contract, then services that never import each other, then the CLI
and SDK; no import cycles inside any package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


RESOURCES = ("runs", "tune", "heads", "security", "datastores", "console")


def test_the_gateway_is_cut_by_resource() -> None:
    """Each resource is a package of the gateway; no module at its top level belongs to one by name."""
    gateway = ROOT / "services" / "gateway"
    prefixed = sorted(
        p.name for p in gateway.glob("*.py") if any(p.stem.startswith(f"{r}_") for r in RESOURCES)
    )
    assert prefixed == []
    assert all((gateway / resource / "__init__.py").is_file() for resource in (*RESOURCES, "http"))
