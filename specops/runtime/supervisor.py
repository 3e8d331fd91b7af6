"""`specops up / down / status`: the embedded servers plus one OS process per service replica.

`up` reconciles: whatever already runs (per the state dir) is kept, what is missing is
started (a server at the address it had: specops.runtime.servers), replicas above the
requested count are stopped, and one watcher (specops.runtime.watch) keeps it all alive
until `down`. Running it twice is harmless. `status` asks each replica's /healthz too.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from nats.errors import Error as NatsError

from specbus.subjects import STREAM, intake_subject, results_pattern, tenant_inbox_prefix
from specops.runtime import nats_auth, nats_server, postgres_server
from specops.runtime.health import ops_url, probe
from specops.runtime.replicas import check_started, reconcile
from specops.runtime.servers import ensure_nats, ensure_postgres
from specops.runtime.state import Restart, ServiceRecord, StateDir, terminate
from specops.runtime.stream import apply_stream_config
from specops.runtime.watch import ensure_watcher, stop_watcher
from specops_schemas import MIGRATIONS
from specops_services import service_names
from specplatform.db import migrate
from specplatform.errors import RuntimeSetupError
from specplatform.settings import RUNTIME_ENV_FILE, Settings, render_env_file

# The services, in start order (each spec's start rank: the gateway last, so that everything
# that answers its requests is already subscribed); `down` stops them in reverse.
SERVICES = service_names()
# How long a freshly started service must stay alive to count as started.
START_GRACE_S = 2.0
# The restarts `specops status` shows.
RECENT_RESTARTS = 5

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
    metrics_url: str | None = None
    healthy: bool | None = None
    """Its /healthz: None when not asked (dead, or no ops port)."""
    health: str | None = None
    """The same in words: `healthy`, `cannot reach nats`, `no health answer (...)`."""
    checks: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WatcherStatus:
    pid: int
    alive: bool
    log: str


@dataclass(frozen=True, slots=True)
class RestartStatus:
    component: str
    at: float
    reason: str
    pid: int | None
    error: str | None

    @classmethod
    def of(cls, restart: Restart) -> RestartStatus:
        return cls(restart.component, restart.at, restart.reason, restart.pid, restart.error)


@dataclass(frozen=True, slots=True)
class RuntimeStatus:
    state_dir: str
    gateway_url: str
    servers: list[ServerStatus] = field(default_factory=list)
    processes: list[ProcessStatus] = field(default_factory=list)
    watcher: WatcherStatus | None = None
    restarts: list[RestartStatus] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def problems(self, *, health: bool = True) -> list[str]:
        """What is not as it should be: dead processes, and with `health` unhealthy replicas."""
        found = [f"{s.name} is dead" for s in self.servers if s.alive is False]
        found += [f"{p.service}[{p.replica}] is dead" for p in self.processes if not p.alive]
        if health:
            unhealthy = [p for p in self.processes if p.alive and p.healthy is False]
            found += [f"{p.service}[{p.replica}]: {p.health}" for p in unhealthy]
        if self.watcher is not None and not self.watcher.alive:
            found.append("the watcher is dead (run `specops up`)")
        return found


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
    """Start (or keep, or restart where they were) NATS (with its nkey users), PostgreSQL and
    the services; migrate; bring the streams to their configuration; start the watcher
    that keeps them all alive until `down`.

    `settings` should come from the environment only (`Settings()`), not from
    load_settings(): runtime.env is this function's output, not its input.
    """
    counts = dict(replicas) if replicas is not None else dict.fromkeys(services, 1)
    state_dir = StateDir(settings.state_dir)
    with state_dir.locked():
        state_dir.ensure()
        state = state_dir.load()
        nats = ensure_nats(settings, state, state_dir, progress)
        state.servers["nats"] = nats
        state_dir.save(state)
        postgres = ensure_postgres(settings, state, state_dir, progress)
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

        started = reconcile(state, state_dir, counts, services, command, service_env, progress)
        ensure_watcher(state, state_dir, progress)
        state_dir.save(state)
    # Outside the lock: the watcher may restart what dies meanwhile, and `up` still says so.
    check_started(started, start_grace_s)
    return status(settings)


async def _prepare(nats_url: str, database_url: str, credentials: Mapping[str, str]) -> list[str]:
    try:
        await apply_stream_config(nats_url, credentials)
    except (OSError, NatsError) as exc:
        raise RuntimeSetupError(
            f"cannot set up the {STREAM} stream on {nats_url}: {exc or type(exc).__name__}"
        ) from None
    return await migrate(database_url, MIGRATIONS)


def down(settings: Settings, *, progress: Progress = _quiet) -> RuntimeStatus:
    """Stop the watcher, the services (newest first), then NATS, then PostgreSQL; external
    servers are left alone."""
    state_dir = StateDir(settings.state_dir)
    with state_dir.locked():
        state = state_dir.load()
        # First, so that nothing started by hand from now on finds URLs of servers that
        # are going away; then the watcher, so that nothing stopped here is started again.
        (state_dir.root / RUNTIME_ENV_FILE).unlink(missing_ok=True)
        stop_watcher(state, progress)
        state_dir.save(state)
        for record in reversed(state.services):
            if record.process.alive():
                progress(f"{record.name}: stopping")
                if terminate(record.process, group=True):
                    progress(f"{record.name}: killed after the stop timeout")
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
        state.restarts = []
        state_dir.save(state)
    return status(settings)


def status(settings: Settings, *, probe_health: bool = True) -> RuntimeStatus:
    """What the state dir says runs, each entry checked against the live process table and,
    with `probe_health`, each live replica's own /healthz."""
    state_dir = StateDir(settings.state_dir)
    state = state_dir.load()
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
    processes = [_process_status(record, probe_health) for record in state.services]
    watcher = None
    if state.watcher is not None:
        watcher = WatcherStatus(state.watcher.pid, state.watcher.alive(), str(state_dir.watch_log))
    return RuntimeStatus(
        str(settings.state_dir),
        settings.gateway_url,
        servers,
        processes,
        watcher=watcher,
        restarts=[RestartStatus.of(r) for r in state.restarts[-RECENT_RESTARTS:]],
    )


def _process_status(record: ServiceRecord, probe_health: bool) -> ProcessStatus:
    alive = record.process.alive()
    port = record.metrics_port
    health = probe(port) if alive and probe_health and port is not None else None
    return ProcessStatus(
        service=record.service,
        replica=record.replica,
        pid=record.process.pid,
        alive=alive,
        log=record.log,
        metrics_url=ops_url(port, "/metrics") if port is not None else None,
        healthy=health.healthy if health is not None else None,
        health=health.describe() if health is not None else None,
        checks=health.checks if health is not None else {},
    )


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
