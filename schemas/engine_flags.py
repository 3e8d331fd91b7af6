"""Translate a candidate into the flags of the engine that will serve it: what the gateway's
apply answers, and what the benchmark-runner launches an HTTP engine with.

Each family's spec (speccatalog.families) renders its own settings, under the flag and
key names of the engines' own config classes (vLLM's SpeculativeConfig, SGLang's
ServerArgs); this module wraps them for the wire and as launch arguments:

- vLLM: one ``--speculative-config`` JSON (``method``, ``model``,
  ``num_speculative_tokens``, ...). vLLM takes no static tree.
- SGLang: ``--speculative-algorithm``, ``--speculative-draft-model-path``,
  ``--speculative-num-steps``, ``--speculative-eagle-topk``,
  ``--speculative-num-draft-tokens`` (which counts the verified root) and, for NGRAM,
  ``--speculative-ngram-{min,max}-bfs-breadth``.
- speccore: the candidate itself, and its CLI flags.

Both engines' flags are checked against the keys and values their pinned source accepts
(speccatalog.engine_args); a setting outside them is refused rather than handed out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from speccatalog import families
from speccatalog.engine_args import EngineArgsError, check_sglang_args, check_vllm_config
from speccatalog.families.base import EngineRefusal
from specops_schemas.api import ApplyResponse, EngineConfig, SglangConfig, SpeccoreConfig, VllmConfig
from specops_schemas.candidates import Candidate
from specops_schemas.catalog import Engine


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
    spec = families.family(candidate.family)
    draft_path = paths.get(candidate.draft) if candidate.draft else None
    try:
        if engine == Engine.VLLM:
            if candidate.tree:
                raise EngineRefusal(
                    "vLLM cannot run this candidate: it takes no static draft tree; apply a chain candidate"
                )
            fields = {k: v for k, v in spec.vllm(candidate, draft_path).items() if v is not None}
            check_vllm_config(fields)  # before the wire model, which would fail on an unknown key
            vllm = VllmConfig(engine="vllm", **fields)
            body = vllm.model_dump(exclude={"engine"}, exclude_none=True)
            return vllm, ["--speculative-config", json.dumps(body, separators=(",", ":"))]
        if engine == Engine.SGLANG:
            fields = {k: v for k, v in spec.sglang(candidate, draft_path).items() if v is not None}
            check_sglang_args(_sglang_args(fields))
            sglang = SglangConfig(engine="sglang", **fields)
            return sglang, _sglang_args(sglang.model_dump(exclude={"engine"}, exclude_none=True))
        args = spec.speccore_args(candidate, paths)
    except EngineRefusal as exc:
        raise EngineCannotRun(str(exc)) from None
    except EngineArgsError as exc:
        raise EngineCannotRun(f"{engine.value} would reject this candidate's flags: {exc}") from None
    return SpeccoreConfig(engine="speccore", candidate=candidate), args


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
        requires=list(families.family(candidate.family).engine_packages.get(str(engine), ())),
    )


def _sglang_args(fields: Mapping[str, object]) -> list[str]:
    """Each ServerArgs field as its launch flag (``--field-name value``), in order."""
    args: list[str] = []
    for name, value in fields.items():
        args += ["--" + name.replace("_", "-"), str(value)]
    return args
