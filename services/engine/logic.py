"""Pure decisions of the engine server: OpenAI parameters as speccore requests, and the
spec-decode counts one batcher update adds to a request's.

Spec-decode counts follow vLLM's `spec_decode_*` counters: a *draft* is one row-step that
drafted at least one token; *draft tokens* are the nodes verified; *accepted per
position i* counts the steps whose accepted length exceeds i.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speccore.engine import Request
from speccore.metrics import GenerationMetrics
from speccore.sampling import SamplingParams

# More characters per token than any tokenizer averages over a whole prompt (English text takes
# about 4; code tokenizers fold a run of up to 16-32 spaces into one token, but no prompt is
# all such runs): a prompt longer than the context times this cannot fit, so it is refused
# without tokenizing it (a 50 MB prompt once took 53 s to tokenize only to be refused).
MAX_CHARS_PER_TOKEN = 32


def prompt_chars_limit(max_context: int) -> int:
    """The most characters a prompt for a ``max_context``-token context may have."""
    return max_context * MAX_CHARS_PER_TOKEN


@dataclass(slots=True)
class SpecCounts:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    @classmethod
    def of_step(cls, drafted: int, accepted: int) -> SpecCounts:
        """One row-step that verified ``drafted`` draft nodes and accepted ``accepted`` of them."""
        return cls(int(drafted > 0), drafted, accepted, [1] * accepted)

    @classmethod
    def of_generation(cls, m: GenerationMetrics) -> SpecCounts:
        """A whole generation's counts, from the engine's own metrics."""
        drafts = m.drafted_per_position[0] if m.drafted_per_position else 0
        return cls(drafts, m.drafted_tokens, m.accepted_tokens, list(m.accepted_per_position))

    def add(self, other: SpecCounts) -> None:
        self.drafts += other.drafts
        self.draft_tokens += other.draft_tokens
        self.accepted += other.accepted
        grow = len(other.accepted_per_pos) - len(self.accepted_per_pos)
        self.accepted_per_pos.extend([0] * max(grow, 0))
        for pos, n in enumerate(other.accepted_per_pos):
            self.accepted_per_pos[pos] += n

    def minus(self, other: SpecCounts) -> SpecCounts:
        per_pos = list(self.accepted_per_pos)
        for pos, n in enumerate(other.accepted_per_pos):
            per_pos[pos] -= n
        return SpecCounts(
            self.drafts - other.drafts,
            self.draft_tokens - other.draft_tokens,
            self.accepted - other.accepted,
            per_pos,
        )


def update_counts(
    counted: SpecCounts, *, drafted: int, accepted: int, finished_with: GenerationMetrics | None
) -> SpecCounts:
    """What one update adds to a request's spec-decode counts (``counted``: those so far).

    An update is one step of the row (``drafted``, ``accepted``), except the one that
    finishes it, which carries the whole generation's metrics: its share is those minus
    what earlier updates counted. A batcher that steps rows one verify step at a time and
    one that delivers a row's whole output in its finishing update are both counted exactly.
    """
    if finished_with is not None:
        return SpecCounts.of_generation(finished_with).minus(counted)
    return SpecCounts.of_step(drafted, accepted)


def choice_requests(
    prompt_ids: list[int],
    *,
    n: int,
    max_tokens: int,
    sampling: SamplingParams,
    seed: int | None,
    stop: tuple[str, ...],
    stop_token_ids: tuple[int, ...] = (),
    ignore_eos: bool = False,
    min_tokens: int = 0,
    draft_scope: str | None = None,
) -> list[Request]:
    """One speccore request per choice; with a seed, choice i samples with seed + i (as vLLM's n).
    ``draft_scope``: the cross-request draft pool's scope they read and feed (None: none)."""
    return [
        Request(
            prompt_ids=list(prompt_ids),
            max_new_tokens=max_tokens,
            sampling=sampling,
            seed=seed + i if seed is not None else None,
            stop=stop,
            stop_token_ids=stop_token_ids,
            ignore_eos=ignore_eos,
            min_tokens=min_tokens,
            draft_scope=draft_scope,
        )
        for i in range(n)
    ]


def token_limit(asked: int | None, prompt_tokens: int, context: int) -> int:
    """max_tokens as asked, else what the context leaves after the prompt (vLLM's default)."""
    return asked if asked is not None else max(context - prompt_tokens, 1)
