"""Training examples from the packaged ShareGPT conversations (the heads' data, `specops heads data`)."""

from __future__ import annotations

from speccore.training.data import Example, first_exchanges
from specprompts.sources import sharegpt_conversations


def sharegpt_examples(
    limit: int | None, seed: int = 0, *, exclude_ids: frozenset[str] = frozenset()
) -> list[Example]:
    """Up to ``limit`` ShareGPT first exchanges, chosen by seed (see ``first_exchanges``)."""
    return first_exchanges(sharegpt_conversations(exclude_ids=exclude_ids), limit, seed)
