"""`specops serve <service> [--replica N]`: run one service process until SIGTERM / SIGINT.

`specops serve engine` is the OpenAI-compatible speccore server (serve_engine.py); it takes
the engine options, which the bus services refuse.

The services are those `specops_services.service_specs()` lists; each spec's `load().serve`
blocks until the process is told to stop and then shuts down cleanly (consumers, outbox
relay, database pool). `specops up` starts one such process per replica and passes the
replica in SPECOPS_REPLICA; it only labels the log lines, since replicas of a service share
its durable consumers.

Wiring: `add_parsers(sub)` on the top-level subparsers; the parser sets `handler`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specops.commands import serve_engine
from specops.extras import missing_extra
from specops_services import service_names, service_specs
from specplatform.errors import RuntimeSetupError

if TYPE_CHECKING:
    from specplatform.settings import Settings

ENGINE = "engine"
REPLICA_ENV = "SPECOPS_REPLICA"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _replica(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"replicas are numbered from 0, got {value}")
    return value


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `serve` to the `specops` subcommands (`sub`)."""
    serve = sub.add_parser("serve", help="run one service process until SIGTERM / SIGINT")
    serve.add_argument(
        "service",
        choices=[*service_names(), ENGINE],
        help="the service to run (engine: the OpenAI-compatible server)",
    )
    serve.add_argument(
        "--replica",
        type=_replica,
        help=f"replica number shown in the log lines (default: ${REPLICA_ENV}, else 0)",
    )
    serve.add_argument("--log-level", default="INFO", choices=LOG_LEVELS, help="default INFO")
    serve_engine.add_engine_options(serve)
    serve.set_defaults(handler=run_serve)


def configure_logging(service: str, replica: int, level: str = "INFO") -> None:
    """One line per record on stderr, prefixed with the service and replica."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s {service}[{replica}] %(levelname)s %(name)s: %(message)s")
    )
    logging.basicConfig(level=level, handlers=[handler], force=True)


def service_entry(service: str) -> Callable[[Settings | None], None]:
    """What runs `service` (one of service_names()); RuntimeSetupError if its app cannot import."""
    try:
        return service_specs()[service].load().serve
    except ModuleNotFoundError as exc:
        if missing_extra(exc) is not None:
            raise  # specops.cli names the extra to install
        raise RuntimeSetupError(f"service {service} is not installed: {exc}") from None


def run_serve(args: argparse.Namespace) -> int:
    from specplatform.settings import load_settings, nkey_seed_file
    from specplatform.telemetry import configure_tracing

    replica = args.replica if args.replica is not None else _env_replica()
    if args.service == ENGINE:
        served = serve_engine.choose(args)  # a bad choice fails before anything starts
        configure_logging(args.service, replica, args.log_level)
        return serve_engine.run(args, served)
    engine_only = serve_engine.given_engine_options(args)
    if engine_only:
        raise RuntimeSetupError(f"{', '.join(engine_only)}: only `specops serve engine` takes these")
    configure_logging(args.service, replica, args.log_level)
    configure_tracing(args.service)
    entry = service_entry(args.service)
    log = logging.getLogger(__name__)
    log.info("starting %s replica %d", args.service, replica)
    settings = load_settings()
    if settings.nats_nkey_seed_file is None and settings.nats_nkey_seed_dir is not None:
        # A directory of every user's seed (compose): this process is its service's user.
        own = nkey_seed_file(settings.nats_nkey_seed_dir, args.service)
        settings = settings.model_copy(update={"nats_nkey_seed_file": own})
    entry(settings)
    log.info("%s replica %d stopped", args.service, replica)
    return 0


def _env_replica() -> int:
    try:
        return _replica(os.environ.get(REPLICA_ENV, "0"))
    except argparse.ArgumentTypeError as exc:
        raise RuntimeSetupError(f"{REPLICA_ENV}: {exc}") from None
