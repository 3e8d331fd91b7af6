"""The per-request state passed between the engine, the verifier and proposers."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from speccore.sampling import SamplingParams


@dataclass(slots=True)
class Sequence:
    """One request being generated.

    ``output_ids[-1]`` is the pending token: sampled, emitted, but not yet fed to
    the target, so its key/value is not in the cache. Everything before it is
    committed.
    """

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.output_ids)
