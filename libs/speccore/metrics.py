"""Per-generation speculative-decoding metrics (names are part of the CLI contract)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(slots=True)
class GenerationMetrics:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of them, taken from the prefix cache instead of prefilled
    new_tokens: int = 0
    verify_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    rollbacks: int = 0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    ttft_s: float = 0.0
    total_time_s: float = 0.0
    extra_memory_bytes: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)

    def record_step(self, drafted: int, draft_depth: int, accepted: int) -> None:
        """One verify step: `drafted` candidate nodes up to `draft_depth`, `accepted` kept."""
        self.verify_steps += 1
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        self.rollbacks += int(accepted < draft_depth)
        grow = draft_depth - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position.extend([0] * grow)
            self.accepted_per_position.extend([0] * grow)
        for pos in range(draft_depth):
            self.drafted_per_position[pos] += 1
            self.accepted_per_position[pos] += int(pos < accepted)

    def mark_emitted(self, elapsed_s: float, *, finished: bool) -> None:
        """Tokens reached the caller `elapsed_s` after the start: the first such time is the
        TTFT, the one that finishes the sequence its total time."""
        self.ttft_s = self.ttft_s or elapsed_s
        if finished:
            self.total_time_s = elapsed_s

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verify step, the recovered/bonus token included."""
        return (self.accepted_tokens + self.verify_steps) / self.verify_steps if self.verify_steps else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        pairs = zip(self.accepted_per_position, self.drafted_per_position, strict=True)
        return [a / d if d else 0.0 for a, d in pairs]

    @property
    def tpot_s(self) -> float:
        decode = self.total_time_s - self.ttft_s
        return decode / (self.new_tokens - 1) if self.new_tokens > 1 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_time_s if self.total_time_s > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out.update(
            acceptance_rate=self.acceptance_rate,
            mean_acceptance_length=self.mean_acceptance_length,
            per_position_acceptance=self.per_position_acceptance,
            tpot_s=self.tpot_s,
            tokens_per_s=self.tokens_per_s,
        )
        return out
