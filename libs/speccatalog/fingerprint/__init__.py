"""Which workload fingerprint an endpoint serves: the three-question wizard, and inference
from sample requests (a classifier trained on the prompt sets specops ships, by
``bench/fingerprint.py``). The console, the CLI and the gateway all ask here."""

from speccatalog.fingerprint.classifier import Inference, infer, pool
from speccatalog.fingerprint.questions import QUESTIONS, Question, UnknownAnswer, wizard, wizard_table
from speccatalog.fingerprint.samples import SampleError, read_samples, sample_text

__all__ = [
    "QUESTIONS",
    "Inference",
    "Question",
    "SampleError",
    "UnknownAnswer",
    "infer",
    "pool",
    "read_samples",
    "sample_text",
    "wizard",
    "wizard_table",
]
