"""Hugging Face `generate` on the same prompts: what users would otherwise reach for."""

from __future__ import annotations

from typing import Any

import torch

from speccore.errors import SpecError
from speccore.models import LoadedModel
from speccore.proposers.draft_model import resolve_draft
from speccore.sampling import SamplingParams

HF_METHODS = ("hf", "hf_prompt_lookup", "hf_assisted")
# Draft tokens per step when the user gives none.
HF_DEFAULT_K = {"hf_prompt_lookup": 10, "hf_assisted": 4}


class HFGenerator:
    """Runs one HF generation mode; returns new token ids without the EOS token."""

    def __init__(self, method: str, target: LoadedModel, k: int, draft: str | None) -> None:
        if method not in HF_METHODS:
            raise SpecError(f"unknown Hugging Face baseline '{method}'")
        self.target = target
        self.extra: dict[str, object] = {}
        if method == "hf_prompt_lookup":
            self.extra["prompt_lookup_num_tokens"] = k
        elif method == "hf_assisted":
            model, _ = resolve_draft(draft, target)
            self.extra["assistant_model"] = model
            self.extra["num_assistant_tokens"] = k
            self.extra["num_assistant_tokens_schedule"] = "constant"

    @torch.inference_mode()
    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams, seed: int
    ) -> list[int]:
        ids = torch.tensor([prompt_ids], device=self.target.device)
        kwargs: dict[str, object] = {"do_sample": not sampling.greedy}
        if not sampling.greedy:
            torch.manual_seed(seed)
            kwargs.update(
                temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or None
            )
        model: Any = self.target.model
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            eos_token_id=sorted(self.target.eos_token_ids),
            pad_token_id=min(self.target.eos_token_ids),
            **kwargs,
            **self.extra,
        )
        new = out[0, len(prompt_ids) :].tolist()
        for i, token in enumerate(new):
            if token in self.target.eos_token_ids:
                return new[:i]
        return new
