"""`specops up` brings the SPEC stream to the current configuration (specbus.broker.stream_config).

Services only create the stream when it is missing (specbus.broker.ensure_stream) and
never touch an existing one; the runtime is where a changed configuration (a new
max_age, say) is applied to a stream that already holds events.
"""

from __future__ import annotations

import nats
from nats.js.errors import NotFoundError

from specbus.broker import stream_config
from specbus.subjects import STREAM


async def apply_stream_config(nats_url: str) -> None:
    """Create the SPEC stream, or update an existing one to stream_config()."""
    nc = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        js = nc.jetstream()
        config = stream_config()
        try:
            await js.stream_info(STREAM)
        except NotFoundError:
            await js.add_stream(config)
        else:
            await js.update_stream(config)
    finally:
        await nc.close()
