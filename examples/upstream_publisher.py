"""An upstream system asking specops for a T1 run over NATS, written with plain nats-py.

It uses nothing of specops: only `nats-py` (with `nkeys`), JSON and the subjects below.

    specops up
    specops nats tenant add acme          # prints the seed file, URL and subjects
    python examples/upstream_publisher.py --tenant acme \\
        --seed ~/.local/state/specops/nats/keys/tenant-acme.nk --nats nats://127.0.0.1:4222

What it does:
1. connects as the tenant's NATS user (an nkey seed) with the tenant's inbox prefix, the
   only replies that user may read;
2. subscribes to `specops.results.<tenant>.>` *before* publishing, so nothing is missed;
3. publishes one request on `specops.intake.<tenant>.run.requested` through JetStream
   (the PubAck says it is stored), with a random event_id that is also its Nats-Msg-Id;
   publishing the same body again is the same run;
4. waits for `intake.accepted` (its run id) or `intake.rejected` (the reason), then
   prints the run's events as they come and, on `run.completed`, the winner.

Exit status: 0 completed, 1 failed or rejected, 2 nothing heard within --timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import nats

REQUEST: dict[str, Any] = {
    "target": {"model_ref": "smollm2-135m-instruct", "gpu": "cpu", "engine": "speccore"},
    "workload": {"fingerprint": "chat"},
    "goal": {"quality_gate": "topk5"},
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--seed", required=True, help="the tenant's nkey seed file")
    parser.add_argument("--nats", default="nats://127.0.0.1:4222", help="NATS URL")
    parser.add_argument("--request", help="a JSON file with the run request (default: a chat run on the CPU)")
    parser.add_argument("--event-id", help="reuse an event id (default: a new uuid4)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the run to end")
    return parser.parse_args()


def report(run_id: str, run: dict[str, Any]) -> int:
    """Print how the run ended; the exit status."""
    if run["status"] == "failed":
        print(f"run {run_id} failed: {(run.get('error') or run).get('message')}")
        return 1
    print(json.dumps({"run_id": run_id, "winner": run.get("winner")}, indent=2))
    return 0


async def follow(args: argparse.Namespace) -> int:
    request = json.loads(Path(args.request).read_text()) if args.request else REQUEST
    event_id = args.event_id or str(uuid.uuid4())
    nc = await nats.connect(args.nats, nkeys_seed=args.seed, inbox_prefix=f"_INBOX.tenant.{args.tenant}")
    try:
        results = await nc.subscribe(f"specops.results.{args.tenant}.>")
        ack = await nc.jetstream().publish(
            f"specops.intake.{args.tenant}.run.requested",
            json.dumps({"event_id": event_id, "request": request}).encode(),
            headers={"Nats-Msg-Id": event_id},
        )
        print(f"published request {event_id} ({ack.stream} seq {ack.seq})", flush=True)
        run_id = None
        async with asyncio.timeout(args.timeout):
            async for msg in results.messages:
                body = json.loads(msg.data)
                kind = body.get("type")
                if kind in ("intake.accepted", "intake.rejected") and body.get("event_id") != event_id:
                    continue  # another request of this tenant
                if kind == "intake.rejected":
                    print(f"rejected: {body['problem'].get('detail') or body['problem']['title']}")
                    return 1
                if kind == "intake.accepted":
                    run_id = body["run_id"]
                    print(f"accepted as run {run_id} ({body['run']['status']})", flush=True)
                    if body["run"]["status"] in ("completed", "failed"):
                        # A winner-cache hit, or a request published again after its run ended.
                        return report(run_id, body["run"])
                    continue
                if run_id is None or body.get("correlation_id") != run_id:
                    continue
                print(f"  {kind}", flush=True)
                if kind in ("run.completed", "run.failed"):
                    return report(run_id, body["payload"] | {"status": kind.split(".")[1]})
    except TimeoutError:
        print(f"no answer within {args.timeout:g} s", file=sys.stderr)
        return 2
    finally:
        await nc.close()
    return 2


if __name__ == "__main__":
    sys.exit(asyncio.run(follow(parse_args())))
