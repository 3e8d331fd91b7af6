"""Train and evaluate the workload-fingerprint classifier on the prompt sets specops ships.

Data: every workload's set (speccatalog.workloads: the eight fingerprints and agentic), up
to CAP prompts each; long_context at several token budgets, so length is learned beyond the
default 1792 tokens. A text found in ``chat`` and in another set (ShareGPT story requests,
MT-Bench writing questions) keeps the other set's label.

Split: by *source*, the item a prompt was built around (``rag:sharegpt:X`` and
``long_context:sharegpt:X`` are both ``sharegpt:X``; an agentic edit step's source is its
HumanEval task), HELD_OUT_SHARE of the sources by CRC-32; every prompt of a source is on
one side. MT-Bench is on neither: its 80 questions are written by people, not by the sets'
templates, and are scored separately with each question's category mapped to a
fingerprint, twice: as the shipped sets label them (writing/roleplay are creative, the rest
chat) and by intent (coding is code, math and reasoning are reasoning, extraction is
structured). The template-made sets share their instructions between the sides of the
split, so the MT-Bench numbers are the fairer estimate on traffic from elsewhere.

Model: multinomial logistic regression (speccatalog.fingerprint.classifier) over hashed
words, word pairs and shape features, class-balanced, L2-regularised, fitted full-batch
with torch; the weights go to the library's model.json with the hash of the training data.

    .venv/bin/python bench/fingerprint.py    # make fingerprint
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import re
import sys
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from common import machine

from speccatalog.fingerprint import classifier
from speccatalog.fingerprint.features import DIMENSIONS, features
from speccatalog.workloads import WORKLOADS
from speccore.errors import SpecError
from specprompts.derived import long_context_prompts
from specprompts.sets import load_prompts
from specprompts.sources import Prompt, mtbench_categories, mtbench_pool

CAP = 1500
HELD_OUT_SHARE = 25  # percent of sources
LONG_CONTEXT_BUDGETS = (1792, 4096, 8192, 16384)
EPOCHS = 400
L2 = 1e-5
BATCH_SIZES = (1, 4, 16)  # samples pooled per inference in the per-file accuracy
PROJECT_MAPPING = {"writing": "creative", "roleplay": "creative"}  # the rest: chat
INTENT_MAPPING = {
    "writing": "creative",
    "roleplay": "creative",
    "coding": "code",
    "math": "reasoning",
    "reasoning": "reasoning",
    "extraction": "structured",
    "stem": "chat",
    "humanities": "chat",
}
RESULTS = Path("bench/results/fingerprint-accuracy.json")
PAGE = Path("docs/results/fingerprint.md")
COMMAND = ".venv/bin/python bench/fingerprint.py"

_WORKLOAD_PREFIX = re.compile(rf"^(?:{'|'.join(WORKLOADS)}):")
_STEP_SUFFIX = re.compile(r"/(?:edit|attempt)\d+$")

Example = tuple[str, str, str]  # (label, source, text)


def source_of(prompt_id: str) -> str:
    """The item a prompt was built around: its id less the workload prefix and step suffix."""
    return _STEP_SUFFIX.sub("", _WORKLOAD_PREFIX.sub("", prompt_id))


def _shown(path: Path) -> str:
    """A path as the results show it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def held_out(source: str) -> bool:
    return zlib.crc32(source.encode()) % 100 < HELD_OUT_SHARE


def available(load: Callable[[int], list[Prompt]], cap: int) -> list[Prompt]:
    """The first min(cap, all) prompts of a set (a larger n extends a smaller one)."""
    low, high = 0, cap
    while low < high:
        mid = (low + high + 1) // 2
        try:
            load(mid)
        except SpecError:
            high = mid - 1
        else:
            low = mid
    return load(low)


def examples() -> list[Example]:
    by_text: dict[str, Example] = {}
    for workload in WORKLOADS:
        if workload == "long_context":
            share = CAP // len(LONG_CONTEXT_BUDGETS)
            prompts = [
                p
                for budget in LONG_CONTEXT_BUDGETS
                for p in available(
                    functools.partial(long_context_prompts, seed=budget, max_tokens=budget), share
                )
            ]
        else:
            prompts = available(functools.partial(load_prompts, workload), CAP)
        for p in prompts:
            if p.text in by_text and workload == "chat":
                continue
            if by_text.get(p.text, ("",))[0] not in ("", "chat"):
                continue
            by_text[p.text] = (workload, source_of(p.id), p.text)
    return [ex for ex in by_text.values() if not ex[1].startswith("mtbench:")]


