"""speccore's native CPU kernels (``native/``), built for this host on first use.

Decoding one token reads every weight once for a row or a few: a memory-bound matrix-vector
product. oneDNN's packed kernels (the fallback, ``cpu_kernels``) reach about half the read
bandwidth of the project's 2-core hosts there, and need blocks padded to 4 rows to stay
row-invariant. This kernel streams weights packed for it in one contiguous pass, sums each
output in one fixed order whatever the row count (row-invariant by construction, any number
of rows), and widens bfloat16 weights in registers, so bfloat16 halves the bytes read on any
x86 host, with or without AVX-512 BF16 or AMX.

It is compiled with the host's own instruction set (``-march=native``: AVX-512 where present,
else AVX2), once per host, source and PyTorch version, under ``<cache>/kernels/``; a later
process loads the built library. Where it cannot be built (no C++ compiler), or with
``SPECOPS_NATIVE_KERNELS=0``, speccore falls back to oneDNN, with a warning naming the reason.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import sys
from pathlib import Path
from types import ModuleType

import torch

from speccore.files import cache_root

log = logging.getLogger(__name__)

NATIVE = Path(__file__).with_name("native")
SOURCES = tuple(
    NATIVE / name for name in ("kernels.h", "matmul.cpp", "layer.cpp", "decoder.cpp", "module.cpp")
)
FLAGS = ["-O3", "-march=native", "-fopenmp"]
OFF_ENV = "SPECOPS_NATIVE_KERNELS"


def cpu_info(field: str) -> str | None:
    """A field of the first CPU in /proc/cpuinfo (Linux), e.g. ``flags``; None elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> str:
    """The host CPU's feature flags, or the machine name where /proc/cpuinfo has none."""
    return cpu_info("flags") or platform.machine()


def build_name() -> str:
    """One build per source, compiler flags, PyTorch version and CPU feature set."""
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.read_bytes())
    for part in (" ".join(FLAGS), torch.__version__, cpu_flags()):
        digest.update(part.encode())
    return f"speccore_native_{digest.hexdigest()[:16]}"


@functools.cache
def load() -> ModuleType | None:
    """The built kernel module, or None where speccore uses oneDNN instead (see module doc)."""
    if os.environ.get(OFF_ENV, "1").strip().lower() in ("0", "false", "off", "no"):
        return None
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    from torch.utils import cpp_extension

    # torch runs `ninja` from PATH; the ninja package installs it beside this interpreter.
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])
    name = build_name()
    directory = cache_root() / "kernels" / name
    directory.mkdir(parents=True, exist_ok=True)
    if not any(directory.glob(f"{name}*.so")):
        log.warning("building speccore's CPU kernels for this host (once, under a minute)")
    try:
        module = cpp_extension.load(
            name,
            [str(p) for p in SOURCES if p.suffix == ".cpp"],
            extra_cflags=FLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(directory),
            verbose=False,
        )
    except (OSError, RuntimeError, ImportError) as exc:
        reason = str(exc).splitlines()[0]
        log.warning("speccore's CPU kernels could not be built (%s); using oneDNN's", reason)
        return None
    return module


def lanes() -> int:
    """The kernel's vector width in float32 lanes (weights' in_features must be a multiple)."""
    module = load()
    return int(module.lanes) if module is not None else 0


if __name__ == "__main__":  # `make setup` builds them ahead of the first model load
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    built = load()
    if built is None:
        print("speccore's native CPU kernels are not built here: speccore uses oneDNN's")
    else:
        print(f"speccore's native CPU kernels: {lanes()} float lanes, {built.__file__}")
