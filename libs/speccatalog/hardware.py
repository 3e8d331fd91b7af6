"""L0 hardware profiles and the memory feasibility check ("does the draft fit
alongside the target on this GPU class?").

Bandwidth and FLOP/s are *sustained* estimates: the datasheet peak times 0.85 for HBM
bandwidth and 0.6 for dense bf16 tensor throughput. The ``cpu`` numbers are measured
on the 2-core project machines (speccore float32, packed kernels and the lean decoder):
~20 GB/s read bandwidth (bench/results/*-cpu2.json, 17-60 GB/s with the neighbours'
load), ~90 GFLOP/s from the verify cost of larger blocks (12 tokens cost 1.28x one,
16 tokens 1.44-1.49x), and ~0.2 ms of framework overhead per layer and forward
(smollm2 takes ~33 ms a step where its 538 MB of weights alone need ~27 ms).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from speccatalog.costs import DraftCost
from speccatalog.targets import TargetInfo

GiB = 1024**3
GB = 1000**3
CPU_DEFAULT_MEMORY = 24 * GiB
# Share of device memory an engine may use (vLLM's gpu_memory_utilization default).
MEMORY_UTILIZATION = 0.9
# The largest deployment the predictor assumes for a target that does not fit one device
# (two 8-GPU nodes); L4 respects the deployment's TP and never searches it (L3).
MAX_DEVICES = 16


class HardwareError(ValueError):
    """The hardware profile is unknown or cannot hold the target (error_stage `validation`)."""


class UnknownHardware(HardwareError):
    pass


class TargetDoesNotFit(HardwareError):
    pass


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    name: str
    kind: Literal["gpu", "cpu"]
    memory_bytes: int  # per device
    bandwidth: float  # sustained bytes/s per device
    flops: float  # sustained FLOP/s per device
    layer_overhead_s: float  # launch / framework time per layer and forward
    spec_step_overhead_s: float  # bookkeeping of one speculative step (sampling, tree masks)
    runtime_dtype_bytes: int  # bytes per weight at run time (speccore on CPU runs float32)
    max_devices: int = MAX_DEVICES


PROFILES: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        HardwareProfile("H100-80GB", "gpu", 80 * GiB, 3.35e12 * 0.85, 989e12 * 0.6, 20e-6, 0.5e-3, 2),
        HardwareProfile("H200", "gpu", 141 * GB, 4.8e12 * 0.85, 989e12 * 0.6, 20e-6, 0.5e-3, 2),
        HardwareProfile("A100-80GB", "gpu", 80 * GiB, 2.039e12 * 0.85, 312e12 * 0.6, 20e-6, 0.5e-3, 2),
        HardwareProfile("L40S", "gpu", 48 * GB, 864e9 * 0.85, 362e12 * 0.6, 20e-6, 0.5e-3, 2),
        HardwareProfile("cpu", "cpu", CPU_DEFAULT_MEMORY, 20e9, 90e9, 0.2e-3, 1e-3, 4, max_devices=1),
    )
}
_ALIASES = {"h100": "H100-80GB", "h100-sxm": "H100-80GB", "h200-141gb": "H200", "a100": "A100-80GB"}
_ALIASES.update({"l40s-48gb": "L40S"})
_CPU_SIZED = re.compile(r"cpu-(\d{1,5})(gb|gib)", re.IGNORECASE)


def resolve_profile(name: str) -> HardwareProfile:
    """The profile for `name` (case-insensitive); `cpu-<N>GB` is a CPU host with N GiB of RAM."""
    by_lower = {n.lower(): p for n, p in PROFILES.items()}
    profile = by_lower.get(name.lower()) or PROFILES.get(_ALIASES.get(name.lower(), ""))
    if profile is not None:
        return profile
    sized = _CPU_SIZED.fullmatch(name)
    if sized and int(sized.group(1)) > 0:
        cpu = PROFILES["cpu"]
        return HardwareProfile(
            name=name,
            kind="cpu",
            memory_bytes=int(sized.group(1)) * GiB,
            bandwidth=cpu.bandwidth,
            flops=cpu.flops,
            layer_overhead_s=cpu.layer_overhead_s,
            spec_step_overhead_s=cpu.spec_step_overhead_s,
            runtime_dtype_bytes=cpu.runtime_dtype_bytes,
            max_devices=1,
        )
    raise UnknownHardware(
        f"unknown gpu profile '{name}'; known: {', '.join(PROFILES)} (or cpu-<N>GB for a CPU host)"
    )


@dataclass(frozen=True, slots=True)
class Deployment:
    """The target as the predictor assumes it is served: on `devices` devices of `profile`."""

    target: TargetInfo
    profile: HardwareProfile
    devices: int
    dtype_bytes: int
    context_tokens: int  # working context per sequence the KV cache must hold
    batch: int  # concurrent sequences the KV cache must hold

    @property
    def weight_bytes(self) -> int:
        return self.target.params * self.dtype_bytes

    def kv_bytes(self, batch: int | None = None) -> int:
        n = self.batch if batch is None else batch
        return self.target.kv_elems_per_token * self.dtype_bytes * self.context_tokens * n

    @property
    def usable_per_device(self) -> int:
        return int(self.profile.memory_bytes * MEMORY_UTILIZATION)

    def headroom_per_device(self, batch: int | None = None) -> int:
        """Bytes left on each device beside the sharded target weights and KV cache."""
        return self.usable_per_device - math.ceil((self.weight_bytes + self.kv_bytes(batch)) / self.devices)

    def sequences_that_fit(self, extra_bytes: int = 0, extra_kv_per_seq: int = 0) -> int:
        """Concurrent sequences the memory holds beside the weights and `extra_bytes` per device."""
        free = self.usable_per_device * self.devices - self.weight_bytes - extra_bytes * self.devices
        per_seq = (
            self.target.kv_elems_per_token * self.dtype_bytes * self.context_tokens
            + extra_kv_per_seq * self.devices
        )
        return max(0, free // per_seq)


def runtime_dtype_bytes(target: TargetInfo, profile: HardwareProfile) -> int:
    # fp8 checkpoints stay fp8 on GPUs; speccore upcasts everything to float32 on CPU.
    if profile.kind == "cpu":
        return profile.runtime_dtype_bytes
    return min(target.dtype_bytes, profile.runtime_dtype_bytes)


def deploy(target: TargetInfo, profile: HardwareProfile, *, context_tokens: int, batch: int) -> Deployment:
    """The smallest power-of-two device count whose memory holds the target's weights and KV cache.

    Raises TargetDoesNotFit when even `profile.max_devices` devices cannot.
    """
    dtype = runtime_dtype_bytes(target, profile)
    devices = 1
    while True:
        dep = Deployment(target, profile, devices, dtype, context_tokens, batch)
        if dep.headroom_per_device() >= 0:
            return dep
        if devices * 2 > profile.max_devices:
            need = (dep.weight_bytes + dep.kv_bytes()) / GB
            have = profile.memory_bytes * profile.max_devices / GB
            raise TargetDoesNotFit(
                f"{target.ref} needs {need:.1f} GB for its weights and KV cache "
                f"({context_tokens} tokens x {batch} sequences) but {profile.max_devices} x "
                f"{profile.name} offer {have:.1f} GB; pick a larger profile"
                + (" such as cpu-<N>GB" if profile.kind == "cpu" else "")
            )
        devices *= 2


def extra_per_device(deployment: Deployment, cost: DraftCost) -> int:
    """Bytes a candidate adds on the busiest device: heads shard with the target, draft models do not."""
    extra = cost.extra_bytes(deployment.dtype_bytes, deployment.context_tokens, deployment.batch)
    return math.ceil(extra / deployment.devices) if cost.sharded else extra


def fits_beside(deployment: Deployment, cost: DraftCost) -> bool:
    """Whether the candidate's draft weights, heads, datastore and draft KV fit beside the target."""
    return extra_per_device(deployment, cost) <= deployment.headroom_per_device()
