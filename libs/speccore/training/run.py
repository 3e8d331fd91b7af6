"""One head-training run, end to end: data, features, training, artifact.

``train_head`` is what ``specops heads train`` and the future head-trainer
service call. It writes the head into ``out`` (``head.safetensors`` and
``config.json`` with provenance) and keeps ``out/checkpoint.pt`` while the run is
unfinished, so the same call after a kill, or with a larger budget, continues it.
"""

from __future__ import annotations

import hashlib
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from speccore.errors import SpecError
from speccore.heads.artifact import (
    WEIGHTS_FILE,
    HeadConfig,
    check_fits,
    load_weights,
    read_config,
    save_head,
)
from speccore.heads.distilled import draft_with, initial_layers
from speccore.heads.eagle import EagleHead
from speccore.heads.loading import output_weight
from speccore.heads.medusa import MedusaHeads
from speccore.models import LoadedModel, file_sha256
from speccore.split import HELDOUT_FRACTION, is_heldout
from speccore.training.chunks import HELDOUT, MANIFEST, chunk_files
from speccore.training.data import TokenizedExample, check_disjoint, read_examples, tokenize_example
from speccore.training.draft import DraftObjective
from speccore.training.eagle import EagleObjective
from speccore.training.features import Sequences, draft_vocabulary, extract, target_fingerprint
from speccore.training.medusa import MedusaObjective
from speccore.training.trainer import CHECKPOINT, EpochReport, Objective, TrainOptions, TrainResult, train

EAGLE3_FLAG = "ENABLE_L4_EAGLE3_TRAINING"
HEAD_FAMILIES = ("medusa", "eagle", "eagle3", "draft")
# New heads learn fast; a distilled draft starts from trained layers and must not forget them.
DEFAULT_LR = {"medusa": 1e-3, "eagle": 5e-4, "eagle3": 5e-4, "draft": 5e-5}
# EAGLE-3 trains on its own unrolled outputs by design; EAGLE-1 may (it triples the cost).
DEFAULT_TTT = {"eagle": 1, "eagle3": 3}


@dataclass(frozen=True, slots=True)
class HeadPlan:
    family: str
    epochs: int = 2
    lr: float | None = None  # None: the family's default (DEFAULT_LR)
    seed: int = 0
    budget_minutes: float | None = None
    max_len: int = 512  # tokens per training sequence (prompt + completion)
    batch_tokens: int = 4096
    draft_vocab: int = 8192
    num_heads: int = 4  # medusa
    draft_layers: int = 6  # draft: the target's first layers, distilled
    feature_layers: tuple[int, ...] | None = None  # eagle3; default: low, middle, high
    ttt_steps: int | None = None  # eagle/eagle3 training-time test depth; None: DEFAULT_TTT
    checkpoint_every: int = 25
    init_from: str | None = None  # a head directory to start from (same family and draft vocabulary size)
    extra: dict[str, str] = field(default_factory=dict)  # provenance to record as given (command line)

    @property
    def unroll_steps(self) -> int:
        """The training-time test depth the EAGLE families train with (1: none)."""
        return self.ttt_steps or DEFAULT_TTT.get(self.family, 1)

    def __post_init__(self) -> None:
        if self.family not in HEAD_FAMILIES:
            raise SpecError(f"unknown head family '{self.family}'; choose one of {', '.join(HEAD_FAMILIES)}")
        if self.family == "eagle3" and os.environ.get(EAGLE3_FLAG, "").lower() not in (
            "1",
            "true",
            "yes",
            "on",
        ):
            raise SpecError(f"EAGLE-3 training is behind a feature flag: set {EAGLE3_FLAG}=1 to use it")
        if self.budget_minutes is not None and self.budget_minutes <= 0:
            raise SpecError(f"--budget-minutes must be positive, got {self.budget_minutes}")
        if (
            self.num_heads <= 0
            or (self.ttt_steps is not None and self.ttt_steps <= 0)
            or self.draft_layers <= 0
        ):
            raise SpecError("num_heads, ttt_steps and draft_layers must be positive")
        if self.init_from and self.family == "draft":
            raise SpecError(
                "--init-from takes a Medusa or EAGLE head; a distilled draft starts from the target's layers"
            )


