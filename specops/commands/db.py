"""`specops db migrate`: apply the numbered SQL migrations (specplatform.db.migrate).

Wiring: `add_parsers(sub)` on the top-level subparsers; the parser sets `handler`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from specops_schemas import MIGRATIONS


def add_parsers(sub: argparse._SubParsersAction) -> None:
    db = sub.add_parser("db", help="the specops database")
    actions = db.add_subparsers(dest="action", required=True, parser_class=type(db))
    migrate = actions.add_parser("migrate", help="apply pending schemas/sql migrations to DATABASE_URL")
    migrate.add_argument("--database-url", help="default: DATABASE_URL, else the one `specops up` started")
    migrate.set_defaults(handler=run_migrate)


def run_migrate(args: argparse.Namespace) -> int:
    from specplatform.db import migrate
    from specplatform.settings import load_settings

    dsn = args.database_url or load_settings().require_database_url()
    applied = asyncio.run(migrate(dsn, MIGRATIONS))
    print(f"applied: {', '.join(applied)}" if applied else "database is up to date", file=sys.stderr)
    return 0
