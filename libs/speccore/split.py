"""The split of prompts into a training side and a held-out side, by hash.

``specops heads data`` keeps a prompt out of a head's training data when its hash falls in
the held-out share (:mod:`speccore.training`); specprompts draws its ShareGPT measurement
prompts from that share only, so no head trained by that command — the shipped ones
included — has seen them, or the target's replies to them. Hashing only: light to import.
"""

from __future__ import annotations

import hashlib

from speccore.errors import SpecError

HELDOUT_FRACTION = 0.05  # the held-out share `specops heads data` keeps by default


def is_heldout(prompt: str, fraction: float = HELDOUT_FRACTION) -> bool:
    """Whether ``prompt`` belongs to the held-out side of a split keeping ``fraction`` out
    (whitespace-insensitive)."""
    check_fraction(fraction)
    return int.from_bytes(prompt_digest(prompt)[:8]) < fraction * 2**64


def check_fraction(fraction: float) -> None:
    if not 0.0 < fraction < 1.0:
        raise SpecError(f"held-out fraction must be between 0 and 1, got {fraction}")


def prompt_digest(prompt: str) -> bytes:
    return digest(" ".join(prompt.split()))


def digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()[:16]
