"""NATS and PostgreSQL as `specops up` and the watcher keep them: started once, then always
restarted at the address they had, which is the one every service was given.

A restart on another address would leave the running services pointed at the old one
(they reconnect forever, to nothing): NATS comes back on its recorded ports or not at
all (a loud error), and embedded PostgreSQL listens on a Unix socket whose directory
and port follow from its PGDATA, so its URL is the same after every start.
"""

from __future__ import annotations

from collections.abc import Callable

from specops.runtime import nats_auth, nats_server, postgres_server
from specops.runtime.state import RuntimeState, ServerRecord, StateDir
from specplatform.errors import RuntimeSetupError
from specplatform.settings import Settings

Progress = Callable[[str], None]


def ensure_nats(
    settings: Settings, state: RuntimeState, state_dir: StateDir, progress: Progress
) -> ServerRecord:
    """The configured NATS, or the embedded one: kept, restarted on its ports, or started."""
    if settings.nats_url and not _is_ours(state, "nats", settings.nats_url):
        progress(f"nats: using {settings.nats_url}")
        return ServerRecord(name="nats", url=settings.nats_url)
    # Imported here: reading the services' code loads the engine, which `down`, `status`
    # and the watcher do not need.
    from specops.runtime.topology import service_users

    users = nats_auth.all_users(nats_auth.Keys(state_dir.root), service_users())
    current = state.servers.get("nats")
    if current is not None and current.process is not None:
        if current.process.alive():
            # Users may have changed (a new service, a new handler): the server reloads them.
            nats_server.reload(state_dir, current, users)
            progress(f"nats: already running at {current.url}")
            return current
        progress(f"nats: restarting at {current.url}, where the services expect it")
        record = nats_server.restart(state_dir, current, users)
        progress(f"nats: ready at {record.url}")
        return record
    progress("nats: starting nats-server with JetStream and nkey users")
    record = nats_server.start(state_dir, users)
    progress(f"nats: ready at {record.url}")
    return record


def ensure_postgres(
    settings: Settings, state: RuntimeState, state_dir: StateDir, progress: Progress
) -> ServerRecord:
    """The configured database, or the embedded PostgreSQL: kept, or (re)started."""
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
    if current is not None and current.process is not None:
        record = restart_postgres(state_dir, current)
    else:
        record = postgres_server.start(state_dir.pgdata)
    progress(f"postgres: ready ({record.url})")
    return record


def restart_server(state_dir: StateDir, record: ServerRecord) -> ServerRecord:
    """Start the dead embedded server of `record` again at its address (the watcher's restart).

    NATS reuses the config file `up` wrote (its users included).
    """
    if record.name == "nats":
        return nats_server.restart(state_dir, record)
    if record.name == "postgres":
        return restart_postgres(state_dir, record)
    raise RuntimeSetupError(f"no embedded server called {record.name!r}")


def restart_postgres(state_dir: StateDir, record: ServerRecord) -> ServerRecord:
    """postgres_server.start on the same PGDATA; a URL that moved anyway is an error (the new
    server is stopped again), since the services would go on using the old one."""
    started = postgres_server.start(state_dir.pgdata)
    if started.url != record.url:
        postgres_server.stop(started)
        raise RuntimeSetupError(
            f"postgres came back at {started.url} but the services use {record.url}: "
            "run `specops down`, then `specops up`"
        )
    return started


def _is_ours(state: RuntimeState, name: str, url: str) -> bool:
    # A URL of our own embedded server (e.g. runtime.env exported into the shell) is
    # not a server the user configured: it is restarted if it died.
    record = state.servers.get(name)
    return record is not None and record.process is not None and record.url == url
