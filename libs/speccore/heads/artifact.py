"""A trained head on disk: ``head.safetensors`` plus ``config.json`` with provenance.

The config names the family and the shapes the head was trained for; loading
checks them against the target before any weight is read, so a head trained for
another model is refused with the reason, not a shape error deep in a matmul.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from speccore.errors import SpecError
from speccore.files import atomic_write

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "head.safetensors"
FORMAT = "specops-head/1"
FAMILIES = ("medusa", "eagle", "eagle3", "draft")


@dataclass(slots=True)
class HeadConfig:
    family: str  # medusa, eagle (EAGLE-1 layer, decoded with EAGLE-2 trees), eagle3 or draft
    hidden_size: int  # the target's
    vocab_size: int  # the target's
    draft_vocab_size: int  # tokens the head scores (the most frequent in its training data)
    # medusa
    num_heads: int = 4
    num_res_layers: int = 1
    # eagle / eagle3: one decoder layer
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    rms_norm_eps: float = 1e-5
    feature_layers: list[int] = field(default_factory=list)  # eagle3: target layers fused
    # draft: the target's first num_layers decoder layers, distilled (its embeddings shared)
    num_layers: int = 0
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise SpecError(f"unknown head family '{self.family}'; expected one of {', '.join(FAMILIES)}")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise SpecError(f"draft vocabulary {self.draft_vocab_size} must be in 1..{self.vocab_size}")


def save_head(out: Path, config: HeadConfig, module: nn.Module, dtype: torch.dtype = torch.float16) -> None:
    """Write the head's weights (floats as ``dtype``) and config into ``out`` (created if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: (v.to(dtype) if v.is_floating_point() else v).detach().contiguous().cpu()
        for k, v in module.state_dict().items()
    }
    with atomic_write(out / WEIGHTS_FILE) as tmp:
        save_file(tensors, str(tmp), metadata={"format": FORMAT, "family": config.family})
        _sort_metadata(tmp)
    (out / CONFIG_FILE).write_text(json.dumps({"format": FORMAT, **asdict(config)}, indent=2) + "\n")


def _sort_metadata(path: Path) -> None:
    """Sort the safetensors header's ``__metadata__`` keys in place.

    safetensors writes them in a hash map's order, which changes from call to call, so
    the same weights would give files of different bytes (and sha256) half the time.
    Only the order changes, so the header keeps its length and the tensors stay put."""
    with open(path, "r+b") as fp:
        (size,) = struct.unpack("<Q", fp.read(8))
        header = json.loads(fp.read(size))
        metadata = header.get("__metadata__")
        if not isinstance(metadata, dict):
            return
        header["__metadata__"] = dict(sorted(metadata.items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > size:  # not the compact form safetensors writes: leave it as it is
            return
        fp.seek(8)
        fp.write(text.ljust(size, b" "))


def read_config(path: Path) -> HeadConfig:
    """The config of the head in directory ``path``; a clear error for anything else."""
    cfg_path = path / CONFIG_FILE
    if not path.is_dir():
        raise SpecError(f"no head directory at {path}")
    if not cfg_path.is_file() or not (path / WEIGHTS_FILE).is_file():
        raise SpecError(f"{path} is not a specops head: it needs {CONFIG_FILE} and {WEIGHTS_FILE}")
    try:
        raw = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SpecError(f"{cfg_path}: not valid JSON ({err})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise SpecError(f"{cfg_path}: not a {FORMAT} config")
    known = {f.name for f in fields(HeadConfig)}
    try:
        return HeadConfig(**{k: v for k, v in raw.items() if k in known})
    except TypeError as err:
        raise SpecError(f"{cfg_path}: {err}") from None


def check_fits(config: HeadConfig, hidden_size: int, vocab_size: int, target: str) -> None:
    """Refuse a head trained for another hidden size or vocabulary."""
    if config.hidden_size != hidden_size:
        raise SpecError(
            f"the {config.family} head was trained for hidden size {config.hidden_size}; "
            f"target '{target}' has {hidden_size}"
        )
    if config.vocab_size != vocab_size:
        raise SpecError(
            f"the {config.family} head was trained for a vocabulary of {config.vocab_size} tokens; "
            f"target '{target}' has {vocab_size}"
        )


def load_weights(path: Path, module: nn.Module) -> None:
    """Load ``head.safetensors`` into ``module``; any missing or misshapen tensor is an error."""
    try:
        state = load_file(str(path / WEIGHTS_FILE))
    except Exception as err:  # safetensors raises its own error types for corrupt files
        raise SpecError(f"{path / WEIGHTS_FILE}: cannot read weights ({err})") from None
    expected = module.state_dict()
    for name, tensor in expected.items():
        if name not in state:
            raise SpecError(f"{path / WEIGHTS_FILE}: tensor '{name}' is missing")
        if state[name].shape != tensor.shape:
            raise SpecError(
                f"{path / WEIGHTS_FILE}: tensor '{name}' has shape {tuple(state[name].shape)}, "
                f"the config implies {tuple(tensor.shape)}"
            )
    with torch.no_grad():
        for name, tensor in expected.items():
            tensor.copy_(state[name])  # into the module's own dtype
