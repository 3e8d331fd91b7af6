"""L0 hardware profiles and the memory feasibility check ("does the draft fit
alongside the target on this GPU class?").

The fit check (`check_fit`) is stated, never silent: per device count (1, 2, 4, ... up to
the profile's most), the target's weights in its own dtype, its KV cache for the workload's
context and the largest known draft model, against each device's usable memory; and, on a
GPU with FP8 tensor cores, the same with FP8 weights. A request that names its device count
(the deployment's tensor-parallel degree, which L4 respects and never searches) is planned on
exactly that many or refused with the options; one that names none is planned on the
fewest that hold the target, and the report says that this was assumed.

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
from speccatalog.targets import TargetError, TargetInfo, resolve_target

GiB = 1024**3
GB = 1000**3
CPU_DEFAULT_MEMORY = 24 * GiB
# Share of device memory an engine may use (vLLM's gpu_memory_utilization default).
MEMORY_UTILIZATION = 0.9
# The largest deployment the fit check considers (two 8-GPU nodes); L4 respects the
# deployment's TP and never searches it (L3).
MAX_DEVICES = 16
FP8_BYTES = 1
DTYPE_NAMES = {4: "fp32", 2: "bf16", 1: "fp8"}  # a 16-bit fp16 checkpoint weighs what bf16 does


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
    fp8: bool = False  # FP8 tensor cores (Hopper, Ada): FP8 weights are an option here


PROFILES: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        HardwareProfile(
            "H100-80GB", "gpu", 80 * GiB, 3.35e12 * 0.85, 989e12 * 0.6, 20e-6, 0.5e-3, 2, fp8=True
        ),
        HardwareProfile("H200", "gpu", 141 * GB, 4.8e12 * 0.85, 989e12 * 0.6, 20e-6, 0.5e-3, 2, fp8=True),
        HardwareProfile("A100-80GB", "gpu", 80 * GiB, 2.039e12 * 0.85, 312e12 * 0.6, 20e-6, 0.5e-3, 2),
        HardwareProfile("L40S", "gpu", 48 * GB, 864e9 * 0.85, 362e12 * 0.6, 20e-6, 0.5e-3, 2, fp8=True),
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


@dataclass(frozen=True, slots=True)
class FitRow:
    """Memory per device of one deployment: `devices` devices, weights in `weight_dtype_bytes`."""

    devices: int
    weight_dtype_bytes: int
    weights: int  # the target's weights, sharded
    kv_cache: int  # the target's KV cache for the working context and batch, sharded
    draft: int  # the largest known draft model and its KV cache, whole on one device (not sharded)
    usable: int

    @property
    def fits(self) -> bool:
        """The target and its KV cache fit (a draft that does not is pruned, not the run)."""
        return self.weights + self.kv_cache <= self.usable

    @property
    def fits_with_draft(self) -> bool:
        return self.weights + self.kv_cache + self.draft <= self.usable


@dataclass(frozen=True, slots=True)
class Fit:
    """The fit check of one target on one profile: a row per device count, in the target's dtype
    and (on an FP8-capable GPU, for a wider checkpoint) with FP8 weights."""

    target: TargetInfo
    profile: HardwareProfile
    requested: int  # the request's device count; 1 when it names none
    stated: bool  # whether the request named it
    context_tokens: int
    batch: int
    draft_ref: str | None  # the largest known draft model, if the target has one
    rows: tuple[FitRow, ...]  # the target's own dtype, by device count
    fp8_rows: tuple[FitRow, ...]  # FP8 weights; empty where that is no option

    @property
    def dtype_bytes(self) -> int:
        return self.rows[0].weight_dtype_bytes

    def row(self, devices: int, *, fp8: bool = False) -> FitRow | None:
        return next((r for r in (self.fp8_rows if fp8 else self.rows) if r.devices == devices), None)

    @property
    def fits_as_requested(self) -> bool:
        row = self.row(self.requested)
        return row is not None and row.fits

    @property
    def smallest_fitting(self) -> int | None:
        """The fewest devices that hold the target in its own dtype (None: not even the most)."""
        return next((r.devices for r in self.rows if r.fits), None)

    @property
    def assumed(self) -> int | None:
        """The device count the plan uses: the requested one if it holds the target; for a request
        that named none, the fewest that do; None when the run cannot be planned."""
        if self.fits_as_requested:
            return self.requested
        fewest = self.smallest_fitting
        return None if self.stated or fewest is None else fewest

    def options(self) -> list[str]:
        """What would hold the target where the requested device count does not (empty when it does)."""
        if self.fits_as_requested:
            return []
        name = self.profile.name
        found: list[str] = []
        fp8 = self.row(self.requested, fp8=True)
        if fp8 is not None and fp8.fits:
            found.append(
                f"FP8 weights on {self.requested} x {name}: {_gib(fp8.weights + fp8.kv_cache)} of "
                f"{_gib(fp8.usable)} usable per device; an FP8 checkpoint is a quantization (L2's "
                "choice, not L4's), so it is run as a target of its own"
            )
        fewest = self.smallest_fitting
        if fewest is not None:
            found.append(
                f"{fewest} x {name} in {DTYPE_NAMES.get(self.dtype_bytes, 'its dtype')} (tensor parallel "
                f"{fewest}): set target.gpu_count to {fewest}"
            )
        elif self.profile.kind == "cpu":
            found.append("a CPU host with more memory: gpu cpu-<N>GB")
        return found

    def summary(self) -> str:
        """One paragraph: what the target needs, whether the requested devices hold it, what was
        assumed and the options."""
        need = self.row(1) or self.rows[0]
        per = need.devices
        dtype = DTYPE_NAMES.get(self.dtype_bytes, f"{self.dtype_bytes}-byte")
        head = (
            f"{self.target.ref} in {dtype} needs {_gib((need.weights + need.kv_cache) * per)} "
            f"({_gib(need.weights * per)} of weights and {_gib(need.kv_cache * per)} of KV cache for "
            f"{self.context_tokens} tokens x {self.batch} sequence{'' if self.batch == 1 else 's'})"
        )
        asked = self.row(self.requested)
        usable = _gib(asked.usable * asked.devices) if asked else "less"
        where = f"{self.requested} x {self.profile.name}"
        if self.fits_as_requested:
            text = f"{head}; {where} offers {usable} usable: it fits"
            if asked is not None and self.draft_ref and not asked.fits_with_draft:
                text += f", but not beside the largest draft {self.draft_ref} ({_gib(asked.draft)})"
            return text + "."
        text = f"{head}; {where} offers {usable} usable: it does not fit."
        assumed = self.assumed
        if assumed is not None:
            text += f" Planned on {assumed} x {self.profile.name}: the request names no gpu_count."
        options = self.options()
        if options:
            text += " Options: " + "; ".join(options) + "."
        return text


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def device_counts(profile: HardwareProfile) -> tuple[int, ...]:
    """1, 2, 4, ... up to the profile's most devices."""
    return tuple(2**i for i in range(profile.max_devices.bit_length()) if 2**i <= profile.max_devices)


