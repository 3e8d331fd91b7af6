"""JSON Schema and AsyncAPI 3.0 documents derived from the models (`make asyncapi`).

python -m specops_schemas.generate --out schemas/generated [--check]
"""

from __future__ import annotations

import argparse
import json
from importlib.metadata import version
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from specbus import subjects
from specbus.dlq import DeadLetter
from specbus.envelope import Envelope
from specops_schemas.api import (
    ApplyRequest,
    ApplyResponse,
    Me,
    Problem,
    RunCreateRequest,
    RunList,
    RunStatusResponse,
)
from specops_schemas.events import EVENT_TYPES
from specops_schemas.heads import (
    HeadDataResponse,
    HeadList,
    HeadResponse,
    HeadTrainRequest,
    HeadTransitionRequest,
)
from specops_schemas.intake import IntakeAccepted, IntakeRejected, IntakeRequest
from specops_schemas.registry import DatastoreList, DatastoreResponse
from specops_schemas.tune import TuneSessionCreateRequest, TuneSessionList, TuneSessionResponse

API_MODELS: tuple[type[BaseModel], ...] = (
    RunCreateRequest,
    RunStatusResponse,
    RunList,
    Me,
    ApplyRequest,
    ApplyResponse,
    TuneSessionCreateRequest,
    TuneSessionResponse,
    TuneSessionList,
    DatastoreResponse,
    DatastoreList,
    HeadDataResponse,
    HeadTrainRequest,
    HeadTransitionRequest,
    HeadResponse,
    HeadList,
    Problem,
)
# What upstream systems publish and hear back on NATS (specops_schemas.intake).
INTAKE_MODELS: tuple[type[BaseModel], ...] = (IntakeRequest, IntakeAccepted, IntakeRejected)
DLQ_CHANNEL = "dlq"


def _envelopes() -> dict[str, type[BaseModel]]:
    return {event_type: Envelope[cls] for event_type, cls in EVENT_TYPES.items()}  # type: ignore[valid-type]


def json_schemas() -> dict[str, dict[str, Any]]:
    """File name -> standalone JSON Schema, one per event envelope and per HTTP body."""
    out = {f"event.{t}.schema.json": m.model_json_schema() for t, m in _envelopes().items()}
    out |= {f"api.{m.__name__}.schema.json": m.model_json_schema() for m in API_MODELS}
    out |= {f"intake.{m.__name__}.schema.json": m.model_json_schema() for m in INTAKE_MODELS}
    out["dlq.DeadLetter.schema.json"] = DeadLetter.model_json_schema()
    return out


def _message(name: str, model: type[BaseModel], payload_ref: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "title": model.__name__,
        "summary": (model.__doc__ or model.__name__).strip().splitlines()[0],
        "contentType": "application/json",
        "payload": payload_ref,
    }


def asyncapi() -> dict[str, Any]:
    """One channel per subject pattern, one message per event type, schemas shared in components."""
    envelopes = _envelopes()
    mode: JsonSchemaMode = "validation"
    inputs = [(m, mode) for m in envelopes.values()] + [(DeadLetter, mode)]
    refs, defs = models_json_schema(inputs, ref_template="#/components/schemas/{model}")

    channels: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    operations: dict[str, Any] = {}

    def add(channel: str, address: str, parameter: dict[str, Any], message: dict[str, Any]) -> None:
        title = message["title"]
        messages[title] = message
        channels[channel] = {
            "address": address,
            "parameters": parameter,
            "messages": {title: {"$ref": f"#/components/messages/{title}"}},
        }
        operations[f"publish.{channel}"] = {
            "action": "send",
            "channel": {"$ref": f"#/channels/{channel}"},
            "messages": [{"$ref": f"#/channels/{channel}/messages/{title}"}],
        }

    id_param = {"id": {"description": "Aggregate id: the payload's run_id or bench_id."}}
    for event_type, envelope in envelopes.items():
        aggregate, event = event_type.split(".", 1)
        message = _message(event_type, EVENT_TYPES[event_type], refs[(envelope, mode)])
        message["correlationId"] = {"location": "$message.payload#/correlation_id"}
        message["headers"] = {
            "type": "object",
            "properties": {
                "Nats-Msg-Id": {"type": "string", "description": "The event_id; broker dedup key."}
            },
        }
        add(event_type, subjects.pattern(aggregate, event).replace("*", "{id}"), id_param, message)

    add(
        DLQ_CHANNEL,
        subjects.dlq_subject("service").replace("service", "{service}"),
        {"service": {"description": "Service that parked the message."}},
        _message("dlq.parked", DeadLetter, refs[(DeadLetter, mode)]),
    )
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "specops events",
            "version": version("specops"),
            "description": f"Every event is an envelope on JetStream stream `{subjects.STREAM}` "
            f"(`{subjects.STREAM_SUBJECTS}`). Generated from specops_schemas; do not edit.",
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {
                "host": "localhost:4222",
                "protocol": "nats",
                "description": "nats-server started by `specops up` (NATS_URL points elsewhere).",
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"schemas": defs.get("$defs", {}), "messages": messages},
    }


def render() -> dict[str, str]:
    """File name -> exact file text (sorted keys, trailing newline) for everything generated."""
    docs = json_schemas() | {"asyncapi.json": asyncapi()}
    return {name: json.dumps(doc, indent=2, sort_keys=True) + "\n" for name, doc in sorted(docs.items())}


def stale_files(out: Path) -> list[str]:
    """Generated files missing, outdated or left over in `out`."""
    expected = render()
    present = {p.name for p in out.glob("*.json")} if out.is_dir() else set()
    changed = [n for n, text in expected.items() if n not in present or (out / n).read_text() != text]
    return sorted(changed + list(present - expected.keys()))


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    expected = render()
    for leftover in set(p.name for p in out.glob("*.json")) - expected.keys():
        (out / leftover).unlink()
    for name, text in expected.items():
        (out / name).write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specops_schemas.generate", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "generated")
    parser.add_argument("--check", action="store_true", help="fail if the files in --out are not up to date")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.out)
        if stale:
            print(f"out of date in {args.out} (run `make asyncapi`): {', '.join(stale)}")
        return int(bool(stale))
    write(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
