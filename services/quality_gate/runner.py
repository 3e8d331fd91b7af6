"""The service's gate on real models: the cached target and one blocking call per candidate.

`GateRunner.evaluate` blocks (it decodes on speccore); the app calls it in a worker
thread. The target stays loaded between benches (speccore's ModelCache),
and so does the QualityGate of the last plan, whose reference outputs (the target
decoding alone) are then shared by every candidate of that plan.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from speccatalog import families
from speccatalog.artifacts import find_head, is_head_id
from speccatalog.families.base import DraftSource
from speccore.errors import SpecError
from speccore.model_cache import ModelCache
from speccore.models import LoadedModel
from speccore.sampling import SamplingParams
from specops_schemas.candidates import Candidate, GateOutcome, Measurement
from specops_schemas.catalog import Engine, GateMethod
from specops_schemas.events import BenchPlan
from specops_schemas.heads import HeadGateResult, HeadTrained
from specops_services.quality_gate import heads, logic
from specops_services.quality_gate.constraints import constraint_outcome
from specops_services.quality_gate.decoding import describe
from specops_services.quality_gate.gate import QualityGate, pending, skipped
from specops_services.quality_gate.mmlu import mmlu_outcome
from specops_services.quality_gate.sample import GateSample, Thresholds
from specops_services.quality_gate.settings import QualityGateSettings
from specplatform.hostlock import DeviceLock, device_lock_name
from specprompts.corpora import candidate_datastore
from specprompts.sets import prompts_for_model


class GateRunner:
    """Gates one candidate at a time against its plan's target. Blocking; thread-safe."""

    def __init__(self, settings: QualityGateSettings, models: ModelCache | None = None) -> None:
        self.settings = settings
        self.models = models if models is not None else ModelCache(settings.gate_models)
        self._lock = threading.Lock()
        self.device_lock = DeviceLock(settings.measure_lock_dir, device_lock_name(settings.gate_device))
        self._gate: tuple[tuple[str, GateSample], QualityGate] | None = None

    def evaluate(
        self,
        plan: BenchPlan,
        candidate: Candidate,
        *,
        tenant_id: str | None = None,
        measured: Measurement | None = None,
    ) -> GateOutcome:
        """The plan's gate method on `candidate` (of `tenant_id`'s bench: a rest draft may name
        one of its uploaded corpora; `measured`: its bench summary).

        `skipped` and `pending` load nothing. A candidate measured on an engine server
        (vLLM, SGLang, `specops serve engine`) is gated on the evidence its bench gathered
        there, loading nothing either (`_over_http`); a vLLM or SGLang candidate without
        it (logit_kl, which needs each token's whole distribution) fails closed.
        A candidate the gate cannot run on gets a failed verdict (logic.gate_unavailable); a
        target that cannot be loaded raises speccore.model_cache.ModelLoadError, which fails
        the whole run.
        """
        method = plan.quality_gate
        if method == GateMethod.SKIPPED:
            return skipped()
        if method == GateMethod.PENDING:
            return pending()
        over_http = _over_http(plan, candidate, measured)
        if over_http is not None:
            return over_http
        if plan.target.engine != Engine.SPECCORE:
            why = (
                f"a {plan.target.engine} candidate is gated on the evidence its bench gathered on the engine "
                f"servers, which it did not report for {method}"
            )
            if method == GateMethod.LOGIT_KL:
                why = (
                    "logit_kl needs each emitted token's whole distribution, which an engine server does not "
                    f"return (vLLM: at most 20 log-probabilities a position), so a {plan.target.engine} "
                    "candidate cannot be gated on it; choose topk5, exact, mmlu_slice or constraint_violation"
                )
            return logic.gate_unavailable(method, candidate, SpecError(why))
        # The gate decodes on the same device a benchmark-runner measures on: a gate running
        # beside a bench would skew its timings, so it takes the device's host lock as well.
        purpose = f"gate of {candidate.candidate_id} in run {plan.run_id}"
        with self._lock, self.device_lock.held(purpose):
            # Worker threads start with PyTorch's default; the service's budget applies to each.
            torch.set_num_threads(self.settings.threads)
            gate = self._gate_for(plan)
            try:
                resolved = self._with_head(candidate, tenant_id)
                resolved = self._with_datastore(gate.reference.target, plan, resolved, tenant_id)
                return gate.evaluate(method, resolved, SamplingParams.of(plan.sampling))
            # Whatever the candidate's engine raises (bad options, a draft that does not
            # load, OOM, a proposer bug) costs that candidate, not the run; the error is
            # kept in the verdict's details.
            except Exception as err:
                return logic.gate_unavailable(method, candidate, err)

    def evaluate_head(self, trained: HeadTrained, tenant_id: str) -> HeadGateResult:
        """Gate a trained head on its held-out prompts (services/quality_gate/heads.py).

        Raises ModelLoadError (the target), heads.HeadUnusable (the artifact: missing,
        altered, or not decodable on the target) or SpecError (no held-out prompt)."""
        request = trained.request
        root = self.settings.artifact_root
        head_dir = find_head(root, tenant_id, trained.head_id)
        if head_dir is None or head_dir.name != trained.artifact.sha256:
            raise heads.HeadUnusable(
                f"head {trained.head_id} has no artifact {trained.artifact.sha256} in tenant "
                f"{tenant_id}'s store ({root}); is SPECOPS_ARTIFACT_DIR the trainer's?"
            )
        try:
            n = request.gate.n_prompts
            prompts = heads.heldout_prompts(root, trained.train_path, trained.heldout_path, n)
        except OSError as err:
            raise SpecError(f"the held-out prompts cannot be read from the artifact store: {err}") from err
        purpose = f"gate of head {trained.head_id}"
        with self._lock, self.device_lock.held(purpose):
            torch.set_num_threads(self.settings.threads)
            target = self.models.get(request.target, self.settings.gate_device, self.settings.gate_dtype)
            return heads.evaluate_head(target, head_dir, request.gate, prompts)

    def _with_head(self, candidate: Candidate, tenant_id: str | None) -> Candidate:
        """A candidate drafting with a registry head (`hd-...`) with the head's directory in
        the tenant's part of the artifact store (speccatalog.artifacts.find_head)."""
        if not is_head_id(candidate.draft):
            return candidate
        path = resolve_head(self.settings.artifact_root, tenant_id, str(candidate.draft))
        return candidate.model_copy(update={"draft": str(path)})

    def _gate_for(self, plan: BenchPlan) -> QualityGate:
        target = self.models.get(plan.target.model_ref, self.settings.gate_device, self.settings.gate_dtype)
        key = (plan.target.model_ref, self.settings.sample(plan))
        if self._gate is None or self._gate[0] != key or self._gate[1].reference.target is not target:
            self._gate = (key, QualityGate(target, key[1]))
        return self._gate[1]

    def _with_datastore(
        self, target: LoadedModel, plan: BenchPlan, candidate: Candidate, tenant_id: str | None
    ) -> Candidate:
        """A rest candidate with its datastore (`builtin:<workload>`, none, or an uploaded
        corpus) as a file path: the same file the benchmark-runner measured with
        (specprompts.corpora.candidate_datastore)."""
        if families.family(candidate.family).draft_source != DraftSource.DATASTORE:
            return candidate
        prompts = prompts_for_model(
            target, str(plan.fingerprint), plan.n_prompts, max_new_tokens=plan.max_new_tokens, seed=plan.seed
        )
        path = candidate_datastore(
            target,
            candidate.draft,
            str(plan.fingerprint),
            frozenset(p.id for p in prompts),
            tenant_id=tenant_id,
            artifact_root=self.settings.artifact_root,
        )
        return candidate if path is None else candidate.model_copy(update={"draft": str(path)})


