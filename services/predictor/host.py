"""What the predictor reads from the machine it runs on: its GPU and local model directories.

The predictor never imports torch (seconds of import and hundreds of MB for one
boolean): the host's GPU comes from SPECOPS_HOST_GPU, or from `nvidia-smi` when that
is `auto`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import subprocess
from pathlib import Path
from typing import Any

from speccatalog.hardware import resolve_profile
from speccatalog.targets import TargetInfo, parse_hf_config
from specops_schemas.catalog import Engine
from specops_services.predictor.logic import profile_of_gpu_name
from specops_services.predictor.plan import CPU_BENCH, GPU_BENCH, BenchDefaults, HostInfo
from specops_services.predictor.settings import PredictorSettings
from specplatform import engines

log = logging.getLogger(__name__)

AUTO = "auto"
NVIDIA_SMI_TIMEOUT_S = 10.0


def gpu_name() -> str | None:
    """Name of GPU 0 as `nvidia-smi` reports it, or None without a working NVIDIA driver."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("nvidia-smi failed, assuming no GPU: %r", exc)
        return None
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return names[0] if names else None


def host_info(settings: PredictorSettings) -> HostInfo:
    """The host as planning sees it; UnknownHardware if SPECOPS_HOST_GPU names no profile,
    ValueError if SPECOPS_MEASURED_ENGINES names an unknown engine."""
    engines = measured_engines(settings.measured_engines)
    info = dataclasses.replace(_host_hardware(settings), engines=engines)
    sizes = (
        settings.bench_reps,
        settings.bench_prompts,
        settings.bench_new_tokens,
        settings.bench_candidates,
    )
    if sizes == (None, None, None, None):
        return info
    default = GPU_BENCH if info.cuda else CPU_BENCH
    bench = BenchDefaults(
        reps=settings.bench_reps or default.reps,
        n_prompts=settings.bench_prompts or default.n_prompts,
        max_new_tokens=settings.bench_new_tokens or default.max_new_tokens,
        candidates=settings.bench_candidates or default.candidates,
    )
    return dataclasses.replace(info, bench=bench)


def measured_engines(setting: str) -> frozenset[Engine]:
    """The engines SPECOPS_MEASURED_ENGINES names; `auto`: speccore and the installed ones."""
    if setting.strip().lower() == AUTO:
        installed = {Engine(name) for name in engines.ENVIRONMENTS if engines.state(name).runnable}
        return frozenset({Engine.SPECCORE, *installed})
    return frozenset(Engine(e.strip()) for e in setting.split(",") if e.strip())


def _host_hardware(settings: PredictorSettings) -> HostInfo:
    if settings.host_gpu.lower() == AUTO:
        name = gpu_name()
        if name is None:
            return HostInfo(cuda=False, hub_access=settings.hub_access)
        profile = profile_of_gpu_name(name)
        if profile is None:
            log.warning("GPU %r matches no hardware profile; no run is measured here on a GPU", name)
        return HostInfo(cuda=True, gpu_profile=profile, hub_access=settings.hub_access)
    profile = resolve_profile(settings.host_gpu)
    if profile.kind == "cpu":
        return HostInfo(cuda=False, hub_access=settings.hub_access)
    return HostInfo(cuda=True, gpu_profile=profile.name, hub_access=settings.hub_access)


def local_target(model_ref: str) -> TargetInfo | None:
    """The target described by `<model_ref>/config.json` for an absolute directory, else None.

    None lets planning resolve the ref among known ids and aliases (and say it is unknown).
    A config.json that lacks what the predictor needs raises InvalidModelConfig.
    """
    path = Path(model_ref)
    if not path.is_absolute():
        return None
    try:
        config: Any = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    return parse_hf_config(config, model_ref)
