"""Benchmark-runner settings: the runtime's connection settings plus the runner's own knobs."""

from __future__ import annotations

import shlex
import sys
from typing import Literal

from pydantic import Field

from specplatform import engines
from specplatform.hostlock import MeasureLockDir
from specplatform.settings import Settings, service_settings


class BenchmarkRunnerSettings(Settings):
    """`SPECOPS_THREADS`, `SPECOPS_BENCH_*` (plus NATS_URL / DATABASE_URL, see specplatform.settings).

    HTTP engines (measure_http.py): a plan for vLLM or SGLang, and a speccore plan when
    `bench_speccore` is `server`, is measured on OpenAI-compatible servers the runner
    launches with `bench_<engine>_command` (one per method, on free ports), or attaches
    to where `bench_engine_urls` names a method's server.
    """

    threads: int = Field(2, ge=1, le=1024, description="CPU threads PyTorch may use.")
    bench_device: str = Field("auto", description="Where the target runs: auto, cpu or cuda.")
    bench_dtype: str = Field("auto", description="Target dtype: auto, float32, bfloat16 or float16.")
    bench_models: int = Field(1, ge=1, le=16, description="Targets kept loaded between benches.")
    measure_lock_dir: MeasureLockDir
    bench_ack_wait_s: float = Field(
        15.0,
        gt=0.0,
        le=300.0,
        description="Seconds after which a bench whose runner died is redelivered; a live runner "
        "extends it by a heartbeat every third of it, however long the bench takes.",
    )

    bench_speccore: Literal["inprocess", "server"] = Field(
        "inprocess",
        description="SPECOPS_BENCH_SPECCORE: how a speccore plan is measured: in this process, or "
        "over HTTP on `specops serve engine` servers (the protocol vLLM and SGLang are measured with).",
    )
    bench_vllm_command: str = Field(
        "",
        description="SPECOPS_BENCH_VLLM_COMMAND: the vLLM executable (`<it> serve <model> ...`); default: "
        "the one `specops engines install vllm` installed, else `vllm` on the PATH.",
    )
    bench_sglang_command: str = Field(
        "python -m sglang.launch_server",
        description="SPECOPS_BENCH_SGLANG_COMMAND: SGLang's launcher (`<it> --model-path <model> ...`).",
    )
    bench_specops_command: str = Field(
        f"{shlex.quote(sys.executable)} -m specops.cli",
        description="SPECOPS_BENCH_SPECOPS_COMMAND: the specops CLI (`<it> serve engine --model ...`); "
        "default: this interpreter's.",
    )
    bench_engine_args: str = Field(
        "",
        description="SPECOPS_BENCH_ENGINE_ARGS: arguments added to every launched server, e.g. "
        "`--gpu-memory-utilization 0.2` so that vLLM's baseline and candidates fit one GPU together.",
    )
    bench_engine_urls: dict[str, str] = Field(
        default_factory=dict,
        description="SPECOPS_BENCH_ENGINE_URLS: JSON of method (`baseline` or a candidate id) -> base URL "
        "of a running server to measure it on instead of launching one (left running afterwards).",
    )
    bench_engine_start_timeout_s: float = Field(
        900.0, gt=0.0, description="Seconds a launched server has to answer /health (model load included)."
    )
    bench_engine_request_timeout_s: float = Field(
        600.0, gt=0.0, description="Seconds one HTTP generation may take before the method fails."
    )

    def engine_command(self, engine: str) -> list[str]:
        """The executable part of the launch command of `engine` (vllm, sglang, specops): the
        setting, else the engine's installed environment (specplatform.engines), else its name."""
        given = getattr(self, f"bench_{engine}_command")
        if given:
            return shlex.split(given)
        return engines.launcher(engine) or [engine]

    def engine_args(self, engine: str) -> list[str]:
        """Server settings of every launch of `engine`: the setting, else those of the engine's
        installed environment when that is what launches (specplatform.engines), else none."""
        if self.bench_engine_args:
            return shlex.split(self.bench_engine_args)
        env = engines.ENVIRONMENTS.get(engine)
        own = env is not None and not getattr(self, f"bench_{engine}_command")
        return list(env.server_args) if own and env is not None else []


def runner_settings(given: Settings | None = None) -> BenchmarkRunnerSettings:
    """The runner's settings; `given` (what `specops serve` loaded) says where the servers are."""
    return service_settings(BenchmarkRunnerSettings, given)
