"""Published speculative heads: EAGLE / EAGLE-3 draft heads on the Hugging Face Hub that vLLM
or SGLang load by repo id, each for the one target it was trained for.

The predictor offers them in vLLM and SGLang runs of that exact target (a head trained for
Llama-3.3-70B-Instruct is not one for Llama-3.1-70B-Instruct: same shapes, other weights,
so its acceptance there is unknown); ``apply`` renders them as the engines load them
(vLLM ``--speculative-config {"method": "eagle3", "model": <repo id>, ...}``, SGLang
``--speculative-algorithm EAGLE3 --speculative-draft-model-path <repo id>``). A head's
``engines`` are the engines whose loader reads its checkpoint layout: the original
EAGLE-3 checkpoints (``yuhuili/...``) are read by vLLM, SGLang reads a copy with its
architecture name (``lmsys/sglang-...``), the ``speculators`` format (``RedHatAI/...``)
is vLLM's.

Every repo id below was checked to exist (its model card, or the engines' docs and tests
that load it) when this list was written, 2026-11-25. Published figures are the mean
acceptance length (tau: tokens per verify step, bonus included) as the source states
them; None where no source gives one. No published EAGLE-3 head for
meta-llama/Llama-3.1-70B-Instruct was found; the 70B heads here are Llama-3.3-70B's.
Medusa heads on the Hub (``FasterDecoding/medusa-vicuna-7b-v1.3``) are for Vicuna
targets, which speccatalog.targets does not know, so none is listed.
"""

from __future__ import annotations

from dataclasses import dataclass

from speccatalog.targets import HeadRef

VLLM, SGLANG = "vllm", "sglang"


@dataclass(frozen=True, slots=True)
class PublicHead:
    """A published head: where it is, what it drafts for, who loads it, what it showed."""

    repo_id: str  # Hugging Face repo id: the candidate's draft and what the engine loads
    target_ref: str  # the exact speccatalog.targets id it was trained for
    family: str  # catalog family: eagle or medusa
    eagle_version: int | None  # 1 or 3 for eagle heads; None for medusa
    engines: frozenset[str]  # engines whose loader reads its checkpoint layout
    source: str  # URL of its model card
    tau: float | None = None  # published mean acceptance length, if any
    tau_source: str | None = None  # where tau was published, and how it was measured
    num_heads: int = 1  # medusa heads; EAGLE heads are one layer

    def ref(self) -> HeadRef:
        """The head as the catalog sees it (its acceptance left to the family's prior)."""
        return HeadRef(
            head_id=self.repo_id,
            family=self.family,
            target_ref=self.target_ref,
            num_heads=self.num_heads,
            eagle_version=self.eagle_version or 3,
            path=self.repo_id,
        )


_HF = "https://huggingface.co/"
_NEBIUS = (
    "https://huggingface.co/nebius/EAGLE3-Llama-3.3-70B-Instruct (comparison table: MT-bench, "
    "temperature 1, 7 draft tokens)"
)
LLAMA_31_8B = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_33_70B = "meta-llama/Llama-3.3-70B-Instruct"

PUBLIC_HEADS: tuple[PublicHead, ...] = (
    PublicHead(
        "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        LLAMA_31_8B,
        "eagle",
        3,
        frozenset({VLLM}),
        _HF + "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        tau=2.77,
        tau_source=_NEBIUS,
    ),
    PublicHead(
        "lmsys/sglang-EAGLE3-LLaMA3.1-Instruct-8B",
        LLAMA_31_8B,
        "eagle",
        3,
        frozenset({SGLANG}),
        _HF + "lmsys/sglang-EAGLE3-LLaMA3.1-Instruct-8B",
    ),
    PublicHead(
        "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3",
        LLAMA_31_8B,
        "eagle",
        3,
        frozenset({VLLM}),
        _HF + "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3",
    ),
    PublicHead(
        "yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
        LLAMA_31_8B,
        "eagle",
        1,
        frozenset({VLLM}),
        _HF + "yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
    ),
    PublicHead(
        "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
        LLAMA_33_70B,
        "eagle",
        3,
        frozenset({VLLM}),
        _HF + "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
    ),
    PublicHead(
        "RedHatAI/Llama-3.3-70B-Instruct-speculator.eagle3",
        LLAMA_33_70B,
        "eagle",
        3,
        frozenset({VLLM}),
        _HF + "RedHatAI/Llama-3.3-70B-Instruct-speculator.eagle3",
        tau=2.88,
        tau_source=_NEBIUS,
    ),
    PublicHead(
        "nebius/EAGLE3-Llama-3.3-70B-Instruct",
        LLAMA_33_70B,
        "eagle",
        3,
        frozenset({VLLM}),
        _HF + "nebius/EAGLE3-Llama-3.3-70B-Instruct",
        tau=3.89,
        tau_source=_NEBIUS,
    ),
)


def public_heads(target_ref: str, engine: str) -> list[PublicHead]:
    """The published heads trained for ``target_ref`` (exactly, case aside) that ``engine`` loads."""
    ref = target_ref.lower()
    return [h for h in PUBLIC_HEADS if h.target_ref.lower() == ref and engine in h.engines]
