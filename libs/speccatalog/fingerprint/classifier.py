"""The workload a deployment's sample prompts come from: a linear classifier over
:mod:`.features`, and the vote of many samples.

Glossary:

- *class*: one of the prompt sets the classifier was trained on: the eight fingerprints
  and ``agentic`` (speccatalog.workloads). An agentic sample counts for the fingerprint it
  measures, ``structured`` (:func:`speccatalog.workloads.fingerprint_of`), when samples
  are pooled into one fingerprint.
- *probabilities*: softmax(W x + b) of one sample over the classes (multinomial logistic
  regression; ``bench/fingerprint.py`` fits W and b and writes :data:`MODEL_FILE`).
- *confidence*: the winner's probability averaged over the samples; the *runner-up* is
  the fingerprint with the next highest average.

Pure Python over a sparse vector (a few hundred non-zero features a prompt), so the
CLI's core install, the gateway and the engine server all run it without numpy.
"""

from __future__ import annotations

import array
import base64
import functools
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speccatalog.fingerprint.features import DIMENSIONS, features
from speccatalog.workloads import fingerprint_of

MODEL_FILE = Path(__file__).with_name("model.json")
MODEL_FORMAT = 1


@dataclass(frozen=True, slots=True)
class Model:
    """Trained weights: one row of DIMENSIONS weights and a bias per class."""

    classes: tuple[str, ...]
    weights: tuple[tuple[float, ...], ...]  # [class][feature]
    bias: tuple[float, ...]  # [class]

    def probabilities(self, vector: Mapping[int, float]) -> dict[str, float]:
        """softmax(W x + b) of one sparse feature vector, by class."""
        logits = [
            b + sum(row[i] * value for i, value in vector.items())
            for row, b in zip(self.weights, self.bias, strict=True)
        ]
        top = max(logits)
        exps = [math.exp(logit - top) for logit in logits]
        total = sum(exps)
        return {name: e / total for name, e in zip(self.classes, exps, strict=True)}


def encode_model(classes: Sequence[str], weights: Sequence[Sequence[float]], bias: Sequence[float]) -> dict:
    """The JSON form of a model: each class's weights as little-endian float32, base64."""
    rows = []
    for row in weights:
        packed = array.array("f", row)
        rows.append(base64.b64encode(packed.tobytes()).decode())
    return {
        "format": MODEL_FORMAT,
        "dimensions": DIMENSIONS,
        "classes": list(classes),
        "bias": list(bias),
        "weights": rows,
    }


def decode_model(data: Mapping[str, Any]) -> Model:
    """A model from its JSON form; ValueError if it was written for other features."""
    if data.get("format") != MODEL_FORMAT or data.get("dimensions") != DIMENSIONS:
        raise ValueError(
            f"fingerprint model has format {data.get('format')} over {data.get('dimensions')} features; "
            f"this code reads format {MODEL_FORMAT} over {DIMENSIONS} (rerun `make fingerprint`)"
        )
    rows = []
    for encoded in data["weights"]:
        row = array.array("f")
        row.frombytes(base64.b64decode(encoded))
        rows.append(tuple(row))
    return Model(tuple(data["classes"]), tuple(rows), tuple(float(b) for b in data["bias"]))


@functools.cache
def shipped_model() -> Model:
    """The model ``make fingerprint`` trained on the shipped prompt sets."""
    return decode_model(json.loads(MODEL_FILE.read_text()))


@dataclass(frozen=True, slots=True)
class Inference:
    """The fingerprint a set of samples comes from, and how sure the classifier is."""

    fingerprint: str
    confidence: float  # the winner's mean probability over the samples
    runner_up: str
    runner_up_confidence: float
    samples: int
    votes: dict[str, int]  # how many samples each class won (agentic on its own), most first


def infer(texts: Iterable[str], model: Model | None = None) -> Inference | None:
    """The fingerprint of the samples' pooled probabilities, or None without a sample."""
    return pool(classify(texts, model))


def classify(texts: Iterable[str], model: Model | None = None) -> list[dict[str, float]]:
    """Each text's class probabilities."""
    model = model or shipped_model()
    return [model.probabilities(features(text)) for text in texts]


def pool(per_sample: Sequence[Mapping[str, float]]) -> Inference | None:
    """Pool per-sample class probabilities into one fingerprint (classes folded into the
    fingerprint they measure); None for no samples."""
    if not per_sample:
        return None
    mean: dict[str, float] = {}
    for probabilities in per_sample:
        for name, p in probabilities.items():
            fingerprint = fingerprint_of(name)
            mean[fingerprint] = mean.get(fingerprint, 0.0) + p / len(per_sample)
    ranked = sorted(mean.items(), key=lambda item: item[1], reverse=True)
    (winner, confidence), (runner_up, second) = ranked[:2]
    votes = Counter(max(probabilities, key=probabilities.__getitem__) for probabilities in per_sample)
    return Inference(
        fingerprint=winner,
        confidence=confidence,
        runner_up=runner_up,
        runner_up_confidence=second,
        samples=len(per_sample),
        votes=dict(votes.most_common()),
    )
