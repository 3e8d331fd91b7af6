"""`specops datastores upload FILE --name N [--fingerprints code,rag]` and `specops datastores ls`:
a tenant's corpora for the rest family, through the gateway (the SDK's `client.datastores`).

Wiring: `add_parsers(sub)` on the top-level subparsers; the parser sets `handler`. (`specops
datastore build` indexes a corpus locally, for `specops generate/bench --datastore`.)

Exit codes: 0 done; 2 the gateway refused or could not be reached (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from specops.client import SpecopsError, SpeculativeClient
from specops_schemas.catalog import Fingerprint
from specops_schemas.registry import DatastoreResponse

EXIT_ERROR = 2


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("datastores", help="upload and list the tenant's corpora for the rest family")
    actions = p.add_subparsers(dest="action", required=True, parser_class=type(p))
    upload = actions.add_parser(
        "upload",
        help="upload a corpus (.jsonl/.ndjson: one record a line; anything else: one text document)",
    )
    upload.add_argument("file", help="the corpus file")
    upload.add_argument("--name", help="a name for it (default: the file's name)")
    upload.add_argument(
        "--fingerprints",
        help="comma-separated workloads it serves (default: any of them): " + ", ".join(Fingerprint),
    )
    upload.set_defaults(handler=run_upload)
    ls = actions.add_parser("ls", help="the tenant's datastores, newest first")
    ls.set_defaults(handler=run_ls)
    for action in (upload, ls):
        action.add_argument(
            "--url", help="gateway URL (default: SPECOPS_URL, else the one `specops up` serves)"
        )
        action.add_argument("--token", help="API token (default: SPECOPS_TOKEN, else the state dir's token)")
        action.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run_upload(args: argparse.Namespace) -> int:
    workloads = [part.strip() for part in (args.fingerprints or "").split(",") if part.strip()]
    try:
        with SpeculativeClient(args.url, args.token) as client:
            store = client.datastores.upload(args.file, name=args.name, fingerprints=workloads)
    except (SpecopsError, OSError, ValueError) as exc:
        print(f"specops datastores upload: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(store.model_dump_json())
    else:
        print(store.id)
        print(
            f"datastore {store.id} '{store.name}': {store.documents} documents, {store.size_bytes} bytes; "
            "rest candidates draft from it in this tenant's runs",
            file=sys.stderr,
        )
    return 0


def run_ls(args: argparse.Namespace) -> int:
    try:
        with SpeculativeClient(args.url, args.token) as client:
            stores = client.datastores.list()
    except SpecopsError as exc:
        print(f"specops datastores ls: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps([s.model_dump(mode="json") for s in stores]))
        return 0
    print(f"{'id':28} {'name':24} {'docs':>7} {'bytes':>12}  fingerprints  created")
    for store in stores:
        print(_row(store))
    return 0


def _row(store: DatastoreResponse) -> str:
    workloads = ",".join(f.value for f in store.fingerprints) or "any"
    created = store.created_at.strftime("%Y-%m-%d %H:%M")
    counts = f"{store.documents:>7} {store.size_bytes:>12}"
    return f"{store.id:28} {store.name[:24]:24} {counts}  {workloads:12}  {created}"
