"""T1 planning: resolve, enumerate, prune, predict, rank, and decide what to measure here.

Serving point per request:

- context: the fingerprint's working context (speccatalog.workloads, capped at the
  target's), the size the KV cache must hold per sequence;
- temperature: chat and creative endpoints sample (0.7 and 1.0), the others are
  greedy (speccatalog.workloads). It selects the acceptance prior's bucket and the
  bench's sampling;
- batch: interactive = batch 1 for latency and 8 concurrent streams for throughput;
  batch mode = 32 for both.
- devices: the request's `target.gpu_count`, or the fewest that hold the target in its own
  dtype (speccatalog.hardware.check_fit); the run's `fit` report says which, and what else
  would hold it where the requested devices do not.

Bench defaults: on a CPU host a T1 confirmation must stay quick (a 135M model decodes
~8-15 tokens/s on 2 threads), so 2 reps x 3 prompts x 48 new tokens per method: with
the baseline and 3 candidates that is ~1,150 tokens, about two minutes. GPU hosts
measure 3 reps x 10 prompts x 128 tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from speccatalog import families
from speccatalog.artifacts import is_head_id
from speccatalog.families.base import BUILTIN_PREFIX
from speccatalog.hardware import (
    DTYPE_NAMES,
    Deployment,
    Fit,
    GiB,
    HardwareError,
    HardwareProfile,
    check_fit,
    deployment,
    resolve_profile,
)
from speccatalog.public_heads import public_heads
from speccatalog.targets import DatastoreRef, HeadRef, TargetError, TargetInfo, resolve_target
from speccatalog.workloads import workload_spec
from speccore.heads.builtin import builtin_heads
from specops_schemas.api import FitReport, FitRow, RunCreateRequest
from specops_schemas.candidates import Candidate, RankedCandidate, Sampling
from specops_schemas.catalog import Engine, ErrorStage, Fingerprint, Mode
from specops_schemas.events import BenchPlan, RunPredicted
from specops_services.predictor.calibration import Calibration, calibration_for
from specops_services.predictor.catalog import Pruned, build_catalog, known_for
from specops_services.predictor.model import HistoryRow, Workload, predict
from specops_services.predictor.scoring import predicted_front, rank
from specplatform import engines

MODE_BATCHES: dict[Mode, tuple[int, int]] = {Mode.INTERACTIVE: (1, 8), Mode.BATCH: (32, 32)}
# Candidates a T1 bench measures beside the baseline, unless the host says otherwise.
TOP_N = 3
BUILTIN_DATASTORE_BYTES = 64 << 20  # measured 27-41 MB for smollm2 (bench/results)
# An uploaded corpus is indexed as int32 tokens + an int32 suffix array (8 bytes a token)
# at ~3.5 bytes of text a token (BPE on English and code; smollm2 on the stdlib: 3.6).
INDEX_BYTES_PER_CORPUS_BYTE = 8 / 3.5


@dataclass(frozen=True, slots=True)
class BenchDefaults:
    reps: int
    n_prompts: int
    max_new_tokens: int
    candidates: int = TOP_N  # measured beside the baseline (pick_for_bench)


CPU_BENCH = BenchDefaults(reps=2, n_prompts=3, max_new_tokens=48)
GPU_BENCH = BenchDefaults(reps=3, n_prompts=10, max_new_tokens=128)


class EngineNotInstalled(HardwareError):
    """A `cpu`-profile run on an engine this host cannot launch (error_stage `validation`):
    on a CPU a prediction alone says nothing, so the run is refused with the fix."""


class NoFeasibleCandidate(ValueError):
    """Every candidate was pruned (error_stage `prediction`)."""


def error_stage(exc: BaseException) -> ErrorStage | None:
    """The error stage a planning exception maps to, or None if it is not a planning error.

    validation errors (unknown model or GPU, a target too large for its profile) are the
    client's to fix and answer 4xx.
    """
    if isinstance(exc, TargetError | HardwareError):
        return ErrorStage.VALIDATION
    if isinstance(exc, NoFeasibleCandidate):
        return ErrorStage.PREDICTION
    return None


@dataclass(frozen=True, slots=True)
class HostInfo:
    """What the service knows about the machine it runs on."""

    cuda: bool
    gpu_profile: str | None = None  # L0 profile name of this host's GPU, if it has one
    hub_access: bool = False  # Hugging Face ids can be downloaded here
    bench: BenchDefaults | None = None  # the bench size measured here; None: CPU_BENCH / GPU_BENCH
    # Engines the benchmark-runner measures here: speccore in-process, vLLM and SGLang over HTTP
    # where they are installed (SPECOPS_MEASURED_ENGINES); a run on another is predicted.
    engines: frozenset[Engine] = frozenset({Engine.SPECCORE})


@dataclass(frozen=True, slots=True)
class Plan:
    run_id: str
    target: TargetInfo
    fit: Fit
    deployment: Deployment
    workload: Workload
    ranked: list[RankedCandidate]  # best first, non-empty
    pareto_front: list[str]
    pruned: list[Pruned]
    measurable_here: bool
    not_measurable_reason: str | None  # set exactly when measurable_here is False
    bench_plan: BenchPlan | None  # set exactly when measurable_here is True

    def run_predicted(self) -> RunPredicted:
        return RunPredicted(
            run_id=self.run_id,
            candidates=self.ranked,
            pareto_front=self.pareto_front,
            fit=fit_report(self.fit, self.deployment),
        )


def fit_report(fit: Fit, planned: Deployment) -> FitReport:
    """The fit check as the run records it (GiB rounded to 0.1)."""
    rows = [
        FitRow(
            gpus=r.devices,
            weight_dtype=DTYPE_NAMES.get(r.weight_dtype_bytes, f"{r.weight_dtype_bytes}-byte"),
            weights_gib=round(r.weights / GiB, 1),
            kv_cache_gib=round(r.kv_cache / GiB, 1),
            draft_gib=round(r.draft / GiB, 1),
            usable_gib=round(r.usable / GiB, 1),
            fits=r.fits,
            fits_with_draft=r.fits_with_draft,
        )
        for r in (*fit.rows, *fit.fp8_rows)
    ]
    return FitReport(
        gpu=fit.profile.name,
        requested_gpus=fit.requested,
        gpus_stated=fit.stated,
        planned_gpus=planned.devices,
        weight_dtype=DTYPE_NAMES.get(planned.dtype_bytes, f"{planned.dtype_bytes}-byte"),
        context_tokens=fit.context_tokens,
        batch=fit.batch,
        largest_draft=fit.draft_ref,
        fits_as_requested=fit.fits_as_requested,
        rows=rows,
        options=fit.options(),
        summary=fit.summary(),
    )


@dataclass(frozen=True, slots=True)
class UploadedDatastore:
    """A corpus the run's tenant uploaded (registry.datastore_registered): raw text, indexed
    with whichever target's tokenizer measures it."""

    datastore_id: str
    corpus_bytes: int
    fingerprints: frozenset[str] = frozenset()

    def ref(self, target: TargetInfo) -> DatastoreRef:
        """The datastore as the catalog sees it for ``target``: built with its tokenizer."""
        return DatastoreRef(
            datastore_id=self.datastore_id,
            tokenizer=target.tokenizer,
            size_bytes=max(1, round(self.corpus_bytes * INDEX_BYTES_PER_CORPUS_BYTE)),
            fingerprints=self.fingerprints,
        )


