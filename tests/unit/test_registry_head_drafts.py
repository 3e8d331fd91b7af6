"""A candidate drafting with a tenant's registry head (`hd-...`) is measured and gated with the
head's trained directory in that tenant's part of the artifact store, and with no other's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from heads import frequent_ids, save_random_head

from speccatalog.artifacts import head_artifact_path, head_digest, new_head_id
from speccore.errors import SpecError
from speccore.models import LoadedModel
from specops_schemas.api import Target
from specops_schemas.candidates import Candidate
from specops_schemas.events import BenchPlan
from specops_services.benchmark_runner.measure import Corpora, candidate_engine
from specops_services.benchmark_runner.protocol import CandidateFailed
from specops_services.quality_gate.runner import resolve_head

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def registry(smollm: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path]:
    root = tmp_path_factory.mktemp("store")
    head_id = new_head_id()
    work = save_random_head(smollm, "medusa", root / "work", frequent_ids(smollm), num_heads=2)
    config = json.loads((work / "config.json").read_text())
    config["provenance"] = {"head_id": head_id}
    (work / "config.json").write_text(json.dumps(config))
    final = root / head_artifact_path("acme", head_digest(work))
    shutil.copytree(work, final)
    return root, head_id, final


def _plan() -> BenchPlan:
    return BenchPlan(
        run_id="run-1",
        target=Target(model_ref="smollm2-135m-instruct", gpu="cpu", engine="speccore"),
        fingerprint="chat",
        mode="interactive",
        quality_gate="exact",
        candidates=[Candidate(candidate_id="c", family="ngram", k=2)],
        reps=1,
        n_prompts=1,
        max_new_tokens=8,
    )


def test_the_benchmark_runner_and_the_gate_find_the_tenants_head(
    smollm: LoadedModel, registry: tuple[Path, str, Path]
) -> None:
    root, head_id, final = registry
    candidate = Candidate(candidate_id="medusa-k2", family="medusa", k=2, draft=head_id)
    engine = candidate_engine(smollm, candidate, _plan(), frozenset(), Corpora("acme", root))
    assert engine.method == "medusa"
    assert resolve_head(root, "acme", head_id) == final
    with pytest.raises(CandidateFailed, match="no trained artifact in tenant other"):
        candidate_engine(smollm, candidate, _plan(), frozenset(), Corpora("other", root))
    with pytest.raises(SpecError, match="no trained artifact"):
        resolve_head(root, "other", head_id)
