"""Self-distilled training data in resumable chunks (speccore.training.chunks): a rerun writes
only the files a killed run did not finish, with the same bytes, and refuses another plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speccore.errors import SpecError
from speccore.models import LoadedModel, file_sha256
from speccore.split import is_heldout
from speccore.training.chunks import HELDOUT, MANIFEST, train_name
from speccore.training.data import Example, read_examples
from speccore.training.prepare import DataPlan, prepare_chunks
from speccore.training.run import HeadPlan, train_head

PROMPTS = [
    f"Name {n} things that are {c}."
    for n in ("two", "three", "four")
    for c in ("red", "round", "loud", "cold")
]
PLAN = DataPlan(limit=len(PROMPTS), heldout_fraction=0.2, distill=True, max_new_tokens=6, batch_size=4)


def _source(limit: int, seed: int) -> list[Example]:
    return [Example(p, "(to be replaced)", id=f"test:{i}") for i, p in enumerate(PROMPTS[:limit])]


def test_a_rerun_writes_only_the_missing_files_with_the_same_bytes(
    smollm: LoadedModel, tmp_path: Path
) -> None:
    out = tmp_path / "chunks"
    store = prepare_chunks(smollm, PLAN, _source, out, chunk_examples=4)
    heldout = [p for p in PROMPTS if is_heldout(p, PLAN.heldout_fraction)]
    train_files = -(-(len(PROMPTS) - len(heldout)) // 4)
    assert sorted(store.files) == sorted([HELDOUT] + [train_name(i) for i in range(train_files)])
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["reply_tokens"] == sum(f["reply_tokens"] for f in manifest["files"]) > 0
    assert {f["made_on"] for f in manifest["files"]} == {"cpu float32"}
    first = list(read_examples(out / train_name(0)))
    assert [ex.prompt for ex in first] == [p for p in PROMPTS if p not in heldout][:4]
    assert all(ex.completion != "(to be replaced)" for ex in first)  # the target's replies

    # A run killed while writing chunk 1, and chunk 0 damaged since: both are written again.
    kept = {name: (out / name).stat().st_mtime_ns for name in store.files}
    before = {name: (out / name).read_bytes() for name in store.files}
    (out / train_name(1)).unlink()
    (out / train_name(0)).write_text("")
    again = prepare_chunks(smollm, PLAN, _source, out, chunk_examples=4)
    assert {name: (out / name).read_bytes() for name in again.files} == before  # greedy: same bytes
    rewritten = {name for name in again.files if (out / name).stat().st_mtime_ns != kept[name]}
    assert rewritten == {train_name(0), train_name(1)}


def test_a_directory_of_another_plan_is_refused(smollm: LoadedModel, tmp_path: Path) -> None:
    out = tmp_path / "chunks"
    prepare_chunks(smollm, DataPlan(limit=4, distill=False), _source, out, chunk_examples=2)
    with pytest.raises(SpecError, match="another plan"):
        prepare_chunks(smollm, DataPlan(limit=4, distill=False), _source, out, chunk_examples=3)


def test_a_head_trains_on_a_chunk_directory_and_refuses_a_changed_file(
    smollm: LoadedModel, tmp_path: Path
) -> None:
    out = tmp_path / "chunks"
    prepare_chunks(
        smollm, DataPlan(limit=12, heldout_fraction=0.2, distill=False), _source, out, chunk_examples=4
    )
    train_prompts = [ex.prompt for path in sorted(out.glob("train-*.jsonl")) for ex in read_examples(path)]
    heldout = list(read_examples(out / HELDOUT))
    plan = HeadPlan(family="eagle", epochs=1, draft_vocab=512, max_len=96, batch_tokens=200, ttt_steps=2)
    result = train_head(smollm, plan, out, None, tmp_path / "head", progress=False)
    provenance = json.loads((tmp_path / "head" / "config.json").read_text())["provenance"]
    assert provenance["data"]["sha256"] == file_sha256(out / MANIFEST)
    assert provenance["data"]["examples"] == len(train_prompts)
    assert provenance["heldout"]["examples"] == len(heldout) == 12 - len(train_prompts) > 0
    assert provenance["plan"]["ttt_steps"] == 2
    assert result.stopped_by == "epochs"

    (out / train_name(1)).write_text((out / train_name(1)).read_text().replace("Name", "List"))
    with pytest.raises(SpecError, match="differs from"):
        train_head(smollm, plan, out, None, tmp_path / "again", progress=False)
