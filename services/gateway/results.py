"""What a tenant's upstream systems read back on NATS: their runs' events and intake refusals.

Each event the gateway records for a run (in `runs.create_run` and the projector) is
repeated, byte for byte as the services published it, on
`specops.results.<tenant>.run.<run id>.<event type>` (stream SPEC_RESULTS), through the
outbox in the transaction that records it: a run's tenant hears every event its
`GET runs/{id}/events` stream shows, exactly once per event. The copy has an id of its
own (derived from the event's), since the outbox and the broker's dedup key on ids.
"""

from __future__ import annotations

import uuid
from typing import Any

from specbus import outbox
from specbus.envelope import Envelope
from specbus.publish import envelope_headers
from specbus.subjects import intake_answer_subject, result_subject
from specops_schemas.intake import IntakeAccepted, IntakeRejected
from specplatform.db import Connection

PRODUCER = "gateway"
# uuid5 namespace of the ids of the copies (any fixed UUID would do).
_NOTICE_NAMESPACE = uuid.UUID("0c4f8e3a-6a55-4d8b-9a53-5e2f3c9d7b10")


def notice_id(key: str) -> str:
    return str(uuid.uuid5(_NOTICE_NAMESPACE, key))


async def repeat(conn: Connection, event: Envelope[Any]) -> None:
    """Queue the copy of a run's event for its tenant, in the caller's transaction."""
    await outbox.add_message(
        conn,
        message_id=notice_id(f"event/{event.event_id}"),
        subject=result_subject(event.tenant_id, event.correlation_id, event.type),
        body=event.to_json_bytes(),
        headers=envelope_headers(event),
        producer=PRODUCER,
    )


async def answer(conn: Connection, notice: IntakeAccepted | IntakeRejected) -> None:
    """Queue the answer to one intake message for the tenant that published it.

    One per message (keyed on its intake stream sequence): a request published again
    is answered again, with the same run.
    """
    kind = notice.type.split(".", 1)[1]
    await outbox.add_message(
        conn,
        message_id=notice_id(f"{kind}/{notice.stream_sequence}"),
        subject=intake_answer_subject(notice.tenant_id, kind),
        body=notice.model_dump_json().encode(),
        headers={"content-type": "application/json"},
        producer=PRODUCER,
    )