def largest_draft(target: TargetInfo) -> TargetInfo | None:
    """The largest known draft model of the target (heads are smaller than any of them)."""
    drafts = []
    for ref in target.drafts:
        try:
            drafts.append(resolve_target(ref))
        except TargetError:
            continue
    return max(drafts, key=lambda d: d.params, default=None)


def _row(
    target: TargetInfo,
    profile: HardwareProfile,
    devices: int,
    *,
    weight_bytes: int,
    act_bytes: int,
    draft: TargetInfo | None,
    context_tokens: int,
    batch: int,
) -> FitRow:
    kv = target.kv_elems_per_token * act_bytes * context_tokens * batch
    draft_bytes = 0
    if draft is not None:
        draft_bytes = (draft.params + draft.kv_elems_per_token * context_tokens * batch) * act_bytes
    return FitRow(
        devices=devices,
        weight_dtype_bytes=weight_bytes,
        weights=math.ceil(target.params * weight_bytes / devices),
        kv_cache=math.ceil(kv / devices),
        draft=draft_bytes,
        usable=int(profile.memory_bytes * MEMORY_UTILIZATION),
    )


def check_fit(
    target: TargetInfo,
    profile: HardwareProfile,
    *,
    context_tokens: int,
    batch: int,
    devices: int | None = None,
) -> Fit:
    """The fit report of `target` on `devices` (None: the request names no count) of `profile`.

    Raises HardwareError when the request names more devices than the profile has (a CPU host
    is one). The KV cache and drafts stay in the target's dtype when the weights are FP8.
    """
    if devices is not None and not 1 <= devices <= profile.max_devices:
        raise HardwareError(
            f"gpu_count {devices} is not a deployment of {profile.name}: it has 1 to {profile.max_devices}"
            + (" (a CPU host is one device)" if profile.kind == "cpu" else "")
        )
    dtype = runtime_dtype_bytes(target, profile)
    draft = largest_draft(target)
    counts = sorted({*device_counts(profile), devices or 1})

    def rows_with(weight_bytes: int) -> tuple[FitRow, ...]:
        return tuple(
            _row(
                target,
                profile,
                n,
                weight_bytes=weight_bytes,
                act_bytes=dtype,
                draft=draft,
                context_tokens=context_tokens,
                batch=batch,
            )
            for n in counts
        )

    fp8 = profile.kind == "gpu" and profile.fp8 and dtype > FP8_BYTES
    return Fit(
        target=target,
        profile=profile,
        requested=devices or 1,
        stated=devices is not None,
        context_tokens=context_tokens,
        batch=batch,
        draft_ref=draft.ref if draft is not None else None,
        rows=rows_with(dtype),
        fp8_rows=rows_with(FP8_BYTES) if fp8 else (),
    )


def deployment(fit: Fit) -> Deployment:
    """The deployment a plan uses: the fit's assumed device count in the target's dtype.

    Raises TargetDoesNotFit, whose message is the fit's summary with its options, when the
    requested devices cannot hold the target and no other count may be assumed.
    """
    devices = fit.assumed
    if devices is None:
        raise TargetDoesNotFit(fit.summary())
    return Deployment(fit.target, fit.profile, devices, fit.dtype_bytes, fit.context_tokens, fit.batch)


def deploy(
    target: TargetInfo,
    profile: HardwareProfile,
    *,
    context_tokens: int,
    batch: int,
    devices: int | None = None,
) -> Deployment:
    """The deployment on `devices` devices, or (None) the fewest that hold the target's weights and
    KV cache; TargetDoesNotFit when they cannot (check_fit says why and what would)."""
    return deployment(check_fit(target, profile, context_tokens=context_tokens, batch=batch, devices=devices))


def extra_per_device(deployment: Deployment, cost: DraftCost) -> int:
    """Bytes a candidate adds on the busiest device: heads shard with the target, draft models do not."""
    extra = cost.extra_bytes(deployment.dtype_bytes, deployment.context_tokens, deployment.batch)
    return math.ceil(extra / deployment.devices) if cost.sharded else extra


def fits_beside(deployment: Deployment, cost: DraftCost) -> bool:
    """Whether the candidate's draft weights, heads, datastore and draft KV fit beside the target."""
    return extra_per_device(deployment, cost) <= deployment.headroom_per_device()
