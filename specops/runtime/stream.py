"""`specops up` brings the streams to the current configuration (specbus.broker: SPEC's
stream_config, and SPEC_INTAKE / SPEC_RESULTS for upstream systems).

Services only create a stream when it is missing (specbus.broker.ensure_stream) and
never touch an existing one; the runtime is where a changed configuration (a new
max_age, say) is applied to a stream that already holds events.
"""

from __future__ import annotations

from collections.abc import Mapping

import nats
from nats.js.errors import NotFoundError

from specbus.broker import stream_config, upstream_stream_configs


async def apply_stream_config(nats_url: str, credentials: Mapping[str, str] | None = None) -> None:
    """Create each stream, or update an existing one to its configuration.

    `credentials`: nats.connect options (`nkeys_seed=...`) of a user allowed to manage streams.
    """
    nc = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=0, **(credentials or {}))
    try:
        js = nc.jetstream()
        for config in (stream_config(), *upstream_stream_configs()):
            try:
                await js.stream_info(str(config.name))
            except NotFoundError:
                await js.add_stream(config)
            else:
                await js.update_stream(config)
    finally:
        await nc.close()
