"""The training loop every head family shares: epochs, time budget, checkpoints, resume.

A run is deterministic given its seed: batch order comes from a generator seeded
per epoch, and every other random draw (feature noise) from one generator whose
state is checkpointed with the weights and the optimizer. A run killed at any
point and started again with the same arguments resumes from its last
checkpoint and ends with the same weights as a run that was never interrupted.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from tqdm import tqdm

from speccore.errors import SpecError
from speccore.files import atomic_write

CHECKPOINT = "checkpoint.pt"


class Objective(Protocol):
    """What a family trains and how it scores it."""

    @property
    def module(self) -> nn.Module:
        """The module being trained."""

    def batches(self, gen: torch.Generator) -> list[Any]:
        """One epoch's batches, in an order drawn from ``gen``."""

    def loss(self, batch: Any, gen: torch.Generator) -> tuple[torch.Tensor, int]:
        """(mean loss, tokens it covers) of one batch; ``gen`` for any noise."""

    def evaluate(self) -> dict[str, float]:
        """Held-out measurements (acceptance) of the module as it is now."""


@dataclass(frozen=True, slots=True)
class TrainOptions:
    epochs: int = 2
    lr: float = 1e-3
    seed: int = 0
    budget_s: float | None = None  # stop (with a checkpoint) once this much training time is spent
    checkpoint_every: int = 25  # steps
    warmup_steps: int = 10
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        if self.epochs <= 0:
            raise SpecError(f"epochs must be positive, got {self.epochs}")
        if self.budget_s is not None and self.budget_s <= 0:
            raise SpecError(f"the time budget must be positive, got {self.budget_s} s")


@dataclass(slots=True)
class EpochReport:
    epoch: int  # 1-based; 0 measures the module before training
    steps: int  # optimizer steps so far
    tokens_seen: int  # training tokens so far
    train_loss: float | None  # mean over the epoch's batches (None before training)
    heldout: dict[str, float]
    elapsed_s: float


@dataclass(slots=True)
class TrainResult:
    reports: list[EpochReport]
    steps: int
    tokens_seen: int
    elapsed_s: float
    stopped_by: str  # "epochs" or "budget"
    resumed_from_step: int | None = None


@dataclass(slots=True)
class _State:
    epoch: int = 0  # 0-based epoch in progress
    batch: int = 0  # next batch of that epoch
    steps: int = 0
    tokens_seen: int = 0
    loss_sum: float = 0.0
    loss_batches: int = 0
    elapsed_s: float = 0.0
    reports: list[EpochReport] = field(default_factory=list)


def train(
    objective: Objective,
    opts: TrainOptions,
    workdir: Path,
    run_key: str,
    on_epoch: Callable[[EpochReport], None] | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train ``objective.module`` in place; checkpoints go to ``workdir``.

    ``run_key`` names what is being trained (family, data, options): a checkpoint
    from another run is refused rather than silently continued.
    """
    module = objective.module
    params = [p for p in module.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=opts.lr, weight_decay=0.0)
    noise = torch.Generator().manual_seed(opts.seed)
    state = _State()
    resumed = _resume(workdir / CHECKPOINT, run_key, module, optim, noise, state)
    per_epoch = len(objective.batches(_order_gen(opts.seed, 0)))
    if per_epoch == 0:
        raise SpecError("no training batches: the data has no completion tokens to learn from")
    total = per_epoch * opts.epochs
    bar = tqdm(total=total, initial=state.steps, desc="training", unit="step", disable=not progress)
    stopped_by = "epochs"
    if resumed is None:  # the curve starts at the untrained module
        module.eval()
        state.reports.append(EpochReport(0, 0, 0, None, objective.evaluate(), 0.0))
        if on_epoch is not None:
            on_epoch(state.reports[0])
    module.train()
    with bar:
        while state.epoch < opts.epochs:
            batches = objective.batches(_order_gen(opts.seed, state.epoch))
            while state.batch < len(batches):
                started = time.perf_counter()
                _set_lr(optim, opts, state.steps, total)
                loss, tokens = objective.loss(batches[state.batch], noise)
                optim.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, opts.grad_clip)
                optim.step()
                state.batch += 1
                state.steps += 1
                state.tokens_seen += tokens
                state.loss_sum += float(loss.detach())
                state.loss_batches += 1
                state.elapsed_s += time.perf_counter() - started
                bar.update(1)
                bar.set_postfix(epoch=state.epoch + 1, loss=f"{float(loss.detach()):.3f}")
                out_of_time = opts.budget_s is not None and state.elapsed_s >= opts.budget_s
                if state.steps % opts.checkpoint_every == 0 or out_of_time:
                    _save(workdir / CHECKPOINT, run_key, module, optim, noise, state)
                if out_of_time:
                    stopped_by = "budget"
                    break
            if stopped_by == "budget":
                break
            _finish_epoch(objective, state, on_epoch)
            _save(workdir / CHECKPOINT, run_key, module, optim, noise, state)
    module.eval()
    return TrainResult(state.reports, state.steps, state.tokens_seen, state.elapsed_s, stopped_by, resumed)


def _finish_epoch(
    objective: Objective, state: _State, on_epoch: Callable[[EpochReport], None] | None
) -> None:
    objective.module.eval()
    heldout = objective.evaluate()
    objective.module.train()
    report = EpochReport(
        epoch=state.epoch + 1,
        steps=state.steps,
        tokens_seen=state.tokens_seen,
        train_loss=state.loss_sum / max(state.loss_batches, 1),
        heldout=heldout,
        elapsed_s=state.elapsed_s,
    )
    state.reports.append(report)
    state.epoch += 1
    state.batch = 0
    state.loss_sum, state.loss_batches = 0.0, 0
    if on_epoch is not None:
        on_epoch(report)


def _order_gen(seed: int, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 100_003 + epoch)


def _set_lr(optim: torch.optim.Optimizer, opts: TrainOptions, step: int, total: int) -> None:
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if step < opts.warmup_steps:
        scale = (step + 1) / opts.warmup_steps
    else:
        progress = (step - opts.warmup_steps) / max(total - opts.warmup_steps, 1)
        scale = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    for group in optim.param_groups:
        group["lr"] = opts.lr * scale


def _save(
    path: Path,
    run_key: str,
    module: nn.Module,
    optim: torch.optim.Optimizer,
    noise: torch.Generator,
    state: _State,
) -> None:
    payload = {
        "run_key": run_key,
        "module": module.state_dict(),
        "optimizer": optim.state_dict(),
        "noise": noise.get_state(),
        "state": {**asdict(state), "reports": [asdict(r) for r in state.reports]},
    }
    with atomic_write(path) as tmp:  # a kill mid-write leaves the previous checkpoint whole
        torch.save(payload, tmp)


def _resume(
    path: Path,
    run_key: str,
    module: nn.Module,
    optim: torch.optim.Optimizer,
    noise: torch.Generator,
    state: _State,
) -> int | None:
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, weights_only=False)
    except Exception as err:  # noqa: BLE001 - a torn or foreign file
        raise SpecError(f"cannot read checkpoint {path} ({err}); remove it to start over") from None
    if payload.get("run_key") != run_key:
        raise SpecError(
            f"{path} is a checkpoint of another training run (other family, data or options); "
            "remove it or train into another --out directory"
        )
    module.load_state_dict(payload["module"])
    optim.load_state_dict(payload["optimizer"])
    noise.set_state(payload["noise"])
    saved = dict(payload["state"])
    saved["reports"] = [EpochReport(**r) for r in saved["reports"]]
    for key, value in saved.items():
        setattr(state, key, value)
    return state.steps
