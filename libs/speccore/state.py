"""The per-request state passed between the engine, the verifier and proposers."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from speccore.sampling import SamplingParams


@dataclass(slots=True)
class Sequence:
    """One request being generated.

    The last token of ``token_ids`` is the pending token: the prompt's last token
    before the first step, then the last emitted token. It is not yet in the
    target's cache; everything before it is committed.
    """

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    generator: torch.Generator | None = None
    draft_scope: str | None = None  # the scope of its draft pool and prefix cache (Request's)
    output_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def pending(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.output_ids)
