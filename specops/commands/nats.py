"""`specops nats tenant add T` / `specops nats config`: NATS users of upstream systems and services.

`tenant add` gives tenant T's upstream systems a NATS user (an nkey seed file) that may
publish run requests on `specops.intake.T.run.requested` only and read back
`specops.results.T.>` only; the embedded server (`specops up`) reloads its users at once.
`config` prints the server's `authorization` block (every user, public keys and
permissions) to put into an external nats-server's configuration; `config --write DIR`
keeps the seeds in DIR and writes the block as DIR/nats/auth.conf (docker-compose.yml's
`nats-auth` does this once, for the NATS server and the services to share).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    nats = sub.add_parser("nats", help="NATS users: upstream systems' tenants, the server's authorization")
    actions = nats.add_subparsers(dest="nats_action", required=True, parser_class=type(nats))
    tenant = actions.add_parser("tenant", help="NATS users of a tenant's upstream systems")
    tenant_actions = tenant.add_subparsers(dest="tenant_action", required=True, parser_class=type(nats))
    add = tenant_actions.add_parser(
        "add", help="create (or show) the tenant's NATS user: publish its run requests, read its results"
    )
    add.add_argument("tenant", help="tenant id (its record is created if it has none)")
    add.add_argument("--database-url", help="default: DATABASE_URL, else the one `specops up` started")
    add.add_argument("--json", action="store_true", help="print the user's details as one JSON object")
    add.set_defaults(handler=_tenant_add)
    config = actions.add_parser(
        "config", help="the authorization block (every user's public key and permissions) for a nats-server"
    )
    config.add_argument(
        "--write",
        type=Path,
        metavar="DIR",
        help="keep the seeds in DIR/nats/keys and write DIR/nats/auth.conf (to `include`) instead of "
        "printing it; the services then find their seed with NATS_NKEY_SEED_DIR=DIR/nats/keys",
    )
    config.add_argument(
        "--tenant", action="append", default=[], help="also a user for this tenant (repeatable)"
    )
    config.set_defaults(handler=_config)


def _tenant_add(args: argparse.Namespace) -> int:
    from specops.runtime.supervisor import add_tenant
    from specops_services.gateway.http.tokens import ensure_tenant
    from specplatform.settings import load_settings

    settings = load_settings()
    dsn = args.database_url or settings.require_database_url()
    try:
        asyncio.run(ensure_tenant(dsn, args.tenant))
    except ValueError as exc:
        print(f"specops nats tenant add: error: {exc}", file=sys.stderr)
        return 2
    user = add_tenant(settings, args.tenant)
    if args.json:
        print(json.dumps(asdict(user)))
        return 0
    print(f"tenant        {user.tenant}")
    print(f"nkey seed     {user.seed_file}   (secret: hand it to the upstream system only)")
    print(f"NATS URL      {user.nats_url or '(your NATS_URL)'}")
    print(f"publish to    {user.intake_subject}")
    print(f"subscribe to  {user.results_subjects}")
    print(f"inbox prefix  {user.inbox_prefix}   (nats.connect(..., inbox_prefix=...))")
    if not user.reloaded:
        print(
            "the embedded server is not running: `specops up` loads this user; for an external server "
            "add the output of `specops nats config` to its configuration",
            file=sys.stderr,
        )
    return 0


def _config(args: argparse.Namespace) -> int:
    from specops.runtime import nats_auth
    from specops.runtime.topology import service_users
    from specplatform.settings import load_settings

    keys = nats_auth.Keys(args.write if args.write is not None else load_settings().state_dir)
    for tenant in args.tenant:
        keys.ensure(nats_auth.tenant_user(tenant))
    text = nats_auth.render_authorization(nats_auth.all_users(keys, service_users()))
    if args.write is None:
        print(text, end="")
    else:
        target = keys.dir.parent / "auth.conf"
        target.write_text(text)
        print(f"wrote {target}", file=sys.stderr)
    print(f"seeds: {keys.dir}/<user>.nk (admin, one per service, tenant-<id> per tenant)", file=sys.stderr)
    return 0
