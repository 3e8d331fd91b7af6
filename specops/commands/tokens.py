"""`specops tokens create --tenant T --role R`: issue an API token for the HTTP gateway.

Wiring: `add_parsers(sub)` on the top-level subparsers; the parser sets `handler`.
The token is printed once, on stdout; only its sha256 is stored, so it cannot be shown again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from specops_schemas.catalog import Role


def add_parsers(sub: argparse._SubParsersAction) -> None:
    tokens = sub.add_parser("tokens", help="API tokens of the HTTP gateway")
    actions = tokens.add_subparsers(dest="action", required=True, parser_class=type(tokens))
    create = actions.add_parser("create", help="issue a token and print it once")
    create.add_argument("--tenant", required=True, help="tenant id (created on first use)")
    create.add_argument(
        "--role",
        required=True,
        choices=[r.value for r in Role],
        help="viewer (read) < developer (start and apply runs) < admin; head_reviewer as developer",
    )
    create.add_argument("--name", help="a label for the token, e.g. who or what uses it")
    create.add_argument("--database-url", help="default: DATABASE_URL, else the one `specops up` started")
    create.add_argument("--json", action="store_true", help="print id, tenant, role and token as JSON")
    create.set_defaults(handler=run_create)


def run_create(args: argparse.Namespace) -> int:
    from specops_services.gateway.http.tokens import issue_token
    from specplatform.settings import load_settings

    dsn = args.database_url or load_settings().require_database_url()
    try:
        issued = asyncio.run(issue_token(dsn, tenant_id=args.tenant, role=Role(args.role), name=args.name))
    except ValueError as exc:
        print(f"specops tokens create: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        record = {"id": issued.token_id, "tenant": issued.tenant_id, "role": issued.role.value}
        print(json.dumps(record | {"token": issued.secret}))
    else:
        print(issued.secret)
    print(
        f"token {issued.token_id} for tenant {issued.tenant_id} ({issued.role.value}); "
        "it is shown only this once",
        file=sys.stderr,
    )
    return 0
