"""One engine server per method, started once for the whole report and stopped at its end
(the benchmark-runner's EngineServer: its own process group, SIGTERM then SIGKILL); its
log goes to a file beside the results.

speccore's methods run `specops serve engine`; vLLM's (`vllm:` labels) run vLLM's installed
CPU build on the model's checkpoint directory, serving it under the report's model name.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from speccore.errors import SpecError
from speccore.models import engine_checkpoint
from specops.report.methods import engine_of
from specops_services.benchmark_runner.engine_server import (
    HOST,
    EngineServer,
    HttpEngine,
    ServerSpec,
    free_port,
    server_command,
)
from specplatform import engines

START_S = 300.0


@contextmanager
def engine_servers(
    methods: dict[str, list[str]], model: str, common: list[str], log_dir: Path
) -> Iterator[dict[str, str]]:
    """{method label: base URL} of a healthy server per method, all stopped on exit.
    `common`: flags every speccore server gets."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        urls = {}
        for label, flags in methods.items():
            server = stack.enter_context(EngineServer(server_spec(label, flags, model, common, log_dir)))
            urls[label] = server.url
        yield urls


def server_spec(label: str, flags: list[str], model: str, common: list[str], log_dir: Path) -> ServerSpec:
    engine = engine_of(label)
    port = free_port()
    if engine == HttpEngine.VLLM:
        launcher = engines.launcher(engines.VLLM.name)
        if launcher is None:
            raise SpecError(f"vLLM is not installed here: run `{engines.VLLM.install_command}`")
        where = server_command(engine, launcher, engine_checkpoint(model), port)
        command = [*where, "--served-model-name", model, *flags]
    else:
        where = server_command(engine, [sys.executable, "-m", "specops.cli"], model, port)
        command = [*where, *flags, *common]
    env = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    log = log_dir / f"{label.replace(':', '-')}.log"
    return ServerSpec(engine, command, f"http://{HOST}:{port}", START_S, env, log=log)
