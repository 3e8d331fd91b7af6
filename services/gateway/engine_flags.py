"""Apply: translate a candidate into the flags of the engine that will serve it.

Flag and key names are those of reference/engines.md:

- vLLM: one ``--speculative-config`` JSON with ``method`` (ngram, draft_model, medusa,
  eagle, eagle3, mtp), ``model`` (the draft or head), ``num_speculative_tokens``,
  ``prompt_lookup_max`` / ``prompt_lookup_min`` (ngram) and
  ``draft_tensor_parallel_size`` (must be 1 or the target's TP; 1 is always valid).
  vLLM takes no static tree, runs no REST or lookahead, and cannot build a `self:N` draft.
- SGLang: ``--speculative-algorithm`` (NGRAM, STANDALONE, EAGLE, EAGLE3, NEXTN),
  ``--speculative-draft-model-path``, ``--speculative-num-steps``,
  ``--speculative-eagle-topk``, ``--speculative-num-draft-tokens`` (which counts the
  verified root: steps + 1 for a chain), plus for NGRAM
  ``--speculative-ngram-{min,max}-match-window-size``. SGLang has no Medusa.
- speccore: the candidate itself, and its CLI flags.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from speccore.heads.trees import shape_nodes
from specops_schemas.api import ApplyResponse, EngineConfig, SglangConfig, SpeccoreConfig, VllmConfig
from specops_schemas.candidates import Candidate
from specops_schemas.catalog import Engine, Family

SELF_PREFIX = "self:"
BUILTIN_PREFIX = "builtin:"


class EngineCannotRun(ValueError):
    """The engine cannot run this candidate (the gateway answers with a problem+json)."""


def engine_config(
    candidate: Candidate, engine: Engine, *, draft_paths: Mapping[str, str] | None = None
) -> tuple[EngineConfig, list[str]]:
    """The structured configuration and the same as launch arguments.

    draft_paths maps registry ids (heads, datastores) to what the engine loads: a
    Hugging Face id or a directory; a draft missing from it is passed through as is.
    """
    paths = draft_paths or {}
    if engine == Engine.VLLM:
        vllm = _vllm(candidate, paths)
        return vllm, _vllm_args(vllm)
    if engine == Engine.SGLANG:
        sglang = _sglang(candidate, paths)
        return sglang, _sglang_args(sglang, candidate)
    return SpeccoreConfig(engine="speccore", candidate=candidate), _speccore_args(candidate, paths)


def apply_response(
    run_id: str, candidate: Candidate, engine: Engine, *, draft_paths: Mapping[str, str] | None = None
) -> ApplyResponse:
    config, args = engine_config(candidate, engine, draft_paths=draft_paths)
    return ApplyResponse(
        run_id=run_id,
        candidate_id=candidate.candidate_id,
        family=candidate.family,
        config=config,
        cli_args=args,
    )


def _cannot(engine: str, why: str) -> EngineCannotRun:
    return EngineCannotRun(f"{engine} cannot run this candidate: {why}")


def _external_draft(candidate: Candidate, engine: str, paths: Mapping[str, str]) -> str:
    draft = candidate.draft
    if not draft:
        raise _cannot(engine, f"a {candidate.family} candidate needs a draft model or head")
    if draft.startswith(SELF_PREFIX):
        raise _cannot(engine, f"'{draft}' is a layer-truncated copy of the target that only speccore builds")
    if draft.startswith(BUILTIN_PREFIX) and draft not in paths:
        raise _cannot(
            engine,
            f"'{draft}' is a head speccore ships in its own layout; train an EAGLE-3 head "
            "(`specops heads train --family eagle3`) and `specops heads export` it for vLLM or SGLang",
        )
    return paths.get(draft, draft)


def _int_option(candidate: Candidate, key: str) -> int | None:
    value = candidate.options.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value or value < 1:
        raise EngineCannotRun(f"option {key}={value!r} of {candidate.candidate_id} is not a positive integer")
    return int(value)


def _eagle_version(candidate: Candidate) -> int:
    return _int_option(candidate, "eagle_version") or 3


def _vllm(c: Candidate, paths: Mapping[str, str]) -> VllmConfig:
    if c.tree:
        raise _cannot("vLLM", "it takes no static draft tree; apply a chain candidate")
    if c.family == Family.NGRAM:
        return VllmConfig(
            engine="vllm",
            method="ngram",
            num_speculative_tokens=c.k,
            prompt_lookup_max=_int_option(c, "ngram_max"),
            prompt_lookup_min=_int_option(c, "ngram_min"),
        )
    if c.family == Family.DRAFT_MODEL:
        return VllmConfig(
            engine="vllm",
            method="draft_model",
            model=_external_draft(c, "vLLM", paths),
            num_speculative_tokens=c.k,
            draft_tensor_parallel_size=_int_option(c, "draft_tensor_parallel_size") or 1,
        )
    if c.family in (Family.MEDUSA, Family.EAGLE):
        method = "medusa" if c.family == Family.MEDUSA else ("eagle3" if _eagle_version(c) >= 3 else "eagle")
        return VllmConfig(
            engine="vllm", method=method, model=_external_draft(c, "vLLM", paths), num_speculative_tokens=c.k
        )
    if c.family == Family.MTP:
        return VllmConfig(engine="vllm", method="mtp", num_speculative_tokens=c.k)
    raise _cannot("vLLM", f"it has no {c.family} method")


def _vllm_args(config: VllmConfig) -> list[str]:
    body = config.model_dump(exclude={"engine"}, exclude_none=True)
    return ["--speculative-config", json.dumps(body, separators=(",", ":"))]


def _sglang(c: Candidate, paths: Mapping[str, str]) -> SglangConfig:
    if c.family == Family.EAGLE:
        algorithm = "EAGLE3" if _eagle_version(c) >= 3 else "EAGLE"
        steps = len(c.tree) if c.tree else c.k
        topk = max(c.tree) if c.tree else 1
        tokens = _int_option(c, "num_draft_tokens") or ((shape_nodes(c.tree) + 1) if c.tree else c.k + 1)
        return SglangConfig(
            engine="sglang",
            speculative_algorithm=algorithm,
            speculative_draft_model_path=_external_draft(c, "SGLang", paths),
            speculative_num_steps=steps,
            speculative_eagle_topk=topk,
            speculative_num_draft_tokens=tokens,
        )
    if c.tree:
        raise _cannot("SGLang", f"only EAGLE drafts a tree; {c.family} must be a chain")
    chain: dict[Family, tuple[str, bool]] = {
        Family.NGRAM: ("NGRAM", False),
        Family.DRAFT_MODEL: ("STANDALONE", True),
        Family.MTP: ("NEXTN", False),
    }
    if c.family not in chain:
        raise _cannot("SGLang", f"it has no {c.family} algorithm")
    algorithm, needs_draft = chain[c.family]
    return SglangConfig(
        engine="sglang",
        speculative_algorithm=algorithm,
        speculative_draft_model_path=_external_draft(c, "SGLang", paths) if needs_draft else None,
        speculative_num_steps=c.k,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=c.k + 1,
    )


def _sglang_args(config: SglangConfig, candidate: Candidate) -> list[str]:
    args = ["--speculative-algorithm", config.speculative_algorithm]
    if config.speculative_draft_model_path is not None:
        args += ["--speculative-draft-model-path", config.speculative_draft_model_path]
    args += ["--speculative-num-steps", str(config.speculative_num_steps)]
    if config.speculative_eagle_topk is not None:
        args += ["--speculative-eagle-topk", str(config.speculative_eagle_topk)]
    if config.speculative_num_draft_tokens is not None:
        args += ["--speculative-num-draft-tokens", str(config.speculative_num_draft_tokens)]
    if candidate.family == Family.NGRAM:
        # Not fields of SglangConfig; the launch arguments still carry the measured match window.
        lo, hi = _int_option(candidate, "ngram_min"), _int_option(candidate, "ngram_max")
        if lo is not None:
            args += ["--speculative-ngram-min-match-window-size", str(lo)]
        if hi is not None:
            args += ["--speculative-ngram-max-match-window-size", str(hi)]
    return args


def _speccore_args(c: Candidate, paths: Mapping[str, str]) -> list[str]:
    if c.family in (Family.MTP, Family.CASCADE):
        raise _cannot("speccore", f"{c.family} is not implemented yet")
    if c.family in (Family.MEDUSA, Family.EAGLE):
        if not c.draft:
            raise _cannot("speccore", f"{c.family} needs a trained head")
        # What was measured (speccore.candidates): the shape, or a chain of k.
        shape = c.tree or [1] * c.k
        return [
            "--method",
            str(c.family),
            "--head",
            paths.get(c.draft, c.draft),
            "--tree-shape",
            ",".join(map(str, shape)),
        ]
    args = ["--method", str(c.family), "--k", str(c.k)]
    if c.family == Family.REST and c.draft and not c.draft.startswith(BUILTIN_PREFIX):
        args += ["--datastore", paths.get(c.draft, c.draft)]
    elif c.family == Family.DRAFT_MODEL and c.draft:
        args += ["--draft", paths.get(c.draft, c.draft)]
    return args
