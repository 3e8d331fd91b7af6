"""Where every specops process finds the bus, the database and its state directory.

One mechanism, in this order of precedence:

1. environment variables (``NATS_URL``, ``DATABASE_URL``, ``SPECOPS_STATE_DIR``,
   ``SPECOPS_GATEWAY_HOST``, ``SPECOPS_GATEWAY_PORT``);
2. ``<state dir>/runtime.env``, which ``specops up`` writes with the URLs it actually
   uses (the embedded servers' or the ones given in the environment);
3. defaults.

``specops up`` also passes the URLs in the environment of every service it starts, so
a supervised service never depends on reading the file; the file is what lets a
service or a client started by hand (``specops serve gateway``, the SDK, a test)
reach the same servers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar, overload

import platformdirs
from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from specplatform.errors import RuntimeSetupError

STATE_DIR_ENV = "SPECOPS_STATE_DIR"
# The NATS user of the runtime and the CLI (specops.runtime.nats_auth); a service is its own.
ADMIN_USER = "admin"
ENGINE_USER = "engine"
RUNTIME_ENV_FILE = "runtime.env"


def nkey_seed_file(directory: Path, user: str) -> Path:
    """Where a directory of NATS seeds keeps `user`'s (`specops.runtime.nats_auth.Keys`)."""
    return directory / f"{user}.nk"


def default_state_dir() -> Path:
    override = os.environ.get(STATE_DIR_ENV)
    return Path(override) if override else Path(platformdirs.user_state_dir("specops"))


class Settings(BaseSettings):
    """Connection settings shared by the runtime, the services and the CLI."""

    model_config = SettingsConfigDict(
        env_prefix="SPECOPS_",
        # runtime.env may gain keys newer code writes; an older reader must still start.
        extra="ignore",
        populate_by_name=True,
    )

    state_dir: Path = Field(
        default_factory=default_state_dir,
        description="Pids, logs, server data and runtime.env of the local runtime.",
    )
    # The conventional unprefixed names, so a deployment (compose, k8s) sets them as usual.
    nats_url: str | None = Field(
        None, validation_alias=AliasChoices("NATS_URL", "nats_url"), description="NATS server URL."
    )
    database_url: str | None = Field(
        None,
        validation_alias=AliasChoices("DATABASE_URL", "database_url"),
        description="libpq connection URI of the specops database.",
    )
    # NATS credentials (a URL may carry user:password itself): an nkey seed file, as
    # `specops up` gives each service, or a JWT .creds file, for an operator-mode server.
    nats_nkey_seed_file: Path | None = Field(
        None,
        validation_alias=AliasChoices("NATS_NKEY_SEED_FILE", "nats_nkey_seed_file"),
        description="File holding this process's NATS nkey seed (SU...).",
    )
    nats_creds_file: Path | None = Field(
        None,
        validation_alias=AliasChoices("NATS_CREDS_FILE", "nats_creds_file"),
        description="NATS .creds file (user JWT + seed) for a server in operator mode.",
    )
    nats_nkey_seed_dir: Path | None = Field(
        None,
        validation_alias=AliasChoices("NATS_NKEY_SEED_DIR", "nats_nkey_seed_dir"),
        description="Directory of nkey seeds, `<user>.nk` (`specops nats config --write`): "
        "`specops serve S` connects as S, other commands as admin.",
    )
    artifact_dir: Path | None = Field(
        None,
        description="SPECOPS_ARTIFACT_DIR: the content-addressed artifact store (uploaded corpora); "
        "unset: `<state dir>/artifacts`. Every service that reads artifacts must see the same directory.",
    )
    gateway_host: str = Field("127.0.0.1", description="Interface the HTTP gateway binds.")
    gateway_port: int = Field(8787, ge=1, le=65535, description="Port of the HTTP gateway.")
    # Per process (specplatform.ops): `specops up` gives each replica its own, a container 9464.
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Port of this process's /metrics and /healthz; unset: none."
    )
    metrics_host: str = Field(
        "127.0.0.1", description="Interface of /metrics and /healthz (0.0.0.0 in a container)."
    )

    @property
    def artifact_root(self) -> Path:
        return self.artifact_dir if self.artifact_dir is not None else self.state_dir / "artifacts"

    @property
    def gateway_url(self) -> str:
        return f"http://{self.gateway_host}:{self.gateway_port}"

    def require_nats_url(self) -> str:
        if not self.nats_url:
            raise RuntimeSetupError(
                f"no NATS server configured: set NATS_URL or run `specops up` (state dir {self.state_dir})"
            )
        return self.nats_url

    def nats_credentials(self, user: str = ADMIN_USER) -> dict[str, str]:
        """nats.connect / make_broker options for the configured credentials ({} without any).

        From a seed dir, `user`'s seed when it holds one, else the admin's (a state dir made
        before that user existed)."""
        seed_dir = self.nats_nkey_seed_dir
        from_dir = None
        if seed_dir is not None:
            from_dir = nkey_seed_file(seed_dir, user)
            if not from_dir.is_file():
                from_dir = nkey_seed_file(seed_dir, ADMIN_USER)
        for path, option in (
            (self.nats_creds_file, "user_credentials"),
            (self.nats_nkey_seed_file, "nkeys_seed"),
            (from_dir, "nkeys_seed"),
        ):
            if path is not None:
                if not path.is_file():
                    raise RuntimeSetupError(f"NATS credentials file {path} does not exist")
                return {option: str(path)}
        return {}

    def require_database_url(self) -> str:
        if not self.database_url:
            raise RuntimeSetupError(
                f"no database configured: set DATABASE_URL or run `specops up` (state dir {self.state_dir})"
            )
        return self.database_url


S = TypeVar("S", bound=Settings)


@overload
def load_settings(state_dir: Path | None = None) -> Settings: ...
@overload
def load_settings(state_dir: Path | None = None, *, cls: type[S]) -> S: ...


def load_settings(state_dir: Path | None = None, *, cls: type[Settings] = Settings) -> Settings:
    """Settings from the environment, then from the state dir's runtime.env.

    `cls` is a service's subclass adding its own fields (e.g. the gateway's), which
    then load by the same rules.
    """
    directory = state_dir if state_dir is not None else default_state_dir()
    env_file = directory / RUNTIME_ENV_FILE
    return cls(
        state_dir=directory,
        _env_file=env_file if env_file.is_file() else None,  # type: ignore[call-arg]
    )


def service_settings(cls: type[S], given: Settings | None = None) -> S:
    """A service's settings (`cls`, its subclass of Settings), loaded by `load_settings`'s rules.

    `given` is what the caller loaded already (`specops serve` loads the shared settings
    before it knows the service): its state dir is where runtime.env is read and its
    URLs win, so the service talks to the servers its caller found. A `given` of `cls`
    itself (a test's, built by hand) is used as it is.
    """
    if isinstance(given, cls):
        return given
    loaded = load_settings(given.state_dir if given is not None else None, cls=cls)
    if given is None:
        return loaded
    return loaded.model_copy(
        update={
            "nats_url": given.nats_url,
            "database_url": given.database_url,
            "nats_nkey_seed_file": given.nats_nkey_seed_file,
            "nats_creds_file": given.nats_creds_file,
        }
    )


def render_env_file(values: dict[str, str]) -> str:
    """runtime.env text; values are quoted so socket paths with spaces survive dotenv parsing."""
    lines = ["# Written by `specops up`; read by specplatform.settings.load_settings."]
    for key, value in sorted(values.items()):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'{key}="{escaped}"')
    return "\n".join(lines) + "\n"
