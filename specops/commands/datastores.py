"""`specops datastores`: corpora for the rest family.

- `specops datastores build --model M --corpus PATH --out FILE` indexes a corpus on this
  machine, for `specops generate/bench --datastore FILE` (no stack needed).
- `specops datastores upload FILE --name N [--fingerprints code,rag]` and `specops datastores ls`:
  a tenant's corpora, through the gateway (the SDK's `client.datastores`).

Wiring: `add_parsers(sub)` on the top-level subparsers; each action sets `handler`.

Exit codes: 0 done; 2 the corpus or model could not be read, or the gateway refused or could
not be reached (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from specops.client import SpecopsError, SpeculativeClient
from specops.commands.decoding import load_target
from specops.commands.tables import table
from specops_schemas.catalog import Fingerprint
from specops_schemas.registry import DatastoreResponse

EXIT_ERROR = 2


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "datastores", help="corpora for the rest family: build one here, or upload and list the tenant's"
    )
    actions = p.add_subparsers(dest="action", required=True, parser_class=type(p))
    build = actions.add_parser(
        "build", help="index a corpus (text, JSONL or a directory) on this machine, for --datastore"
    )
    build.add_argument("--model", required=True, help="model whose tokenizer the datastore uses")
    build.add_argument("--corpus", required=True, type=Path)
    build.add_argument("--pattern", default="*", help="file glob when the corpus is a directory")
    build.add_argument(
        "--exclude", action="append", default=[], help="skip paths with this part (repeatable)"
    )
    build.add_argument("--out", required=True, type=Path, help="the datastore file to write")
    build.set_defaults(handler=run_build)
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
    for action in (upload, ls):  # build needs no gateway
        action.add_argument(
            "--url", help="gateway URL (default: SPECOPS_URL, else the one `specops up` serves)"
        )
        action.add_argument("--token", help="API token (default: SPECOPS_TOKEN, else the state dir's token)")
        action.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run_build(args: argparse.Namespace) -> int:
    """Index the corpus with the model's tokenizer; print the datastore's metadata as one JSON line."""
    from speccore.datastore import build_datastore

    target = load_target(argparse.Namespace(model=args.model, device="cpu", dtype="auto", threads=None))
    store = build_datastore(
        target.tokenizer, args.corpus, args.out, pattern=args.pattern, exclude=tuple(args.exclude)
    )
    print(json.dumps({"out": str(args.out), **store.meta}))
    return 0


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
    header = ("id", "name", "docs", "bytes", "fingerprints", "created")
    print(table(header, [_row(store) for store in stores], right={"docs", "bytes"}))
    return 0


def _row(store: DatastoreResponse) -> tuple[str, ...]:
    workloads = ",".join(f.value for f in store.fingerprints) or "any"
    created = store.created_at.strftime("%Y-%m-%d %H:%M")
    return (store.id, store.name, str(store.documents), str(store.size_bytes), workloads, created)