def _over_http(plan: BenchPlan, candidate: Candidate, measured: Measurement | None) -> GateOutcome | None:
    """The verdict on what the candidate's bench gathered on its engine servers, if it did:
    `exact` on its greedy outputs against the baseline server's (`greedy_agreement`), `topk5`
    on its outputs scored by the baseline vLLM server (`top5`), `mmlu_slice` on both servers'
    answers (`mmlu`), `constraint_violation` on both servers' JSON replies or code completions
    (`structured`)."""
    if measured is None:
        return None
    method, thresholds = plan.quality_gate, Thresholds()
    if method == GateMethod.EXACT and measured.greedy_agreement is not None:
        return logic.exact_over_http(candidate, measured.greedy_agreement, thresholds.exact)
    if method == GateMethod.TOPK5 and measured.top5 is not None:
        return logic.topk5_over_http(candidate, measured.top5, thresholds.topk5)
    if method == GateMethod.MMLU_SLICE and measured.mmlu is not None:
        outcome = mmlu_outcome(measured.mmlu, thresholds.mmlu_slice)
        reason = "MMLU answers of the candidate's engine server against the baseline server's"
        return logic.judged_over_http(candidate, outcome, reason)
    if method == GateMethod.CONSTRAINT_VIOLATION and measured.structured is not None:
        decoding = describe(SamplingParams.of(plan.sampling))
        outcome = constraint_outcome(measured.structured, decoding, thresholds.constraint_violation)
        code = measured.structured.check == "python_syntax"
        what = "code completions that do not parse" if code else "JSON-Schema violations"
        reason = f"{what} of the candidate's engine server's replies against the baseline's"
        return logic.judged_over_http(candidate, outcome, reason)
    return None


def resolve_head(root: Path, tenant_id: str | None, head_id: str) -> Path:
    """The trained head directory of registry head ``head_id``; SpecError when the tenant has none."""
    found = find_head(root, tenant_id, head_id) if tenant_id is not None else None
    if found is None:
        raise SpecError(
            f"head {head_id} has no trained artifact in tenant {tenant_id}'s artifact store ({root})"
        )
    return found
