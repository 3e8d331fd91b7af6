"""Predictor settings: the runtime's connection settings plus the predictor's own knobs."""

from __future__ import annotations

from pydantic import AliasChoices, Field

from specplatform.settings import Settings, service_settings


class PredictorSettings(Settings):
    """Read from `SPECOPS_*` (and DATABASE_URL / NATS_URL, see specplatform.settings)."""

    host_gpu: str = Field(
        "auto",
        description="SPECOPS_HOST_GPU: the hardware profile this host measures (`cpu`, `H100-80GB`, "
        "`h100`, ...). `auto` asks `nvidia-smi` for GPU 0 and is `cpu` where there is none. A run "
        "is measured here only when its `target.gpu` names this profile.",
    )
    hub_access: bool = Field(
        False,
        description="SPECOPS_HUB_ACCESS: Hugging Face ids can be downloaded here, so runs on them are "
        "measured; otherwise only the offline aliases and local directories are.",
    )
    measured_engines: str = Field(
        "auto",
        description="SPECOPS_MEASURED_ENGINES: comma-separated engines whose runs are measured here "
        "(speccore, vllm, sglang), or `auto`: speccore and every engine whose environment "
        "`specops engines install` made (specplatform.engines). vLLM and SGLang only where the "
        "benchmark-runner can launch them (SPECOPS_BENCH_VLLM_COMMAND, ...). A run on another engine "
        "gets the predicted winner, unmeasured; on the `cpu` profile it is refused.",
    )
    enable_cascade: bool = Field(
        False,
        validation_alias=AliasChoices("ENABLE_L4_CASCADE", "enable_cascade"),
        description="ENABLE_L4_CASCADE: let the catalog propose cascade candidates (stretch).",
    )
    bench_reps: int | None = Field(
        None,
        ge=1,
        le=100,
        description="SPECOPS_BENCH_REPS: reps per bench planned here (default 2 on CPU, 3 on GPU).",
    )
    bench_prompts: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="SPECOPS_BENCH_PROMPTS: prompts per bench (default 3 on CPU, 10 on GPU).",
    )
    bench_new_tokens: int | None = Field(
        None,
        ge=1,
        le=32_768,
        description="SPECOPS_BENCH_NEW_TOKENS: tokens per prompt (default 48 on CPU, 128 on GPU); smoke "
        "tests and scaling checks shrink benches with these three, at the cost of noisier speedups.",
    )
    bench_candidates: int | None = Field(
        None,
        ge=1,
        le=64,
        description="SPECOPS_BENCH_CANDIDATES: candidates a T1 bench measures beside the baseline (default "
        "3: the best of each family, then the next best); on an engine launched per candidate each is a "
        "server start.",
    )
    predictor_history_rows: int = Field(
        500, ge=0, le=100_000, description="Newest measured_history rows of a fingerprint read per plan."
    )
    predictor_pool_size: int = Field(4, ge=2, le=100, description="Largest number of Postgres connections.")


def predictor_settings(given: Settings | None = None) -> PredictorSettings:
    """The predictor's settings; `given` (what `specops serve` loaded) says where the servers are."""
    return service_settings(PredictorSettings, given)
