"""The new-run page's guess from pasted sample prompts: the paste split into prompts and
answered as speccatalog.fingerprint infers it (the wizard's questions come from there too)."""

from __future__ import annotations

import re
from typing import Any

from speccatalog.fingerprint import infer


def split_prompts(text: str) -> list[str]:
    """Sample prompts pasted one per blank-line-separated block."""
    return [block.strip() for block in re.split(r"\n\s*\n", text) if block.strip()]


def inferred(pasted: str) -> dict[str, Any] | None:
    """What the page shows of pasted prompts: the fingerprint, its confidence, the runner-up and
    how many prompts each workload won; None without a prompt."""
    inference = infer(split_prompts(pasted))
    if inference is None:
        return None
    return {
        "fingerprint": inference.fingerprint,
        "confidence": round(inference.confidence, 3),
        "runner_up": inference.runner_up,
        "votes": inference.votes,
    }
