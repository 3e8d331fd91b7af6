"""One generation loop for every method: propose, verify, commit, repeat.

Plain autoregressive decoding is the method ``none``: the same loop with an
empty draft, so every speedup is measured against the same machinery.

Glossary (one step of a padded batch; block, accepted, recovered and bonus
tokens as in verify.py):
- active row: a row not finished before the step. Finished rows ride along in
  the batch, but nothing of theirs is accepted, committed, counted or emitted.
- new tokens: a row's accepted draft tokens, then its recovered or bonus token.
- kept tokens: the new tokens a row keeps, cut at EOS, max tokens or a stop
  string; they go to ``on_tokens``.
- draft time: propose, plus observe and the bookkeeping before it; verify time:
  building the block, the target's forward pass over it, the verifier and the
  KV commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from speccore import proposers
from speccore.adaptive import AdaptiveK
from speccore.draft_pool import DraftPools
from speccore.errors import SpecError
from speccore.kv_cache import StaticKVCache
from speccore.metrics import GenerationMetrics
from speccore.models import LoadedModel
from speccore.prefix_cache import Prefix, PrefixCache, Reuse
from speccore.proposers.base import DraftTree, Proposer, ProposerConfig, StepContext, StepOutcome
from speccore.runner import ModelRunner, pad_rows
from speccore.sampling import SamplingParams, ban_early_stops
from speccore.state import Sequence
from speccore.tree import ancestor_mask, block_parents, depths
from speccore.verify import Block, Verdict, verify_block

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

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
    # Tokens that end the output (not kept) besides EOS; ignore_eos: EOS does not end it.
    # Both only decide where the output ends, never which tokens are drawn.
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # vLLM's: the first min_tokens new tokens are drawn with every stopping token masked, and
    # no stop string ends the output before them.
    min_tokens: int = 0
    # The scope of the cross-request state it reads and feeds (None: none): the draft pool
    # (speccore.draft_pool) it drafts from and, once finished, feeds, and the prefix cache
    # (speccore.prefix_cache) its prompt reuses and joins; each where the engine has one.
    draft_scope: str | None = None


@dataclass(slots=True)
class Batch:
    """The rows one loop steps together, and what it carries between steps: one
    generate() call, or a batch that rows join and leave (speccore.batching)."""

    seqs: list[Sequence]
    requests: list[Request]
    metrics: list[GenerationMetrics]
    cache: StaticKVCache
    sampling: SamplingParams
    starts: list[float]  # per row: when it started (perf_counter); emission times count from it
    on_tokens: TokenCallback | None
    on_logits: LogitsCallback | None = None
    draft_cap: int | None = None  # the cap adaptive k chose for the last step (None: not adaptive)


@dataclass(slots=True)
class Verified:
    """One step's block after the target has scored it and the verifier has ruled."""

    block: Block
    logits: torch.Tensor  # [batch, q, vocab] target logits at every block node, on the CPU
    features: torch.Tensor | None  # [batch, q, F] what the proposer reads at every block node, or None
    verdict: Verdict
    active: list[bool]  # per row: not finished before the step

    def committed_paths(self) -> list[list[int]]:
        """The block nodes each row keeps in the KV cache: its accepted path, or none if inactive."""
        return [
            path if act else [] for path, act in zip(self.verdict.accepted_nodes, self.active, strict=True)
        ]


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
        adaptive: bool = False,
        draft_pools: DraftPools[Any] | None = None,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        """``adaptive``: choose each step's draft size from the batch and the measured
        acceptance (speccore.adaptive) instead of always drafting the configured size.
        ``draft_pools``: cross-request pools the proposer drafts from and finished requests
        feed, per ``Request.draft_scope`` (families that read them: ngram, suffix); the engine
        binds them to its proposer's kind of pool.
        ``prefix_cache``: prompts' keys and values (and features) kept per scope, which later
        prompts of the scope that start alike reuse instead of prefilling (speccore.prefix_cache)."""
        if lossy_accept_threshold is not None and not 0.0 < lossy_accept_threshold <= 1.0:
            raise SpecError(f"lossy_accept_threshold must be in (0, 1], got {lossy_accept_threshold}")
        self.target = target
        self.method = method
        # Off unless asked for: accepting drafts the target would not emit is lossy (verify.py).
        self.lossy_accept_threshold = lossy_accept_threshold
        self.config = config or ProposerConfig()
        self.runner = ModelRunner(target.model)
        self.proposer = build_proposer(method, target, self.config)
        self.taps: tuple[int, ...] = ()
        if self.proposer is not None and self.proposer.needs_hidden_states:
            self.taps = self.proposer.feature_layers
            self.runner.check_taps(self.taps)
        self.adaptive: AdaptiveK | None = None
        if adaptive and self.proposer is not None:
            if not self.proposer.adapts_draft:
                raise SpecError(f"adaptive k does not apply to {method}: its draft size is fixed")
            self.adaptive = AdaptiveK(k_max=self.proposer.draft_nodes)
        self.prefix_cache = prefix_cache
        self.draft_pools = draft_pools
        if draft_pools is not None:
            if self.proposer is None or not self.proposer.reads_draft_pools:
                raise SpecError(f"{method} does not draft from a cross-request pool (ngram and suffix do)")
            draft_pools.bind(method, self.proposer.new_draft_pool)
            self.proposer.draft_pools = draft_pools

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
        run = self.open_batch(requests, on_tokens, on_logits)
        while not all(s.finished for s in run.seqs):
            self.step(run)
        return [self.result(run, row) for row in range(len(run.seqs))]

    @torch.inference_mode()
    def open_batch(
        self,
        requests: list[Request],
        on_tokens: TokenCallback | None = None,
        on_logits: LogitsCallback | None = None,
    ) -> Batch:
        """Check the requests, prefill their prompts in a new cache and start the proposer on them."""
        seqs = self.sequences(requests)
        capacity = max(len(s.prompt_ids) for s in seqs) + max(s.max_new_tokens for s in seqs) + BLOCK_HEADROOM
        now = time.perf_counter()
        run = Batch(
            seqs=seqs,
            requests=list(requests),
            metrics=[GenerationMetrics(prompt_tokens=len(s.prompt_ids)) for s in seqs],
            cache=self.runner.new_cache(len(seqs), capacity),
            sampling=seqs[0].sampling,
            starts=[now] * len(seqs),
            on_tokens=on_tokens,
            on_logits=on_logits,
        )
        features = self._prefill(run)
        if self.proposer is not None:
            self.proposer.start(seqs, features)
        return run

    def result(self, run: Batch, row: int) -> Generation:
        """A row's output and metrics (final once the row has finished)."""
        seq, m = run.seqs[row], run.metrics[row]
        m.new_tokens = len(seq.output_ids)
        m.extra_memory_bytes = self.proposer.extra_memory_bytes() if self.proposer is not None else 0
        return Generation(
            token_ids=seq.output_ids,
            text=str(self.target.tokenizer.decode(seq.output_ids, skip_special_tokens=True)),
            finish_reason=seq.finish_reason or "length",
            metrics=m,
        )

    def sequences(self, requests: list[Request]) -> list[Sequence]:
        """Each request checked and turned into a sequence with its own generator; one sampling setting."""
        if not requests:
            raise SpecError("no prompts to generate from")
        if len({r.sampling for r in requests}) != 1:
            raise SpecError("all requests of one batch must share sampling parameters")
        seqs = []
        for r in requests:
            self.check_request(r)
            gen = None
            if not r.sampling.greedy:
                gen = torch.Generator()
                gen.manual_seed(r.seed if r.seed is not None else int(torch.randint(0, 2**62, ()).item()))
            seqs.append(
                Sequence(
                    prompt_ids=list(r.prompt_ids),
                    max_new_tokens=r.max_new_tokens,
                    sampling=r.sampling,
                    generator=gen,
                    draft_scope=r.draft_scope,
                )
            )
        return seqs

    def check_request(self, r: Request) -> None:
        """Raise SpecError if the request can never run: empty prompt, no new tokens, too long."""
        limit = self.target.max_context
        if not r.prompt_ids:
            raise SpecError("the prompt is empty")
        if r.max_new_tokens <= 0:
            raise SpecError(f"max_new_tokens must be positive, got {r.max_new_tokens}")
        if len(r.prompt_ids) + r.max_new_tokens > limit:
            raise SpecError(
                f"prompt of {len(r.prompt_ids)} tokens plus {r.max_new_tokens} new tokens exceeds "
                f"the model's context of {limit} tokens"
            )

    def _prefill(self, run: Batch) -> torch.Tensor | None:
        """Commit every prompt token but the last, which is the first step's pending token:
        a row's longest prefix the prefix cache holds is copied, the rest goes through the target.

        Returns the proposer's features of the committed tokens ([batch, n-1, F]) if it reads any.
        """
        rows = [s.prompt_ids[:-1] for s in run.seqs]
        reused = self._reuse_prefixes(run, rows)
        starts = [r.length if r is not None else 0 for r in reused]
        for m, start in zip(run.metrics, starts, strict=True):
            m.cached_prompt_tokens = start
        tokens, counts = pad_rows([row[start:] for row, start in zip(rows, starts, strict=True)])
        features = None
        if int(counts.max()) > 0:
            _, features = self._forward(run.cache, tokens)
            run.cache.commit(counts)
        if any(starts) and self._reads_features:
            features = joined_features(reused, features, counts)
        self._keep_prefixes(run, rows, starts, features)
        return features

    def _reuse_prefixes(self, run: Batch, rows: list[list[int]]) -> list[Reuse | None]:
        """Per row, the prefix its scope's cache holds (copied into the row's cache), or None."""
        reused: list[Reuse | None] = [None] * len(rows)
        if self.prefix_cache is None:
            return reused
        for b, (seq, row) in enumerate(zip(run.seqs, rows, strict=True)):
            if seq.draft_scope is None:
                continue
            found = self.prefix_cache.lookup(seq.draft_scope, row)
            if found is not None:
                keys = [k[:, : found.length] for k in found.prefix.keys]
                run.cache.write_prefix(b, keys, [v[:, : found.length] for v in found.prefix.values])
                reused[b] = found
        return reused

    def _keep_prefixes(
        self, run: Batch, rows: list[list[int]], starts: list[int], features: torch.Tensor | None
    ) -> None:
        """Hand each prefilled prompt of a scope to the prefix cache (unless it was all reused)."""
        if self.prefix_cache is None:
            return
        for b, (seq, row, start) in enumerate(zip(run.seqs, rows, starts, strict=True)):
            if seq.draft_scope is None or start == len(row) or len(row) < self.prefix_cache.min_tokens:
                continue
            keys, values = run.cache.read_prefix(b, len(row))
            feats = features[b, : len(row)].clone() if features is not None else None
            self.prefix_cache.add(seq.draft_scope, Prefix(tuple(row), keys, values, feats))

    @property
    def _reads_features(self) -> bool:
        return self.proposer is not None and self.proposer.needs_hidden_states

    def _forward(
        self, cache: StaticKVCache, tokens: torch.Tensor, parents: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The target's final hidden states [batch, q, hidden], and the features the
        proposer reads ([batch, q, F], see Proposer.feature_layers) or None."""
        if not self._reads_features:
            return self.runner.forward(cache, tokens, parents), None
        hidden, tapped = self.runner.forward_tapped(cache, tokens, parents, taps=self.taps)
        return hidden, tapped if tapped is not None else hidden

    @torch.inference_mode()
    def step(self, run: Batch) -> None:
        """propose -> verify -> commit, then count, emit and let the proposer observe."""
        with self.runner.small_ops(len(run.seqs)):
            self._step(run)

    def _step(self, run: Batch) -> None:
        active = [not s.finished for s in run.seqs]
        t0 = time.perf_counter()
        cap = self.adaptive.choose(len(run.seqs), sum(active)) if self.adaptive is not None else None
        run.draft_cap = cap
        ctx = StepContext(sampling=run.sampling, generators=[s.generator for s in run.seqs], max_draft=cap)
        tree = self._propose(run.seqs, ctx)
        t1 = time.perf_counter()
        step = self._verify(run.cache, block_of(run.seqs, tree), ctx, active, self._early_stops(run))
        run.cache.commit_paths(step.committed_paths())
        t2 = time.perf_counter()

        record_step(run.metrics, step, draft_s=t1 - t0, verify_s=t2 - t1)
        for row, new in enumerate(new_tokens(step)):
            if active[row]:
                self._emit(run, row, new, step)
        if self.proposer is not None:
            self.proposer.observe(run.seqs, outcome_of(step))
            t3 = time.perf_counter()
            add_draft_time(run.metrics, active, t3 - t2)
            if self.adaptive is not None and cap is not None:
                self.adaptive.record(
                    rows=len(run.seqs),
                    width=tree.size,
                    cap=cap,
                    propose_s=t1 - t0,
                    verify_s=t2 - t1,
                    observe_s=t3 - t2,
                    outcomes=row_outcomes(step),
                )

    def _propose(self, seqs: list[Sequence], ctx: StepContext) -> DraftTree:
        return self.proposer.propose(seqs, ctx) if self.proposer is not None else DraftTree.empty(len(seqs))

    def _stops(self, request: Request) -> set[int]:
        """The tokens that end a request's output (not kept)."""
        eos = set() if request.ignore_eos else self.target.eos_token_ids
        return eos | set(request.stop_token_ids)

    def _early_stops(self, run: Batch) -> dict[int, tuple[int, list[int]]]:
        """Per row still owed min_tokens: (tokens still owed, its stopping tokens)."""
        owed = {}
        for row, (seq, request) in enumerate(zip(run.seqs, run.requests, strict=True)):
            room = request.min_tokens - len(seq.output_ids)
            if room > 0 and not seq.finished:
                owed[row] = (room, sorted(self._stops(request)))
        return owed

    def _verify(
        self,
        cache: StaticKVCache,
        block: Block,
        ctx: StepContext,
        active: list[bool],
        early_stops: dict[int, tuple[int, list[int]]] | None = None,
    ) -> Verified:
        """The target scores the block (its KV written to the cache, not committed); the verifier
        rules, on logits with each row's ``early_stops`` banned where min_tokens is still owed."""
        drafted = block.tokens.shape[1] > 1
        hidden, features = self._forward(cache, block.tokens, block.parents if drafted else None)
        logits = self.runner.logits(hidden).cpu()  # [batch, q, vocab]
        for row, (room, banned) in (early_stops or {}).items():
            ban_early_stops(logits[row], block.parents[row].tolist(), room, banned)
        verdict = verify_block(
            block,
            logits,
            ctx.sampling,
            ctx.generators,
            active=active,
            lossy_accept_threshold=self.lossy_accept_threshold,
        )
        return Verified(block=block, logits=logits, features=features, verdict=verdict, active=active)

    def _emit(self, run: Batch, row: int, new: list[int], step: Verified) -> None:
        """A row's new tokens: their logits to on_logits, the kept ones to the sequence and on_tokens,
        and the time they reached the caller to the row's metrics."""
        if run.on_logits is not None:
            run.on_logits(row, step.logits[row, step.verdict.accepted_nodes[row]])
        seq = run.seqs[row]
        request = run.requests[row]
        kept = append_until_done(seq, new, self._stops(request))
        stops = request.stop
        if stops and kept:
            kept = cut_at_stop(seq, stops, len(kept), self.target.tokenizer, request.min_tokens)
        if run.on_tokens is not None and kept:
            run.on_tokens(row, kept)
        if seq.finished and self.draft_pools is not None and seq.draft_scope is not None:
            self.draft_pools.add(seq.draft_scope, seq.prompt_ids, seq.output_ids)
        run.metrics[row].mark_emitted(time.perf_counter() - run.starts[row], finished=seq.finished)


def joined_features(
    reused: list[Reuse | None], fresh: torch.Tensor | None, counts: torch.Tensor
) -> torch.Tensor:
    """Each row's features of its reused prefix, then of what was prefilled (``fresh``:
    [batch, q, F], a row's first ``counts`` valid): [batch, longest, F], right-padded with zeros."""
    pieces: list[list[torch.Tensor]] = []
    for b, found in enumerate(reused):
        row = [found.prefix.features[: found.length]] if found and found.prefix.features is not None else []
        pieces.append(row + ([fresh[b, : int(counts[b])]] if fresh is not None else []))
    like = next(t for row in pieces for t in row)
    parts = [torch.cat(row) if row else like.new_zeros((0, like.shape[-1])) for row in pieces]
    return torch.nn.utils.rnn.pad_sequence(parts, batch_first=True)


def block_of(seqs: list[Sequence], tree: DraftTree) -> Block:
    """The block of every row: its pending token as the root, the draft tree below it."""
    batch = len(seqs)
    pending = torch.tensor([[s.pending] for s in seqs], dtype=torch.long)
    return Block(
        tokens=torch.cat([pending, tree.tokens], dim=1),
        parents=block_parents(tree.parents),
        acceptable=torch.cat([torch.zeros(batch, 1, dtype=torch.bool), tree.acceptable], dim=1),
        draft_probs=tree.draft_probs,
    )


def new_tokens(step: Verified) -> list[list[int]]:
    """Per row: the accepted draft tokens then the next token (inactive rows: none)."""
    verdict = step.verdict
    rows = zip(
        step.block.tokens.tolist(), verdict.accepted_nodes, verdict.next_tokens, step.active, strict=True
    )
    return [[toks[node] for node in path[1:]] + [nxt] if act else [] for toks, path, nxt, act in rows]


def outcome_of(step: Verified) -> StepOutcome:
    return StepOutcome(
        block_tokens=step.block.tokens,
        logits=step.logits,
        accepted_nodes=step.verdict.accepted_nodes,
        next_tokens=step.verdict.next_tokens,
        hidden=step.features,
    )


def draft_depths(block: Block) -> list[int]:
    """Per row: the depth of its deepest acceptable draft node (0: it drafted nothing)."""
    return (depths(ancestor_mask(block.parents)) * block.acceptable).max(1).values.tolist()


def row_outcomes(step: Verified) -> list[tuple[int, int]]:
    """Per active row: (draft depth, accepted draft tokens), what adaptive k learns from."""
    depth = draft_depths(step.block)
    return [
        (d, len(path) - 1)
        for d, path, act in zip(depth, step.verdict.accepted_nodes, step.active, strict=True)
        if act
    ]


def record_step(metrics: list[GenerationMetrics], step: Verified, *, draft_s: float, verify_s: float) -> None:
    """Count each active row's drafted nodes, draft depth and accepted tokens, and the step's times."""
    block = step.block
    depth = draft_depths(block)
    drafted = block.acceptable.sum(1).tolist()
    for row, m in enumerate(metrics):
        if step.active[row]:
            m.record_step(drafted[row], depth[row], len(step.verdict.accepted_nodes[row]) - 1)
            m.draft_time_s += draft_s
            m.verify_time_s += verify_s


def add_draft_time(metrics: list[GenerationMetrics], active: list[bool], seconds: float) -> None:
    """The proposer's observe, and the bookkeeping before it, is drafting work of every active row."""
    for m, act in zip(metrics, active, strict=True):
        if act:
            m.draft_time_s += seconds


def append_until_done(seq: Sequence, new: list[int], eos_ids: set[int]) -> list[int]:
    """Append tokens up to EOS (not kept) or max tokens, where the sequence finishes; return those kept."""
    kept: list[int] = []
    for token in new:
        if token in eos_ids:
            seq.finished, seq.finish_reason = True, "stop"
            break
        kept.append(token)
        if len(seq.output_ids) + len(kept) >= seq.max_new_tokens:
            seq.finished, seq.finish_reason = True, "length"
            break
    seq.output_ids.extend(kept)
    return kept


def cut_at_stop(
    seq: Sequence,
    stops: tuple[str, ...],
    n_new: int,
    tokenizer: PreTrainedTokenizerBase,
    min_tokens: int = 0,
) -> list[int]:
    """Stop before the token that completes a stop string; return the new tokens still kept.
    A stop string completed within the first ``min_tokens`` tokens does not count (vLLM's)."""
    start = len(seq.output_ids) - n_new
    first = max(start, min_tokens) + 1
    before = tokenizer.decode(seq.output_ids[: first - 1], skip_special_tokens=True)
    for end in range(first, len(seq.output_ids) + 1):
        text = tokenizer.decode(seq.output_ids[:end], skip_special_tokens=True)
        # Only a stop string ending in this token's text: one met before min_tokens stays.
        done = any(s in text[max(len(before) - len(s) + 1, 0) :] for s in stops)
        before = text
        if done:
            del seq.output_ids[end - 1 :]
            seq.finished, seq.finish_reason = True, "stop"
            return seq.output_ids[start:]
    return seq.output_ids[start:]
