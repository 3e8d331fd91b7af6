"""NATS users for the embedded server: one per service with least privilege, one per tenant.

`specops up` gives every service an nkey user allowed exactly what its code does: pull
from its own durable consumers, acknowledge their messages, publish the events it
produces (and park on its own dead-letter subject), read replies on its own inbox
prefix. An upstream system gets a tenant user (`specops nats tenant add`) that may only
publish on that tenant's intake subject and read that tenant's results. The `admin`
user (the runtime and the CLI: streams, replays) may do anything. Unauthenticated
connections are refused.

The server config is JSON (a subset of the NATS config syntax); seeds live in
`<state dir>/nats/keys/*.nk` (mode 0600) and only public keys go into the config.
Adding a tenant rewrites the config and asks the running server to reload it (SIGHUP):
no connection is dropped.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys

from specbus.broker import inbox_prefix
from specbus.subjects import (
    ID_PATTERN,
    STREAM,
    dlq_subject,
    intake_subject,
    pattern,
    results_pattern,
    tenant_inbox_prefix,
)
from specplatform.errors import RuntimeSetupError
from specplatform.settings import ADMIN_USER, ENGINE_USER, nkey_seed_file

ADMIN = ADMIN_USER
ENGINE = ENGINE_USER
"""The engine server's user (`specops serve engine`): the internet-facing pod gets no admin."""
TENANT_PREFIX = "tenant-"
_TENANT = re.compile(ID_PATTERN)


