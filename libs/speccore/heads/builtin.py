"""Heads speccore ships for its offline models, trained by ``specops heads train`` and
committed with their provenance under ``pretrained/<model alias>/<name>/``.

A candidate names one as ``builtin:<name>`` (``builtin:medusa``, ``builtin:eagle``);
the predictor offers them for the model they were trained for. Light on purpose: the
predictor reads these configs without loading torch models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speccore.errors import SpecError

BUILTIN_HEAD_PREFIX = "builtin:"
PRETRAINED = Path(__file__).parent / "pretrained"
# Held-out chain depth of EAGLE heads whose config does not record it (training.eagle's eval_steps).
EVAL_DEPTH = 5


@dataclass(frozen=True, slots=True)
class BuiltinHead:
    head_id: str  # builtin:<name>
    path: Path
    family: str  # medusa, eagle or eagle3 (the artifact's family)
    num_heads: int  # Medusa heads; for EAGLE the draft depth its curve was measured at
    acceptance: float | None  # per-token chain acceptance on the held-out set, last epoch


def builtin_heads(model_ref: str) -> list[BuiltinHead]:
    """The heads shipped for ``model_ref`` (an offline alias), in name order."""
    root = PRETRAINED / model_ref
    if not root.is_dir() or model_ref != root.name:
        return []
    heads = []
    for path in sorted(p for p in root.iterdir() if (p / "config.json").is_file()):
        config = json.loads((path / "config.json").read_text())
        heads.append(
            BuiltinHead(
                head_id=f"{BUILTIN_HEAD_PREFIX}{path.name}",
                path=path,
                family=str(config["family"]),
                num_heads=_chain_depth(config),
                acceptance=_chain_acceptance(config),
            )
        )
    return heads


def builtin_head(model_ref: str, name: str) -> Path:
    """The directory of built-in head ``name`` for ``model_ref``; SpecError if none."""
    heads = {h.head_id.removeprefix(BUILTIN_HEAD_PREFIX): h for h in builtin_heads(model_ref)}
    if name not in heads:
        shipped = ", ".join(f"{BUILTIN_HEAD_PREFIX}{n}" for n in heads) or "none"
        raise SpecError(f"no built-in head '{name}' for {model_ref} (shipped: {shipped})")
    return heads[name].path


def _chain_depth(config: dict[str, Any]) -> int:
    """Depth of the held-out chain the head was measured on: one per Medusa head; EAGLE
    heads unroll EVAL_DEPTH steps (speccore.training.eagle's default) unless recorded."""
    curve = config.get("provenance", {}).get("curve") or [{}]
    recorded = (curve[-1].get("heldout") or {}).get("chain_depth")
    if recorded:
        return int(recorded)
    return int(config["num_heads"]) if config["family"] == "medusa" else EVAL_DEPTH


def _chain_acceptance(config: dict[str, Any]) -> float | None:
    """Per-token acceptance a whose chain E[N] = (1 - a^(d+1)) / (1 - a) matches the last
    held-out chain mean acceptance length, d the chain's depth."""
    curve = config.get("provenance", {}).get("curve") or []
    mal = (curve[-1].get("heldout") or {}).get("chain_mean_acceptance_length") if curve else None
    if mal is None:
        return None
    depth = _chain_depth(config)
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (1 - mid ** (depth + 1)) / (1 - mid) < mal else (lo, mid)
    return round((lo + hi) / 2, 4)
