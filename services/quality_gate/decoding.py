"""What every gate method decodes with: the candidate's engine, the target alone, teacher forcing.

The reference is always the target decoding on its own (speccore's method
``none``, one token per forward pass); a :class:`Reference` remembers its outputs
so every candidate of a plan is compared with the same baseline, computed once.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass

import torch

from speccore.candidates import speccore_candidate
from speccore.engine import BLOCK_HEADROOM, Engine, Generation, LogitsCallback, Request
from speccore.errors import SpecError
from speccore.models import LoadedModel
from speccore.runner import ModelRunner, pad_rows
from speccore.sampling import SamplingParams
from speccore.tracing import traced_generate
from specops_schemas.candidates import Candidate
from specops_services.quality_gate.sample import GateSample
from specprompts.sets import ConstraintTask, constraint_tasks, load_prompts

# Candidate.options key of speccore's lossy acceptance rule (verify.py); never set by the catalog.
LOSSY_OPTION = "lossy_accept_threshold"


@dataclass(frozen=True, slots=True)
class GatePrompt:
    id: str  # speccore prompt id, e.g. "mtbench:81", or the caller's own for prompts given directly
    token_ids: list[int]


def build_engine(target: LoadedModel, candidate: Candidate) -> Engine:
    """The speccore engine a candidate describes (speccore.candidates),
    with speccore's lossy acceptance rule when the candidate's options ask for it."""
    options = dict(candidate.options)
    lossy = options.pop(LOSSY_OPTION, None)
    if lossy is not None and (isinstance(lossy, bool) or not isinstance(lossy, int | float)):
        raise SpecError(f"option {LOSSY_OPTION} must be a number in (0, 1], got {lossy!r}")
    spec = speccore_candidate(candidate.model_copy(update={"options": options}))
    threshold = float(lossy) if lossy is not None else None
    return Engine(target, spec.family, spec.config, lossy_accept_threshold=threshold)


class Reference:
    """One target, one gate sample: prompts, batched decoding and the target's own outputs."""

    def __init__(
        self,
        target: LoadedModel,
        sample: GateSample,
        prompts: Sequence[GatePrompt] | None = None,
        tasks: Sequence[ConstraintTask] | None = None,
    ) -> None:
        self.target = target
        self.sample = sample
        self.plain = Engine(target, "none")
        self._runner = ModelRunner(target.model)
        self._prompts = list(prompts) if prompts is not None else None
        self._tasks = list(tasks) if tasks is not None else None
        self._baselines: dict[Hashable, list[Generation]] = {}

    def prompts(self) -> list[GatePrompt]:
        """The gate's prompts: given ones, or the sample's workload set, seeded."""
        if self._prompts is None:
            picked = load_prompts(self.sample.workload, self.sample.n_prompts, self.sample.seed)
            self._prompts = [GatePrompt(p.id, self.target.encode_prompt(p.text, p.chat)) for p in picked]
        return self._prompts

    def tasks(self) -> list[ConstraintTask]:
        """constraint_violation's tasks: given ones, or the sample's workload's, seeded
        (specprompts.sets.constraint_tasks: the agentic set's own tool calls for ``agentic``,
        function stubs whose completions must parse for ``code``, JSON-Schema tasks otherwise)."""
        if self._tasks is None:
            self._tasks = constraint_tasks(
                self.sample.workload, self.sample.structured_tasks, self.sample.seed
            )
        return self._tasks

    def baseline(
        self, key: Hashable, prompts: Sequence[list[int]], max_new_tokens: int, sampling: SamplingParams
    ) -> list[Generation]:
        """The target's own generations for a prompt set named ``key``, decoded once."""
        memo_key = (key, max_new_tokens, sampling)
        if memo_key not in self._baselines:
            self._baselines[memo_key] = self.generate(self.plain, prompts, max_new_tokens, sampling)
        return self._baselines[memo_key]

    def generate(
        self,
        engine: Engine,
        prompts: Sequence[list[int]],
        max_new_tokens: int,
        sampling: SamplingParams,
        on_logits: LogitsCallback | None = None,
        first: int = 0,
    ) -> list[Generation]:
        """Generate in batches of ``sample.batch_size``; prompt i is seeded ``seed + first + i``.

        on_logits receives indices into ``prompts``.
        """
        out: list[Generation] = []
        size = self.sample.batch_size
        for start in range(0, len(prompts), size):
            requests = [
                Request(ids, max_new_tokens, sampling, seed=self.sample.seed + first + start + i)
                for i, ids in enumerate(prompts[start : start + size])
            ]
            hook = _shifted(on_logits, start) if on_logits is not None else None
            out += traced_generate(engine, requests, on_logits=hook)
        return out

    def plain_logits(
        self, prompts: Sequence[list[int]], outputs: Sequence[list[int]], max_new_tokens: int
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """(i, [len(outputs[i]), vocab]) logits of the target decoding one token at a time.

        Teacher forcing: row j holds the target's logits for the token at output
        position j given the prompt and ``outputs[i][:j]``, computed exactly as
        plain decoding computes them (same batches, same cache size, prompt
        prefill, then one token per pass), so a lossless engine matches them bit
        for bit on CPU (speccore.cpu_kernels).
        """
        size = self.sample.batch_size
        for start in range(0, len(prompts), size):
            rows = list(prompts[start : start + size])
            outs = list(outputs[start : start + size])
            steps = max((len(o) for o in outs), default=0)
            if steps == 0:
                for i in range(len(rows)):
                    yield start + i, torch.empty(0, 0)
                continue
            capacity = max(len(p) for p in rows) + max_new_tokens + BLOCK_HEADROOM
            cache = self._runner.new_cache(len(rows), capacity)
            tokens, counts = pad_rows([p[:-1] for p in rows])
            if int(counts.max()) > 0:
                self._runner.forward(cache, tokens)
                cache.commit(counts)
            pending = [p[-1] for p in rows]
            per_step: list[torch.Tensor] = []
            for step in range(steps):
                hidden = self._runner.forward(cache, torch.tensor(pending)[:, None])
                cache.commit(torch.ones(len(rows), dtype=torch.long))
                per_step.append(self._runner.logits(hidden[:, 0]).cpu())  # [batch, vocab]
                pending = [o[step] if step < len(o) else 0 for o in outs]
            stacked = torch.stack(per_step, 1)  # [batch, steps, vocab]
            for i, o in enumerate(outs):
                yield start + i, stacked[i, : len(o)]


def describe(sampling: SamplingParams) -> str:
    """How a method decoded, for its outcome's details."""
    if sampling.greedy:
        return "greedy"
    return f"temperature={sampling.temperature} top_k={sampling.top_k} top_p={sampling.top_p}"


def _shifted(on_logits: LogitsCallback, offset: int) -> LogitsCallback:
    def hook(row: int, logits: torch.Tensor) -> None:
        on_logits(offset + row, logits)

    return hook