def builtin_datastore_refs(target: TargetInfo, fingerprint: Fingerprint) -> list[DatastoreRef]:
    """The built-in REST datastore of the fingerprint's workload, if it has one (its corpus:
    speccatalog.workloads), built with the target's tokenizer."""
    if workload_spec(fingerprint).corpus is None:
        return []
    return [
        DatastoreRef(
            datastore_id=f"{BUILTIN_PREFIX}{fingerprint}",
            tokenizer=target.tokenizer,
            size_bytes=BUILTIN_DATASTORE_BYTES,
            fingerprints=frozenset({fingerprint}),
        )
    ]


def builtin_head_refs(target: TargetInfo) -> list[HeadRef]:
    """The trained heads speccore ships for an offline alias (speccore.heads.builtin); their
    held-out chain acceptance is the predictor's acceptance for them."""
    decoders = {artifact: spec for spec in families.families().values() for artifact in spec.head_artifacts}
    return [
        HeadRef(
            head_id=head.head_id,
            family=decoders[head.family].name,
            target_ref=target.ref,
            num_heads=head.num_heads,
            eagle_version=decoders[head.family].head_artifacts[head.family],
            acceptance=head.acceptance,
            path=str(head.path),
        )
        for head in builtin_heads(target.ref)
        if head.family in decoders
    ]


def _check_engine_runs(engine: Engine, profile: HardwareProfile, host: HostInfo) -> None:
    """EngineNotInstalled for a `cpu` run on an engine this CPU host does not measure."""
    if profile.kind != "cpu" or host.cuda or engine in host.engines:
        return
    env = engines.ENVIRONMENTS.get(str(engine))
    fix = (
        f"install it with `{env.install_command}` (`make setup` does), then restart the predictor"
        if env is not None
        else f"specops does not install {engine} here; where its server runs, add it to "
        "SPECOPS_MEASURED_ENGINES and set the benchmark-runner's launch command"
    )
    raise EngineNotInstalled(
        f"the cpu profile measures {engine} on this host, but it cannot launch it: {fix}"
    )


def _why_not_measurable(request: RunCreateRequest, target: TargetInfo, host: HostInfo) -> str | None:
    engine = request.target.engine
    profile = resolve_profile(request.target.gpu)
    if engine not in host.engines:
        measured = ", ".join(sorted(host.engines)) or "no engine"
        return (
            f"{engine} is not measured here (SPECOPS_MEASURED_ENGINES: {measured}); its winner is predicted"
        )
    if not (target.local or host.hub_access):
        return f"{target.ref} cannot be loaded here (not an offline alias or a local directory)"
    if profile.kind == "cpu" and host.cuda:
        return "the cpu profile is measured on hosts without CUDA; this host has a GPU"
    if profile.kind == "gpu" and host.gpu_profile != profile.name:
        here = host.gpu_profile or "no GPU"
        return f"this host has {here}, not {profile.name}"
    return None