@dataclass(frozen=True, slots=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    def to_config(self) -> dict[str, Any]:
        return {"publish": {"allow": list(self.publish)}, "subscribe": {"allow": list(self.subscribe)}}


@dataclass(frozen=True, slots=True)
class BoundConsumer:
    """A durable pull consumer a service binds: its stream and name."""

    stream: str
    durable: str


@dataclass(frozen=True, slots=True)
class ServiceUser:
    """What a service's NATS user must be allowed, read off the service's code."""

    name: str
    """Its `specops serve` name (and key file name)."""
    bus_name: str
    """The name it uses on the bus: consumer names, dead-letter subject, inbox prefix."""
    publishes: tuple[str, ...]
    """Subjects it publishes (through its outbox relay), wildcards allowed."""
    consumers: tuple[BoundConsumer, ...]
    streams: tuple[str, ...]
    """Streams it creates at start when they are missing."""


def service_permissions(user: ServiceUser) -> Permissions:
    """Least privilege for one service: its consumers, its events, its inbox."""
    api = ["$JS.API.INFO"]
    for stream in sorted({c.stream for c in user.consumers} | set(user.streams)):
        api.append(f"$JS.API.STREAM.INFO.{stream}")
    api += [f"$JS.API.STREAM.CREATE.{stream}" for stream in user.streams]
    acks = []
    for consumer in user.consumers:
        where = f"{consumer.stream}.{consumer.durable}"
        api += [
            f"$JS.API.CONSUMER.CREATE.{where}",
            f"$JS.API.CONSUMER.CREATE.{where}.>",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{where}",
            f"$JS.API.CONSUMER.INFO.{where}",
            f"$JS.API.CONSUMER.MSG.NEXT.{where}",
        ]
        acks.append(f"$JS.ACK.{where}.>")
    return Permissions(
        publish=(*api, *acks, *user.publishes, dlq_subject(user.bus_name)),
        subscribe=(f"{inbox_prefix(user.bus_name)}.>",),
    )


def tenant_permissions(tenant: str) -> Permissions:
    """An upstream system of `tenant`: its intake subject in, its results and inbox out."""
    return Permissions(
        publish=(intake_subject(tenant),),
        subscribe=(results_pattern(tenant), f"{tenant_inbox_prefix(tenant)}.>"),
    )


def engine_permissions() -> Permissions:
    """The engine server: read SPEC's info, follow the security policies through an ordered
    (ephemeral, filtered) consumer, publish its drift events and live workload summaries;
    nothing else."""
    return Permissions(
        publish=(
            "$JS.API.INFO",
            f"$JS.API.STREAM.INFO.{STREAM}",
            # nats-py's ordered consumer: created (and re-created on a gap) unnamed, so its
            # filter is in the request body where no permission can pin it; deleted on reset;
            # flow control is answered on $JS.FC.
            f"$JS.API.CONSUMER.CREATE.{STREAM}",
            f"$JS.API.CONSUMER.DELETE.{STREAM}.*",
            f"$JS.FC.{STREAM}.>",
            pattern("serve", "drift_detected"),
            pattern("serve", "drift_recovered"),
            pattern("workload", "summarized"),
        ),
        subscribe=(f"{inbox_prefix(ENGINE)}.>",),
    )


ADMIN_PERMISSIONS = Permissions(publish=(">",), subscribe=(">",))


def _authorization(users: Mapping[str, Permissions]) -> dict[str, Any]:
    return {"users": [{"nkey": key, "permissions": perms.to_config()} for key, perms in users.items()]}


def render_authorization(users: Mapping[str, Permissions]) -> str:
    """The `authorization` block alone, for an external server's config (`include` it)."""
    return f"authorization: {json.dumps(_authorization(users), indent=2)}\n"


# Fixed rather than nats-server's default, 75% of the disk free when it starts: each stream
# reserves its max_bytes in this store, and a store that shrinks as the disk fills would
# make `specops up` fail to re-apply the streams. Their own limits (specbus.broker) are
# what bound the disk they use.
MAX_FILE_STORE = 2**40


def render_config(
    *, host: str, port: int, monitor_port: int, store_dir: Path, users: Mapping[str, Permissions]
) -> str:
    """The server config; `users` maps an nkey public key to its permissions."""
    config = {
        "server_name": "specops",
        "host": host,
        "port": port,
        "http": f"{host}:{monitor_port}",
        "jetstream": {"store_dir": str(store_dir), "max_file_store": MAX_FILE_STORE},
        "authorization": _authorization(users),
    }
    return json.dumps(config, indent=2) + "\n"


# --- keys on disk ---------------------------------------------------------------------------


class Keys:
    """The nkey seeds of one state dir (`<state>/nats/keys/<user>.nk`)."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "nats" / "keys"

    def seed_file(self, user: str) -> Path:
        return nkey_seed_file(self.dir, user)

    def ensure(self, user: str) -> str:
        """The public key of `user`, creating its seed on first use."""
        path = self.seed_file(user)
        if not path.is_file():
            self.dir.mkdir(parents=True, exist_ok=True)
            os.chmod(self.dir, 0o700)
            seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
            # Created 0600 before the secret is written; a concurrent creator loses cleanly.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(seed + b"\n")
        return public_key(path)

    def tenants(self) -> list[str]:
        """Tenants that have an upstream user, sorted."""
        if not self.dir.is_dir():
            return []
        return sorted(p.stem.removeprefix(TENANT_PREFIX) for p in self.dir.glob(f"{TENANT_PREFIX}*.nk"))


def public_key(seed_file: Path) -> str:
    seed = seed_file.read_bytes().strip()
    try:
        return nkeys.from_seed(bytearray(seed)).public_key.decode()
    except nkeys.NkeysError as exc:
        raise RuntimeSetupError(f"{seed_file} does not hold an nkey user seed: {exc!r}") from None


def tenant_user(tenant: str) -> str:
    if not _TENANT.fullmatch(tenant):
        raise RuntimeSetupError(f"invalid tenant id {tenant!r}: use 1-128 of A-Z a-z 0-9 _ -")
    return f"{TENANT_PREFIX}{tenant}"


def all_users(keys: Keys, services: Iterable[ServiceUser]) -> dict[str, Permissions]:
    """Public key -> permissions of admin, every service and every tenant with a key."""
    users = {keys.ensure(ADMIN): ADMIN_PERMISSIONS, keys.ensure(ENGINE): engine_permissions()}
    for service in services:
        users[keys.ensure(service.name)] = service_permissions(service)
    for tenant in keys.tenants():
        users[keys.ensure(tenant_user(tenant))] = tenant_permissions(tenant)
    return users