def default_feature_layers(n_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high taps (as SpecForge picks them): 1, n/2-1, n-4."""
    return (1, n_layers // 2 - 1, n_layers - 4)


def train_head(
    target: LoadedModel,
    plan: HeadPlan,
    data: Path,
    heldout: Path | None,
    out: Path,
    on_epoch: Callable[[EpochReport], None] | None = None,
    progress: bool = True,
) -> TrainResult:
    started = time.time()
    train_ex, held_ex = _examples(target, plan, data, heldout)
    text_config = target.model.config.get_text_config()
    vocab_size = int(output_weight(target).shape[0])
    if plan.init_from:  # a head goes on scoring the vocabulary its weights were trained on
        draft_ids = _init_draft_ids(Path(plan.init_from), plan, target)
    else:
        draft_ids = draft_vocabulary(train_ex, plan.draft_vocab, vocab_size, target.eos_token_ids)
    layers = _layers(plan, int(text_config.num_hidden_layers))
    train_seq = extract(target, train_ex, layers, progress=progress)
    held_seq = extract(target, held_ex, layers, progress=progress)
    config = _head_config(plan, text_config, vocab_size, layers)
    torch.manual_seed(plan.seed)  # initial weights
    module, objective = _objective(target, plan, config, draft_ids, train_seq, held_seq, vocab_size)
    init_weights = _warm_start(module, Path(plan.init_from)) if plan.init_from else None
    opts = TrainOptions(
        epochs=plan.epochs,
        lr=plan.lr or DEFAULT_LR[plan.family],
        seed=plan.seed,
        budget_s=plan.budget_minutes * 60 if plan.budget_minutes else None,
        checkpoint_every=plan.checkpoint_every,
    )
    fingerprint = target_fingerprint(target)
    data_digest = data_sha256(data)
    run_key = hashlib.sha256(
        repr(
            (asdict(plan) | {"budget_minutes": None, "extra": None}, fingerprint, data_digest, init_weights)
        ).encode()
    ).hexdigest()
    result = train(objective, opts, out, run_key, on_epoch, progress)
    config.provenance = {
        "target": target.ref,
        "target_weights": fingerprint,
        "data": {
            "path": str(data),
            "sha256": data_digest,
            "examples": len(train_seq),
            "completion_tokens": train_seq.completion_tokens,
        },
        "heldout": {
            "path": _heldout_source(data, heldout),
            "examples": len(held_seq),
        },
        "plan": {k: v for k, v in asdict(plan).items() if k != "extra"}
        | {"feature_layers": list(layers), "ttt_steps": plan.unroll_steps},
        **({"init_weights": init_weights} if init_weights else {}),
        "steps": result.steps,
        "tokens_seen": result.tokens_seen,
        "stopped_by": result.stopped_by,
        "train_seconds": round(result.elapsed_s, 1),
        "wall_seconds": round(time.time() - started, 1),
        "hardware": hardware(target),
        "curve": [asdict(r) for r in result.reports],
        "heldout_acceptance": result.reports[-1].heldout if result.reports else {},
        **plan.extra,
    }
    save_head(out, config, module.to("cpu"))
    if result.stopped_by == "epochs":
        (out / CHECKPOINT).unlink(missing_ok=True)
    return result


def data_sha256(data: Path) -> str:
    """What the training data is: a file's hash, or a chunk directory's manifest's."""
    return file_sha256(data / MANIFEST if data.is_dir() else data)


def hardware(target: LoadedModel) -> str:
    if target.device.type == "cuda":
        return f"{torch.cuda.get_device_name(target.device)} (cuda)"
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {torch.get_num_threads()} threads (cpu)"


def _examples(
    target: LoadedModel, plan: HeadPlan, data: Path, heldout: Path | None
) -> tuple[list[TokenizedExample], list[TokenizedExample]]:
    if data.is_dir():  # a chunk directory (`specops heads data --chunks-dir`)
        train_files, held_file = chunk_files(data)
        held_file = heldout or held_file
        for path in train_files:
            check_disjoint(path, held_file)
        train_rows = [ex for path in train_files for ex in read_examples(path)]
        held_rows = list(read_examples(held_file))
    elif heldout is not None:
        check_disjoint(data, heldout)
        train_rows, held_rows = list(read_examples(data)), list(read_examples(heldout))
    else:
        rows = list(read_examples(data))
        train_rows = [ex for ex in rows if not is_heldout(ex.prompt, HELDOUT_FRACTION)]
        held_rows = [ex for ex in rows if is_heldout(ex.prompt, HELDOUT_FRACTION)]
    if not train_rows:
        raise SpecError(f"{data}: no training examples (every prompt falls in the held-out split)")
    train_ex = [t for ex in train_rows if (t := tokenize_example(target.tokenizer, ex, plan.max_len))]
    held_ex = [t for ex in held_rows if (t := tokenize_example(target.tokenizer, ex, plan.max_len))]
    if not train_ex:
        raise SpecError(f"{data}: no example leaves room for a completion within {plan.max_len} tokens")
    return train_ex, held_ex


def _init_draft_ids(path: Path, plan: HeadPlan, target: LoadedModel) -> torch.Tensor:
    """The draft vocabulary of the head to start from: its weights score the target's rows for those ids."""
    init = read_config(path)
    vocab, hidden = output_weight(target).shape
    check_fits(init, int(hidden), int(vocab), target.ref)  # trained for this target's sizes
    if init.family != plan.family:
        raise SpecError(f"--init-from {path} is a {init.family} head; this run trains {plan.family}")
    if init.draft_vocab_size != plan.draft_vocab:
        raise SpecError(
            f"--init-from {path} scores a draft vocabulary of {init.draft_vocab_size} tokens; "
            f"this run plans {plan.draft_vocab} (--draft-vocab)"
        )
    ids = load_file(str(path / WEIGHTS_FILE)).get("draft_ids")
    if ids is None:
        raise SpecError(f"{path / WEIGHTS_FILE}: tensor 'draft_ids' is missing")
    return ids.long()


def _warm_start(module: torch.nn.Module, path: Path) -> str:
    """Load the head at ``path`` into ``module``; the sha256 of its weights, which keys the run."""
    load_weights(path, module)  # a missing or misshapen tensor is an error
    return f"sha256:{file_sha256(path / WEIGHTS_FILE)}"


def _heldout_source(data: Path, heldout: Path | None) -> str:
    if heldout is not None:
        return str(heldout)
    return str(data / HELDOUT) if data.is_dir() else f"{HELDOUT_FRACTION:g} of data by prompt hash"


def _layers(plan: HeadPlan, n_layers: int) -> tuple[int, ...]:
    if plan.family != "eagle3":
        return ()
    return tuple(plan.feature_layers) if plan.feature_layers else default_feature_layers(n_layers)


def _head_config(plan: HeadPlan, text_config: object, vocab_size: int, layers: tuple[int, ...]) -> HeadConfig:
    get = text_config.__getattribute__
    hidden = int(get("hidden_size"))
    heads = int(get("num_attention_heads"))
    return HeadConfig(
        family=plan.family,
        hidden_size=hidden,
        vocab_size=vocab_size,
        draft_vocab_size=plan.draft_vocab,
        num_heads=plan.num_heads,
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(text_config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text_config, "head_dim", None) or hidden // heads),
        intermediate_size=int(get("intermediate_size")),
        rms_norm_eps=float(getattr(text_config, "rms_norm_eps", 1e-6)),
        feature_layers=list(layers),
        num_layers=plan.draft_layers if plan.family == "draft" else 0,
    )


def _objective(
    target: LoadedModel,
    plan: HeadPlan,
    config: HeadConfig,
    draft_ids: torch.Tensor,
    train_seq: Sequences,
    held_seq: Sequences,
    vocab_size: int,
) -> tuple[torch.nn.Module, Objective]:
    device = target.device  # the head trains where the target runs
    out_weight = output_weight(target).detach().float()[draft_ids.to(device)]
    if plan.family == "draft":
        part = initial_layers(target.model, plan.draft_layers)
        draft = draft_with(target.model, part)
        return part, DraftObjective(
            part, draft, out_weight, train_seq, held_seq, vocab_size, draft_ids, plan.batch_tokens, device
        )
    if plan.family == "medusa":
        medusa = MedusaHeads(config)
        medusa.get_buffer("draft_ids").copy_(draft_ids)
        medusa.to(device)
        objective = MedusaObjective(
            medusa, out_weight, train_seq, held_seq, vocab_size, plan.batch_tokens, device
        )
        return medusa, objective
    eagle = EagleHead(config)
    eagle.get_buffer("draft_ids").copy_(draft_ids)
    eagle3 = plan.family == "eagle3"
    if eagle.lm_head is not None:
        with torch.no_grad():
            eagle.lm_head.weight.copy_(out_weight)  # start from the target's own output rows
    eagle.to(device)
    objective = EagleObjective(
        eagle,
        target.model.get_input_embeddings(),
        None if eagle3 else out_weight,
        train_seq,
        held_seq,
        vocab_size,
        train_steps=plan.unroll_steps,
        batch_tokens=plan.batch_tokens,
        device=device,
    )
    return eagle, objective