def pick_for_bench(ranked: Sequence[RankedCandidate], n: int) -> list[Candidate]:
    """The best of each family in rank order, then the next best overall, up to n.

    A T1 confirmation learns most from distinct families: variants of one family mostly
    differ in k, which the predictor models better than the family's acceptance. A
    tenant's registry head (T3, a ``hd-...`` draft) is always measured: the best-ranked
    candidate of the best-ranked registry head is picked first, whatever its rank, and
    the picks are returned in rank order.
    """
    picked: list[Candidate] = []
    seen: set[str] = set()
    head = next((r.candidate for r in ranked if is_head_id(r.candidate.draft)), None)
    if head is not None and n > 0:
        picked.append(head)
        seen.add(head.family)
    for r in ranked:
        if len(picked) < n and r.candidate.family not in seen:
            picked.append(r.candidate)
            seen.add(r.candidate.family)
    for r in ranked:
        if len(picked) < n and r.candidate not in picked:
            picked.append(r.candidate)
    order = {r.candidate.candidate_id: i for i, r in enumerate(ranked)}
    return sorted(picked, key=lambda c: order[c.candidate_id])


def _public_heads(target: TargetInfo, engine: Engine) -> list[HeadRef]:
    """The published heads (speccatalog.public_heads) trained for this exact target that the
    run's engine loads: vLLM and SGLang runs only (speccore reads its own head layout)."""
    if engine not in (Engine.VLLM, Engine.SGLANG):
        return []
    return [h.ref() for h in public_heads(target.ref, str(engine))]


def plan_run(
    request: RunCreateRequest,
    *,
    run_id: str,
    host: HostInfo,
    history: Sequence[HistoryRow] = (),
    available_heads: Iterable[HeadRef] = (),
    available_datastores: Iterable[DatastoreRef] = (),
    target: TargetInfo | None = None,
    enable_cascade: bool = False,
    calibrations: Sequence[Calibration] = (),
) -> Plan:
    """Plan a T1 run; pure: every fact about the world comes in as an argument.

    target: pass parse_hf_config(...) for a local directory; None resolves the model_ref
    among known ids and aliases (UnknownModel otherwise). Raises TargetError or
    HardwareError (validation) and NoFeasibleCandidate (prediction); see error_stage().
    calibrations: the host's calibration files (calibration.py); the one of this target and
    hardware profile, if any, calibrates every prediction.
    """
    info = target or resolve_target(request.target.model_ref)
    profile = resolve_profile(request.target.gpu)
    _check_engine_runs(request.target.engine, profile, host)
    fingerprint = request.workload.fingerprint
    spec = workload_spec(fingerprint)
    latency_batch, throughput_batch = MODE_BATCHES[request.mode]
    fit = check_fit(
        info,
        profile,
        context_tokens=min(spec.context, info.context),
        batch=latency_batch,
        devices=request.target.gpu_count,
    )
    dep = deployment(fit)
    sampling = Sampling.for_fingerprint(fingerprint)
    workload = Workload(
        fingerprint=fingerprint,
        temperature=sampling.temperature,
        latency_batch=latency_batch,
        throughput_batch=throughput_batch,
    )
    heads = list(available_heads)
    stores = list(available_datastores)
    if request.target.engine == Engine.SPECCORE and info.local:
        stores += builtin_datastore_refs(info, fingerprint)
        heads += builtin_head_refs(info)
    heads += _public_heads(info, request.target.engine)
    known = known_for(info, heads=heads, datastores=stores, enable_cascade=enable_cascade)
    catalog = build_catalog(dep, fingerprint, request.target.engine, known)
    if not catalog.kept:
        reasons = sorted({p.reason for p in catalog.pruned})
        raise NoFeasibleCandidate(f"no candidate survives pruning: {'; '.join(reasons)}")
    calibration = calibration_for(calibrations, info.ref, profile.name)
    estimates = [
        predict(c, dep, workload, known, gpu=profile.name, history=history, calibration=calibration)
        for c in catalog.kept
    ]
    ranked = rank(estimates, request.goal.priorities, request.mode)
    reason = _why_not_measurable(request, info, host)
    bench = None
    if reason is None:
        defaults = host.bench or (CPU_BENCH if profile.kind == "cpu" else GPU_BENCH)
        bench = BenchPlan(
            run_id=run_id,
            target=request.target,
            fingerprint=fingerprint,
            mode=request.mode,
            quality_gate=request.goal.quality_gate,
            candidates=pick_for_bench(ranked, defaults.candidates),
            reps=defaults.reps,
            n_prompts=defaults.n_prompts,
            max_new_tokens=defaults.max_new_tokens,
            sampling=sampling,
            seed=0,
        )
    return Plan(
        run_id=run_id,
        target=info,
        fit=fit,
        deployment=dep,
        workload=workload,
        ranked=ranked,
        pareto_front=predicted_front(ranked),
        pruned=catalog.pruned,
        measurable_here=reason is None,
        not_measurable_reason=reason,
        bench_plan=bench,
    )
