"""`specops up` brings the streams to the current configuration (specbus.broker: SPEC's
stream_config, and SPEC_INTAKE / SPEC_RESULTS for upstream systems).

Services only create a stream when it is missing (specbus.broker.ensure_stream) and
never touch an existing one; the runtime is where a changed configuration (a new
max_age, say) is applied to a stream that already holds events.
"""

from __future__ import annotations

from collections.abc import Mapping

import nats
from nats.js.api import StreamConfig
from nats.js.errors import APIError, NotFoundError
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from specbus.broker import (
    MAX_AGE_S,
    MAX_BYTES,
    UPSTREAM_MAX_AGE_S,
    UPSTREAM_MAX_BYTES,
    stream_config,
    upstream_stream_configs,
)
from specplatform.errors import RuntimeSetupError

_DAY_S = 86_400.0
# JetStream's answer when a stream's max_bytes does not fit in what is left of its store.
_NO_ROOM = 10047


class StreamLimits(BaseSettings):
    """`SPECOPS_STREAM_*` and `SPECOPS_UPSTREAM_STREAM_*`: how much the streams keep.

    At either limit a stream discards its oldest messages (see specbus.broker).
    """

    model_config = SettingsConfigDict(env_prefix="SPECOPS_", extra="ignore")

    stream_max_bytes: int = Field(MAX_BYTES, ge=1, description="Largest size of the SPEC stream, bytes.")
    stream_max_age_days: float = Field(
        MAX_AGE_S / _DAY_S, gt=0, description="Age at which SPEC's events are discarded, days."
    )
    upstream_stream_max_bytes: int = Field(
        UPSTREAM_MAX_BYTES, ge=1, description="Largest size of SPEC_INTAKE and of SPEC_RESULTS, bytes each."
    )
    upstream_stream_max_age_days: float = Field(
        UPSTREAM_MAX_AGE_S / _DAY_S, gt=0, description="Age at which upstream messages are discarded, days."
    )

    def configs(self) -> list[StreamConfig]:
        return [
            stream_config(max_age_s=self.stream_max_age_days * _DAY_S, max_bytes=self.stream_max_bytes),
            *upstream_stream_configs(
                max_age_s=self.upstream_stream_max_age_days * _DAY_S, max_bytes=self.upstream_stream_max_bytes
            ),
        ]


async def apply_stream_config(
    nats_url: str, credentials: Mapping[str, str] | None = None, limits: StreamLimits | None = None
) -> None:
    """Create each stream, or update an existing one to its configuration.

    `credentials`: nats.connect options (`nkeys_seed=...`) of a user allowed to manage streams.
    `limits`: their sizes and ages; by default from the environment.
    """
    nc = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=0, **(credentials or {}))
    try:
        js = nc.jetstream()
        for config in (limits or StreamLimits()).configs():
            try:
                try:
                    await js.stream_info(str(config.name))
                except NotFoundError:
                    await js.add_stream(config)
                else:
                    await js.update_stream(config)
            except APIError as exc:
                if exc.err_code != _NO_ROOM:
                    raise
                raise RuntimeSetupError(
                    f"the {config.name} stream's max_bytes ({config.max_bytes}) does not fit in the "
                    f"NATS server's JetStream store: give the server more (max_file_store) or set "
                    f"SPECOPS_STREAM_MAX_BYTES / SPECOPS_UPSTREAM_STREAM_MAX_BYTES lower"
                ) from None
    finally:
        await nc.close()
