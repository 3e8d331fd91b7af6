"""The target's hidden states over training sequences, extracted once and cached on disk.

Every family reads the target's last hidden state (the input of its output
embedding); EAGLE-3 also reads the outputs of chosen decoder layers. Sequences
run through the frozen target in length-sorted padded batches; each chunk of
sequences is stored as one safetensors file named by a hash of the target, the
layers and the chunk's token ids, so a later run over the same (or overlapping)
data reuses it instead of recomputing.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from speccore.errors import SpecError
from speccore.features import check_feature_layers
from speccore.files import atomic_write
from speccore.models import LoadedModel, cache_root, file_sha256
from speccore.training.data import TokenizedExample

CHUNK = 64  # sequences per cache file
STORE_DTYPE = torch.float16


@dataclass(slots=True)
class Sequences:
    """Tokenized sequences with the target's features, one tensor per sequence."""

    input_ids: list[torch.Tensor]  # [T] int64
    loss_mask: list[torch.Tensor]  # [T] bool: completion tokens (and eos)
    hidden: list[torch.Tensor]  # [T, hidden] the target's last hidden state, STORE_DTYPE
    taps: list[torch.Tensor] | None  # [T, layers*hidden] outputs of the tapped layers, or None

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def completion_tokens(self) -> int:
        return int(sum(int(m.sum()) for m in self.loss_mask))


def target_fingerprint(target: LoadedModel) -> str:
    """Identifies the target's weights: the hash of its safetensors file (of the list of
    its files' hashes when sharded), or its hub id."""
    source = Path(target.source)
    files = sorted(source.glob("*.safetensors")) if source.is_dir() else []
    if not files:
        return f"hub:{target.source}"
    digests = [file_sha256(path) for path in files]
    if len(digests) == 1:
        return f"sha256:{digests[0]}"
    listing = "".join(f"{path.name} {d}\n" for path, d in zip(files, digests, strict=True))
    return f"sha256:{hashlib.sha256(listing.encode()).hexdigest()}"


def draft_vocabulary(
    examples: Iterable[TokenizedExample], size: int, vocab_size: int, always: set[int]
) -> torch.Tensor:
    """The ``size`` token ids most frequent in the completions (``always`` first), sorted."""
    if not 0 < size <= vocab_size:
        raise SpecError(f"draft vocabulary size must be in 1..{vocab_size}, got {size}")
    counts: Counter[int] = Counter()
    for ex in examples:
        counts.update(t for t, m in zip(ex.input_ids, ex.loss_mask, strict=True) if m)
    chosen = [t for t in sorted(always) if t < vocab_size][:size]
    seen = set(chosen)
    # most_common breaks ties by first occurrence; then fill with the lowest unused ids
    for token, _ in counts.most_common():
        if len(chosen) == size:
            break
        if token not in seen:
            chosen.append(token)
            seen.add(token)
    filler = (t for t in range(vocab_size) if t not in seen)
    while len(chosen) < size:
        chosen.append(next(filler))
    return torch.tensor(sorted(chosen), dtype=torch.long)


def extract(
    target: LoadedModel,
    examples: list[TokenizedExample],
    layers: tuple[int, ...] = (),
    *,
    cache_dir: Path | None = None,
    batch_tokens: int = 4096,
    progress: bool = True,
) -> Sequences:
    """Features of every example, from the cache where present (see module doc)."""
    n_layers = int(target.model.config.get_text_config().num_hidden_layers)
    check_feature_layers(layers, n_layers)
    root = (cache_dir or cache_root() / "features") / _target_key(target)
    out = Sequences([], [], [], [] if layers else None)
    chunks = [examples[i : i + CHUNK] for i in range(0, len(examples), CHUNK)]
    bar = tqdm(total=len(examples), desc="target features", unit="seq", disable=not progress)
    with bar:
        for chunk in chunks:
            path = root / f"{_chunk_key(chunk, layers)}.safetensors"
            tensors = _read(path)
            if tensors is None:
                tensors = _compute(target, chunk, layers, batch_tokens)
                with atomic_write(path) as tmp:
                    save_file(tensors, str(tmp))
            _append(out, chunk, tensors, layers)
            bar.update(len(chunk))
    return out


def _target_key(target: LoadedModel) -> str:
    return hashlib.sha256(f"{target_fingerprint(target)}|{target.dtype}".encode()).hexdigest()[:16]


def _chunk_key(chunk: list[TokenizedExample], layers: tuple[int, ...]) -> str:
    digest = hashlib.sha256(repr(layers).encode())
    for ex in chunk:
        digest.update(len(ex.input_ids).to_bytes(4, "little"))
        digest.update(torch.tensor(ex.input_ids, dtype=torch.int32).numpy().tobytes())
    return digest.hexdigest()[:24]


def _read(path: Path) -> dict[str, torch.Tensor] | None:
    if not path.is_file():
        return None
    try:
        return load_file(str(path))
    except Exception:  # a torn or foreign file: recompute it
        return None


@torch.inference_mode()
def _compute(
    target: LoadedModel, chunk: list[TokenizedExample], layers: tuple[int, ...], batch_tokens: int
) -> dict[str, torch.Tensor]:
    """Flat [sum T, ...] features of a chunk, in chunk order."""
    order = sorted(range(len(chunk)), key=lambda i: len(chunk[i].input_ids))
    hidden: dict[int, torch.Tensor] = {}
    taps: dict[int, torch.Tensor] = {}
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and len(chunk[order[end]].input_ids) * (end - start + 1) <= batch_tokens:
            end += 1
        idx = order[start:end]
        width = max(len(chunk[i].input_ids) for i in idx)
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        mask = torch.zeros(len(idx), width, dtype=torch.long)
        for row, i in enumerate(idx):
            n = len(chunk[i].input_ids)
            ids[row, :n] = torch.tensor(chunk[i].input_ids)
            mask[row, :n] = 1
        out = target.model.base_model(
            input_ids=ids.to(target.device),
            attention_mask=mask.to(target.device),
            output_hidden_states=bool(layers),
            use_cache=False,
        )
        for row, i in enumerate(idx):
            n = len(chunk[i].input_ids)
            hidden[i] = out.last_hidden_state[row, :n].to("cpu", STORE_DTYPE)
            if layers:
                # hidden_states[0] is the embedding output; [l + 1] is decoder layer l's output
                taps[i] = torch.cat([out.hidden_states[layer + 1][row, :n] for layer in layers], -1).to(
                    "cpu", STORE_DTYPE
                )
        start = end
    tensors = {"hidden": torch.cat([hidden[i] for i in range(len(chunk))])}
    if layers:
        tensors["taps"] = torch.cat([taps[i] for i in range(len(chunk))])
    return tensors


def _append(
    out: Sequences, chunk: list[TokenizedExample], tensors: dict[str, torch.Tensor], layers: tuple[int, ...]
) -> None:
    offset = 0
    for ex in chunk:
        n = len(ex.input_ids)
        out.input_ids.append(torch.tensor(ex.input_ids, dtype=torch.long))
        out.loss_mask.append(torch.tensor(ex.loss_mask, dtype=torch.bool))
        out.hidden.append(tensors["hidden"][offset : offset + n])
        if out.taps is not None:
            out.taps.append(tensors["taps"][offset : offset + n])
        offset += n
