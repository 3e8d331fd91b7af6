"""One generation loop for every method: propose, verify, commit, repeat.

Plain autoregressive decoding is the method ``none``: the same loop with an
empty draft, so every speedup is measured against the same machinery.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from speccore import proposers
from speccore.errors import SpecError
from speccore.kv_cache import StaticKVCache
from speccore.metrics import GenerationMetrics
from speccore.models import LoadedModel
from speccore.proposers.base import DraftTree, Proposer, ProposerConfig, StepContext, StepOutcome
from speccore.runner import ModelRunner, pad_rows
from speccore.sampling import SamplingParams
from speccore.state import Sequence
from speccore.tree import ancestor_mask, block_parents, depths
from speccore.verify import verify_block

# Room for one verify block beyond prompt + new tokens.
BLOCK_HEADROOM = 128

TokenCallback = Callable[[int, list[int]], None]
# (row, [new tokens, vocab] target logits the verifier chose each new token from, in order);
# a row's last call may hold rows past its end (EOS, max tokens, stop string): cut to its output.
LogitsCallback = Callable[[int, torch.Tensor], None]


@dataclass(slots=True)
class Request:
    prompt_ids: list[int]
    max_new_tokens: int = 128
    sampling: SamplingParams = SamplingParams()
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(slots=True)
class _Run:
    """Everything one generate() call carries between steps."""

    seqs: list[Sequence]
    requests: list[Request]
    metrics: list[GenerationMetrics]
    cache: StaticKVCache
    sampling: SamplingParams
    start: float
    on_tokens: TokenCallback | None
    on_logits: LogitsCallback | None


@dataclass(slots=True)
class Generation:
    token_ids: list[int]
    text: str
    finish_reason: str
    metrics: GenerationMetrics


def build_proposer(method: str, target: LoadedModel, config: ProposerConfig) -> Proposer | None:
    if method == proposers.NONE:
        return None
    return proposers.make_proposer(method, config, target)


class Engine:
    def __init__(
        self,
        target: LoadedModel,
        method: str = "none",
        config: ProposerConfig | None = None,
        *,
        lossy_accept_threshold: float | None = None,
    ) -> None:
        if lossy_accept_threshold is not None and not 0.0 < lossy_accept_threshold <= 1.0:
            raise SpecError(f"lossy_accept_threshold must be in (0, 1], got {lossy_accept_threshold}")
        self.target = target
        self.method = method
        # Off unless asked for: accepting drafts the target would not emit is lossy (verify.py).
        self.lossy_accept_threshold = lossy_accept_threshold
        self.runner = ModelRunner(target.model)
        self.proposer = build_proposer(method, target, config or ProposerConfig())
        self.taps: tuple[int, ...] = ()
        if self.proposer is not None and self.proposer.needs_hidden_states:
            self.taps = self.proposer.feature_layers
            self.runner.check_taps(self.taps)

    @torch.inference_mode()
    def generate(
        self,
        requests: list[Request],
        on_tokens: TokenCallback | None = None,
        on_logits: LogitsCallback | None = None,
    ) -> list[Generation]:
        """Generate all requests as one padded batch; on_tokens(row, ids) streams new tokens.

        on_logits(row, logits) hands out the verify pass's target logits behind
        every emitted token (the quality gate compares them with plain decoding).
        """
        seqs = self._validate(requests)
        capacity = max(len(s.prompt_ids) for s in seqs) + max(s.max_new_tokens for s in seqs) + BLOCK_HEADROOM
        run = _Run(
            seqs=seqs,
            requests=requests,
            metrics=[GenerationMetrics(prompt_tokens=len(s.prompt_ids)) for s in seqs],
            cache=self.runner.new_cache(len(seqs), capacity),
            sampling=seqs[0].sampling,
            start=time.perf_counter(),
            on_tokens=on_tokens,
            on_logits=on_logits,
        )
        features = self._prefill(run)
        if self.proposer is not None:
            self.proposer.start(seqs, features)
        while not all(s.finished for s in seqs):
            self._step(run)

        extra = self.proposer.extra_memory_bytes() if self.proposer is not None else 0
        results = []
        for seq, m in zip(seqs, run.metrics, strict=True):
            m.new_tokens = len(seq.output_ids)
            m.extra_memory_bytes = extra
            text = str(self.target.tokenizer.decode(seq.output_ids, skip_special_tokens=True))
            results.append(Generation(seq.output_ids, text, seq.finish_reason or "length", m))
        return results

    def _validate(self, requests: list[Request]) -> list[Sequence]:
        if not requests:
            raise SpecError("no prompts to generate from")
        if len({r.sampling for r in requests}) != 1:
            raise SpecError("all requests of one batch must share sampling parameters")
        limit = self.target.max_context
        seqs = []
        for r in requests:
            if not r.prompt_ids:
                raise SpecError("the prompt is empty")
            if r.max_new_tokens <= 0:
                raise SpecError(f"max_new_tokens must be positive, got {r.max_new_tokens}")
            if len(r.prompt_ids) + r.max_new_tokens > limit:
                raise SpecError(
                    f"prompt of {len(r.prompt_ids)} tokens plus {r.max_new_tokens} new tokens exceeds "
                    f"the model's context of {limit} tokens"
                )
            gen = None
            if not r.sampling.greedy:
                gen = torch.Generator()
                gen.manual_seed(r.seed if r.seed is not None else int(torch.randint(0, 2**62, ()).item()))
            seqs.append(Sequence(list(r.prompt_ids), r.max_new_tokens, r.sampling, gen))
        return seqs

    def _prefill(self, run: _Run) -> torch.Tensor | None:
        """Commit every prompt token but the last, which is the first step's pending token.

        Returns the proposer's features of the committed tokens ([batch, n-1, F]) if it reads any.
        """
        tokens, counts = pad_rows([s.prompt_ids[:-1] for s in run.seqs])
        if int(counts.max()) == 0:
            return None
        _, features = self._forward(run.cache, tokens)
        run.cache.commit(counts)
        return features

    def _forward(
        self, cache: StaticKVCache, tokens: torch.Tensor, parents: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The target's final hidden states [batch, q, hidden], and the features the
        proposer reads ([batch, q, F], see Proposer.feature_layers) or None."""
        if self.proposer is None or not self.proposer.needs_hidden_states:
            return self.runner.forward(cache, tokens, parents), None
        hidden, tapped = self.runner.forward_tapped(cache, tokens, parents, taps=self.taps)
        return hidden, tapped if tapped is not None else hidden

    def _step(self, run: _Run) -> None:
        seqs, cache, metrics, sampling = run.seqs, run.cache, run.metrics, run.sampling
        batch = len(seqs)
        active = [not s.finished for s in seqs]
        t0 = time.perf_counter()
        ctx = StepContext(sampling, [s.generator for s in seqs])
        tree = self.proposer.propose(seqs, ctx) if self.proposer is not None else DraftTree.empty(batch)
        t1 = time.perf_counter()

        pending = torch.tensor([[s.pending] for s in seqs], dtype=torch.long)
        tokens = torch.cat([pending, tree.tokens], dim=1)  # [batch, q]
        parents = block_parents(tree.parents)
        acceptable = torch.cat([torch.zeros(batch, 1, dtype=torch.bool), tree.acceptable], dim=1)
        hidden, features = self._forward(cache, tokens, parents if tree.size else None)
        logits = self.runner.logits(hidden).cpu()  # [batch, q, vocab]
        verdict = verify_block(
            logits,
            tokens,
            parents,
            acceptable,
            sampling,
            ctx.generators,
            tree.draft_probs,
            active,
            self.lossy_accept_threshold,
        )
        cache.commit_paths(
            [path if act else [] for path, act in zip(verdict.accepted_nodes, active, strict=True)]
        )
        t2 = time.perf_counter()

        depth = (depths(ancestor_mask(parents)) * acceptable).max(1).values.tolist()
        drafted = acceptable.sum(1).tolist()
        tok_rows = tokens.tolist()
        for row, seq in enumerate(seqs):
            if not active[row]:
                continue
            path = verdict.accepted_nodes[row]
            m = metrics[row]
            m.record_step(drafted[row], depth[row], len(path) - 1)
            m.draft_time_s += t1 - t0
            m.verify_time_s += t2 - t1
            new = [tok_rows[row][node] for node in path[1:]] + [verdict.next_tokens[row]]
            if run.on_logits is not None:
                run.on_logits(row, logits[row, path])
            self._emit(row, seq, run.requests[row], new, run.on_tokens)
            now = time.perf_counter()
            m.ttft_s = m.ttft_s or now - run.start
            if seq.finished:
                m.total_time_s = now - run.start
        if self.proposer is not None:
            outcome = StepOutcome(
                tokens,
                logits,
                verdict.accepted_nodes,
                verdict.next_tokens,
                features,
            )
            self.proposer.observe(seqs, outcome)
            observe_time = time.perf_counter() - t2
            for row, act in enumerate(active):
                if act:
                    metrics[row].draft_time_s += observe_time

    def _emit(
        self, row: int, seq: Sequence, req: Request, new: list[int], on_tokens: TokenCallback | None
    ) -> None:
        """Append tokens to a sequence, stopping at EOS, max tokens or a stop string."""
        kept: list[int] = []
        for token in new:
            if token in self.target.eos_token_ids:
                seq.finished, seq.finish_reason = True, "stop"
                break
            kept.append(token)
            if len(seq.output_ids) + len(kept) >= seq.max_new_tokens:
                seq.finished, seq.finish_reason = True, "length"
                break
        seq.output_ids.extend(kept)
        if req.stop and kept:
            kept = self._cut_at_stop(seq, req.stop, len(kept))
        if on_tokens is not None and kept:
            on_tokens(row, kept)

    def _cut_at_stop(self, seq: Sequence, stops: tuple[str, ...], n_new: int) -> list[int]:
        """Stop before the token that completes a stop string; return the new tokens still kept."""
        decode = self.target.tokenizer.decode
        start = len(seq.output_ids) - n_new
        for end in range(start + 1, len(seq.output_ids) + 1):
            text = decode(seq.output_ids[:end], skip_special_tokens=True)
            if any(s in text for s in stops):
                del seq.output_ids[end - 1 :]
                seq.finished, seq.finish_reason = True, "stop"
                return seq.output_ids[start:]
        return seq.output_ids[start:]
