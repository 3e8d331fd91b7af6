"""`specops up / down / status`: the embedded servers plus one OS process per service replica.

`up` reconciles: whatever already runs (per the state dir) is kept, what is missing is
started, replicas above the requested count are stopped. Running it twice is harmless.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nats.errors import Error as NatsError

from specbus.subjects import STREAM, intake_subject, results_pattern, tenant_inbox_prefix
from specops.runtime import nats_auth, nats_server, postgres_server
from specops.runtime.state import ProcessRef, RuntimeState, ServerRecord, ServiceRecord, StateDir, terminate
from specops.runtime.stream import apply_stream_config
from specops_schemas import MIGRATIONS
from specplatform.db import migrate
from specplatform.errors import RuntimeSetupError
from specplatform.settings import RUNTIME_ENV_FILE, STATE_DIR_ENV, Settings, render_env_file

# The services of DESIGN.md §5, in start order (the gateway last, so that everything
# that answers its requests is already subscribed); `down` stops them in reverse.
SERVICES = ("audit", "quality-gate", "benchmark-runner", "predictor", "gateway")
# How long a freshly started service must stay alive to count as started.
START_GRACE_S = 2.0

ServiceCommand = Callable[[str], list[str]]
Progress = Callable[[str], None]


def serve_command(service: str) -> list[str]:
    """The argv of one service process."""
    return [sys.executable, "-m", "specops.cli", "serve", service]


def _quiet(message: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class ServerStatus:
    name: str
    url: str
    embedded: bool
    alive: bool | None  # None: external, not ours to check
    pid: int | None = None
    log: str | None = None
    monitor_url: str | None = None


@dataclass(frozen=True, slots=True)
class ProcessStatus:
    service: str
    replica: int
    pid: int
    alive: bool
    log: str


@dataclass(frozen=True, slots=True)
class RuntimeStatus:
    state_dir: str
    gateway_url: str
    servers: list[ServerStatus] = field(default_factory=list)
    processes: list[ProcessStatus] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def parse_replicas(specs: Sequence[str], services: Sequence[str] = SERVICES) -> dict[str, int]:
    """`["predictor=3", "audit=0"]` or `["predictor=3,audit=0"]` -> counts for every service
    (1 where not given).

    Every service scales, the gateway too: its replicas share one listening port
    (SO_REUSEPORT, see specops_services.gateway.app.serve) and the kernel spreads the
    connections over them.
    """
    counts = dict.fromkeys(services, 1)
    for spec in (part.strip() for given in specs for part in given.split(",")):
        if not spec:
            continue
        name, sep, value = spec.partition("=")
        if not sep or not value.strip().isdigit():
            raise RuntimeSetupError(f"--replicas {spec!r}: expected SERVICE=N with N >= 0")
        if name not in counts:
            raise RuntimeSetupError(f"--replicas {spec!r}: unknown service; services: {', '.join(services)}")
        counts[name] = int(value)
    return counts


def up(
    settings: Settings,
    replicas: Mapping[str, int] | None = None,
    *,
    services: Sequence[str] = SERVICES,
    command: ServiceCommand = serve_command,
    progress: Progress = _quiet,
    start_grace_s: float = START_GRACE_S,
) -> RuntimeStatus:
    """Start (or keep) NATS (with its nkey users), PostgreSQL and the services; migrate;
    bring the streams to their configuration.

    `settings` should come from the environment only (`Settings()`), not from
    load_settings(): runtime.env is this function's output, not its input.
    """
    counts = dict(replicas) if replicas is not None else dict.fromkeys(services, 1)
    state_dir = StateDir(settings.state_dir)
    with state_dir.locked():
        state_dir.ensure()
        state = state_dir.load()
        nats = _ensure_nats(settings, state, state_dir, progress)
        state.servers["nats"] = nats
        state_dir.save(state)
        postgres = _ensure_postgres(settings, state, state_dir, progress)
        state.servers["postgres"] = postgres
        state_dir.save(state)

        keys = nats_auth.Keys(state_dir.root)
        embedded = nats.process is not None
        # The embedded server knows only nkey users: the runtime and the CLI act as admin,
        # each service as its own user. A configured server's credentials are the user's.
        admin = {"NATS_NKEY_SEED_FILE": str(keys.seed_file(nats_auth.ADMIN))} if embedded else {}
        credentials = (
            {"nkeys_seed": admin["NATS_NKEY_SEED_FILE"]} if embedded else settings.nats_credentials()
        )
        progress("migrating the database and ensuring the streams")
        applied = asyncio.run(_prepare(nats.url, postgres.url, credentials))
        if applied:
            progress(f"applied migrations: {', '.join(applied)}")
        env_values = {"NATS_URL": nats.url, "DATABASE_URL": postgres.url}
        state_dir.write_atomic(state_dir.root / RUNTIME_ENV_FILE, render_env_file(env_values | admin))

        def service_env(service: str) -> dict[str, str]:
            own = {"NATS_NKEY_SEED_FILE": str(keys.seed_file(service))} if embedded else {}
            return env_values | own

        started = _reconcile_services(
            settings, state, state_dir, counts, services, command, service_env, progress
        )
        state_dir.save(state)
        _check_started(started, start_grace_s)
    return status(settings)


async def _prepare(nats_url: str, database_url: str, credentials: Mapping[str, str]) -> list[str]:
    try:
        await apply_stream_config(nats_url, credentials)
    except (OSError, NatsError) as exc:
        raise RuntimeSetupError(
            f"cannot set up the {STREAM} stream on {nats_url}: {exc or type(exc).__name__}"
        ) from None
    return await migrate(database_url, MIGRATIONS)


def _ensure_nats(
    settings: Settings, state: RuntimeState, state_dir: StateDir, progress: Progress
) -> ServerRecord:
    if settings.nats_url and not _is_ours(state, "nats", settings.nats_url):
        progress(f"nats: using {settings.nats_url}")
        return ServerRecord(name="nats", url=settings.nats_url)
    # Imported here: reading the services' code loads the engine, which `down` and
    # `status` do not need.
    from specops.runtime.topology import service_users

    users = nats_auth.all_users(nats_auth.Keys(state_dir.root), service_users())
    current = state.servers.get("nats")
    if current is not None and current.process is not None and current.process.alive():
        # Users may have changed (a new service, a new handler): the server reloads them.
        nats_server.reload(state_dir, current, users)
        progress(f"nats: already running at {current.url}")
        return current
    progress("nats: starting nats-server with JetStream and nkey users")
    record = nats_server.start(state_dir, users)
    progress(f"nats: ready at {record.url}")
    return record


def _ensure_postgres(
    settings: Settings, state: RuntimeState, state_dir: StateDir, progress: Progress
) -> ServerRecord:
    if settings.database_url and not _is_ours(state, "postgres", settings.database_url):
        progress("postgres: using DATABASE_URL")
        return ServerRecord(name="postgres", url=settings.database_url)
    current = state.servers.get("postgres")
    if current is not None and current.process is not None and current.process.alive():
        progress("postgres: already running")
        return current
    first = not (state_dir.pgdata / "PG_VERSION").exists()
    progress(
        "postgres: initialising and starting (first run takes a few seconds)"
        if first
        else "postgres: starting"
    )
    record = postgres_server.start(state_dir.pgdata)
    progress(f"postgres: ready ({record.url})")
    return record


def _is_ours(state: RuntimeState, name: str, url: str) -> bool:
    # A URL of our own embedded server (e.g. runtime.env exported into the shell) is
    # not a server the user configured: it is restarted if it died.
    record = state.servers.get(name)
    return record is not None and record.process is not None and record.url == url


def _reconcile_services(
    settings: Settings,
    state: RuntimeState,
    state_dir: StateDir,
    counts: Mapping[str, int],
    services: Sequence[str],
    command: ServiceCommand,
    service_env: Callable[[str], Mapping[str, str]],
    progress: Progress,
) -> list[ServiceRecord]:
    unknown = sorted(set(counts) - set(services))
    if unknown:
        raise RuntimeSetupError(f"unknown services: {', '.join(unknown)}; services: {', '.join(services)}")
    keep: list[ServiceRecord] = []
    for record in state.services:
        if not record.process.alive():
            continue  # stale: its slot is refilled below
        wanted = counts.get(record.service)
        if wanted is not None and record.replica >= wanted:
            progress(f"{record.service}[{record.replica}]: stopping (above {wanted} replicas)")
            terminate(record.process, group=True)
            continue
        keep.append(record)
    running = {(r.service, r.replica) for r in keep}
    started: list[ServiceRecord] = []
    for service in services:
        for replica in range(counts.get(service, 0)):
            if (service, replica) in running:
                progress(f"{service}[{replica}]: already running")
                continue
            record = _spawn(settings, state_dir, service, replica, command(service), service_env(service))
            progress(f"{service}[{replica}]: started (pid {record.process.pid}, log {record.log})")
            started.append(record)
    state.services = keep + started
    return started


def _spawn(
    settings: Settings,
    state_dir: StateDir,
    service: str,
    replica: int,
    argv: list[str],
    env_values: Mapping[str, str],
) -> ServiceRecord:
    env = dict(os.environ)
    env.update(env_values)
    env[STATE_DIR_ENV] = str(settings.state_dir)
    env["SPECOPS_SERVICE"] = service
    env["SPECOPS_REPLICA"] = str(replica)
    # Several model-running processes share few cores: spinning OpenMP threads in one
    # starve the others (a 5x slowdown was measured on the 2-core hosts).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    log = state_dir.service_log(service, replica)
    with open(log, "ab") as out:
        out.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} start: {' '.join(argv)}\n".encode())
        out.flush()
        # Own session: the group is signalled as a whole on down, and Ctrl-C on the
        # terminal that ran `specops up` does not reach the services.
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    return ServiceRecord(
        service=service, replica=replica, process=ProcessRef.of(proc.pid), log=str(log), argv=argv
    )


def _check_started(started: Sequence[ServiceRecord], grace_s: float) -> None:
    if not started:
        return
    time.sleep(grace_s)
    dead = [r for r in started if not r.process.alive()]
    if dead:
        first = dead[0]
        names = ", ".join(f"{r.service}[{r.replica}]" for r in dead)
        raise RuntimeSetupError(
            f"{names} exited right after starting: {_last_line(Path(first.log))} (log {first.log}); "
            "the servers and any other services keep running until `specops down`"
        )


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip() if lines else "no output"


def down(settings: Settings, *, progress: Progress = _quiet) -> RuntimeStatus:
    """Stop the services (newest first), then NATS, then PostgreSQL; external servers are left alone."""
    state_dir = StateDir(settings.state_dir)
    with state_dir.locked():
        state = state_dir.load()
        # First, so that nothing started by hand from now on finds URLs of servers that
        # are going away.
        (state_dir.root / RUNTIME_ENV_FILE).unlink(missing_ok=True)
        for record in reversed(state.services):
            if record.process.alive():
                progress(f"{record.service}[{record.replica}]: stopping")
                if terminate(record.process, group=True):
                    progress(f"{record.service}[{record.replica}]: killed after the stop timeout")
        state.services = []
        state_dir.save(state)
        for name, stop in (("nats", nats_server.stop), ("postgres", postgres_server.stop)):
            server = state.servers.get(name)
            if server is None or server.process is None:
                continue
            if server.process.alive():
                progress(f"{name}: stopping")
                stop(server)
        state.servers = {}
        state_dir.save(state)
    return status(settings)


def status(settings: Settings) -> RuntimeStatus:
    """What the state dir says runs, each entry checked against the live process table."""
    state = StateDir(settings.state_dir).load()
    servers = [
        ServerStatus(
            name=record.name,
            url=record.url,
            embedded=record.process is not None,
            alive=record.process.alive() if record.process is not None else None,
            pid=record.process.pid if record.process is not None else None,
            log=record.log,
            monitor_url=record.monitor_url,
        )
        for record in state.servers.values()
    ]
    processes = [
        ProcessStatus(r.service, r.replica, r.process.pid, r.process.alive(), r.log) for r in state.services
    ]
    return RuntimeStatus(str(settings.state_dir), settings.gateway_url, servers, processes)


@dataclass(frozen=True, slots=True)
class TenantUser:
    """An upstream system's NATS identity for one tenant."""

    tenant: str
    seed_file: str
    public_key: str
    nats_url: str | None
    intake_subject: str
    results_subjects: str
    inbox_prefix: str
    reloaded: bool
    """Whether the embedded server took the new user at once (False: configure an external one)."""


def add_tenant(settings: Settings, tenant: str) -> TenantUser:
    """Create (or keep) the tenant's nkey user; the running embedded server reloads its users."""
    from specops.runtime.topology import service_users

    state_dir = StateDir(settings.state_dir)
    keys = nats_auth.Keys(state_dir.root)
    user = nats_auth.tenant_user(tenant)
    with state_dir.locked():
        state_dir.ensure()
        public = keys.ensure(user)
        state = state_dir.load()
        nats = state.servers.get("nats")
        running = nats is not None and nats.process is not None and nats.process.alive()
        if running and nats is not None:
            nats_server.reload(state_dir, nats, nats_auth.all_users(keys, service_users()))
    return TenantUser(
        tenant=tenant,
        seed_file=str(keys.seed_file(user)),
        public_key=public,
        nats_url=nats.url if nats is not None else settings.nats_url,
        intake_subject=intake_subject(tenant),
        results_subjects=results_pattern(tenant),
        inbox_prefix=tenant_inbox_prefix(tenant),
        reloaded=running,
    )