def matrix(texts: list[str]) -> torch.Tensor:
    """The texts' feature vectors as one dense [texts, DIMENSIONS] matrix (about 250 MB here:
    dense matmuls beat sparse ones, whose backward pass re-sorts the indices every epoch)."""
    x = torch.zeros(len(texts), DIMENSIONS)
    for r, text in enumerate(texts):
        vector = features(text)
        x[r, list(vector)] = torch.tensor(list(vector.values()))
    return x


def fit(x: torch.Tensor, y: torch.Tensor, n_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    weights = torch.zeros(DIMENSIONS, n_classes, requires_grad=True)
    bias = torch.zeros(n_classes, requires_grad=True)
    counts = torch.bincount(y, minlength=n_classes).float()
    balance = counts.sum() / (n_classes * counts)
    opt = torch.optim.Adam([weights, bias], lr=0.05)
    for _ in range(EPOCHS):
        opt.zero_grad()
        logits = x @ weights + bias
        loss = torch.nn.functional.cross_entropy(logits, y, weight=balance) + L2 * weights.pow(2).sum()
        loss.backward()
        opt.step()
    return weights.detach(), bias.detach()


def scores(truth: list[str], predicted: list[str], labels: list[str]) -> dict[str, Any]:
    confusion = {t: dict.fromkeys(labels, 0) for t in labels}
    for t, p in zip(truth, predicted, strict=True):
        confusion[t][p] += 1
    recall = {
        t: round(confusion[t][t] / sum(row.values()), 4) for t, row in confusion.items() if sum(row.values())
    }
    accuracy = sum(t == p for t, p in zip(truth, predicted, strict=True)) / len(truth)
    return {
        "n": len(truth),
        "accuracy": round(accuracy, 4),
        "balanced_accuracy": round(sum(recall.values()) / len(recall), 4),
        "recall": recall,
        "confusion": {t: {p: n for p, n in row.items() if n} for t, row in confusion.items()},
    }


def pooled_accuracy(per_sample: list[dict[str, float]], truth: list[str], size: int) -> dict[str, Any]:
    """Accuracy of pooling `size` held-out samples of one workload into one fingerprint (what
    `specops fingerprint` does with a file), over consecutive groups per workload."""
    groups: dict[str, list[dict[str, float]]] = defaultdict(list)
    for probabilities, label in zip(per_sample, truth, strict=True):
        groups[label].append(probabilities)
    right = total = 0
    for label, items in groups.items():
        for start in range(0, len(items) - size + 1, size):
            inference = classifier.pool(items[start : start + size])
            right += inference is not None and inference.fingerprint == WORKLOADS[label].fingerprint
            total += 1
    return {"samples_per_inference": size, "inferences": total, "accuracy": round(right / total, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--model", type=Path, default=classifier.MODEL_FILE)
    parser.add_argument("--page", type=Path, default=PAGE)
    args = parser.parse_args()
    started = time.time()

    data = examples()
    labels = list(WORKLOADS)
    train = [ex for ex in data if not held_out(ex[1])]
    test = [ex for ex in data if held_out(ex[1])]
    digest = hashlib.sha256(json.dumps(sorted(data)).encode()).hexdigest()
    print(
        f"{len(train)} training and {len(test)} held-out prompts ({time.time() - started:.0f} s)",
        file=sys.stderr,
    )

    y = torch.tensor([labels.index(ex[0]) for ex in train])
    x = matrix([ex[2] for ex in train])
    print(f"features ({time.time() - started:.0f} s)", file=sys.stderr)
    weights, bias = fit(x, y, len(labels))
    print(f"fitted ({time.time() - started:.0f} s)", file=sys.stderr)
    encoded = classifier.encode_model(labels, weights.T.tolist(), bias.tolist())
    encoded["data_sha256"] = digest
    args.model.write_text(json.dumps(encoded) + "\n")
    model = classifier.decode_model(encoded)

    per_sample = classifier.classify([ex[2] for ex in test], model)
    predicted = [max(p, key=p.__getitem__) for p in per_sample]
    truth = [ex[0] for ex in test]
    heldout = scores(truth, predicted, labels)
    fold = {name: spec.fingerprint for name, spec in WORKLOADS.items()}
    heldout["fingerprint_accuracy"] = round(
        sum(fold[t] == fold[p] for t, p in zip(truth, predicted, strict=True)) / len(truth), 4
    )
    heldout["pooled"] = [pooled_accuracy(per_sample, truth, size) for size in BATCH_SIZES]

    categories = mtbench_categories()
    mtbench = list(mtbench_pool())
    mt_predicted = [
        fold[max(p, key=p.__getitem__)] for p in classifier.classify([p.text for p in mtbench], model)
    ]
    fingerprints = [name for name, spec in WORKLOADS.items() if spec.fingerprint == name]
    by_project = [PROJECT_MAPPING.get(categories[p.id], "chat") for p in mtbench]
    by_intent = [INTENT_MAPPING[categories[p.id]] for p in mtbench]

    result = {
        "date": time.strftime("%Y-%m-%d"),
        "command": COMMAND,
        "model": _shown(args.model),
        "data_sha256": digest,
        "classes": labels,
        "train": dict(Counter(ex[0] for ex in train)),
        "held_out": heldout,
        "mtbench_as_labelled": scores(by_project, mt_predicted, fingerprints),
        "mtbench_by_intent": scores(by_intent, mt_predicted, fingerprints),
        "seconds": round(time.time() - started, 1),
        "machine": machine(),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.page.write_text(page(result))
    print(f"held-out accuracy {heldout['accuracy']}", file=sys.stderr)


def page(result: dict[str, Any]) -> str:
    """docs/results/fingerprint.md from a result."""
    held = result["held_out"]
    pooled = ", ".join(f"{p['accuracy']:.3f} pooling {p['samples_per_inference']}" for p in held["pooled"])
    lines = [
        "# Workload fingerprint inference",
        "",
        "<!-- Written by bench/fingerprint.py (make fingerprint); do not edit. -->",
        "",
        f"**Measured:** {result['date']}.  ",
        f"**Reproduce:** `make fingerprint` (`{result['command']}`)  ",
        "**Results:** `bench/results/fingerprint-accuracy.json` (in the repository).",
        "",
        "The model is `libs/speccatalog/fingerprint/model.json` "
        f"(training data sha256 `{result['data_sha256'][:16]}...`). How it works: "
        "[concepts/runs](../concepts/runs.md#inferring-the-fingerprint).",
        "",
        "## Held out: the shipped prompt sets",
        "",
        f"{held['n']} prompts whose sources were held out of training: accuracy "
        f"**{held['accuracy']:.3f}** per prompt (balanced {held['balanced_accuracy']:.3f}); "
        f"per fingerprint, agentic counted as structured, {held['fingerprint_accuracy']:.3f}; "
        f"{pooled} prompts of one set into one answer.",
        "",
        _confusion_table(held),
        "",
        "These sets are partly built from templates (the RAG instruction, the long-context "
        "header, the structured tasks' schemas), and both sides of the split share them, so "
        "this is an upper bound for traffic that does not come from these sets.",
        "",
        "## MT-Bench: questions no template wrote",
        "",
        "MT-Bench's 80 questions are left out of training and scored by their category.",
        "",
        f"- As the shipped sets label them (writing and roleplay creative, the rest chat): "
        f"**{result['mtbench_as_labelled']['accuracy']:.3f}**.",
        f"- By intent (coding code, math and reasoning reasoning, extraction structured, "
        f"writing and roleplay creative, stem and humanities chat): "
        f"**{result['mtbench_by_intent']['accuracy']:.3f}**.",
        "",
        _confusion_table(result["mtbench_by_intent"]),
        "",
        "A question asked in prose is chat to the classifier whatever it asks for: the shipped "
        "`code` set is HumanEval stubs (code to complete), `reasoning` MMLU and word problems "
        "with a step-by-step instruction, and ShareGPT's own coding and writing requests are "
        "in `chat`. A deployment whose users ask for code in prose should state `code` (or "
        "answer the wizard) rather than rely on `auto`.",
        "",
    ]
    return "\n".join(lines)


def _confusion_table(scores_: dict[str, Any]) -> str:
    labels = [t for t in scores_["confusion"] if t in scores_["recall"]]
    predicted = sorted({p for row in scores_["confusion"].values() for p in row})
    rows = [
        "| true \\ inferred | " + " | ".join(predicted) + " | recall |",
        "|---" * (len(predicted) + 2) + "|",
    ]
    for t in labels:
        cells = [str(scores_["confusion"][t].get(p, "")) for p in predicted]
        rows.append(f"| {t} | " + " | ".join(cells) + f" | {scores_['recall'][t]:.3f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
