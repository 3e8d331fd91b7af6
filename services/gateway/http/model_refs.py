"""Which model a tenant may name: catalog aliases, Hugging Face ids (`org/name`), and by path
only the model directories inside the gateway's configured models directory
(SPECOPS_GATEWAY_MODELS_DIR; none configured, no path at all).

A path outside it is refused with one answer, whether it exists, holds a `config.json` or
not, so that a model reference cannot probe the server's filesystem; `..` steps and
symlinks are resolved before the check, so neither escapes the directory."""

from __future__ import annotations

from pathlib import Path

from specops_schemas.api import Problem, ProblemFieldError
from specops_services.gateway.http.problems import ProblemError

REFUSED_TYPE = "urn:specops:problem:model-ref-refused"
REFUSED = (
    "the model is named by a catalog alias, a Hugging Face id (`org/name`) or a directory inside the "
    "server's configured models directory (SPECOPS_GATEWAY_MODELS_DIR); other local paths are not accepted"
)


def looks_local(model_ref: str) -> bool:
    """Whether a model reference is a filesystem path rather than an alias or a hub id:
    absolute, home- or dot-relative, or holding a `..` step or a backslash."""
    return model_ref.startswith(("/", "~", ".")) or "\\" in model_ref or ".." in model_ref.split("/")


def inside(model_ref: str, models_dir: Path | None) -> Path | None:
    """The directory `model_ref` names once symlinks and `..` are resolved, if it lies strictly
    inside `models_dir`; None otherwise, and always when no models directory is configured."""
    if models_dir is None or not Path(model_ref).is_absolute():
        return None
    root = models_dir.resolve()
    directory = Path(model_ref).resolve()
    return directory if directory.is_relative_to(root) and directory != root else None


def refused(pointer: str) -> ProblemError:
    """The one 422 every local path outside the models directory gets."""
    return ProblemError(
        Problem(
            type=REFUSED_TYPE,
            title="Request body is invalid",
            status=422,
            detail=REFUSED,
            errors=[ProblemFieldError(pointer=pointer, detail=REFUSED)],
        )
    )
