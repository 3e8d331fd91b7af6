"""The specops database: connection helpers and the numbered SQL migrations."""

from specplatform.db.dsn import with_database
from specplatform.db.migrate import migrate
from specplatform.db.migrations import MigrationError
from specplatform.db.pool import (
    APP_ROLE,
    Connection,
    Pool,
    connect,
    create_pool,
    role_transaction,
    tenant_transaction,
)
from specplatform.db.reachable import unreachable, wait_for_database

__all__ = [
    "APP_ROLE",
    "Connection",
    "MigrationError",
    "Pool",
    "connect",
    "create_pool",
    "migrate",
    "role_transaction",
    "tenant_transaction",
    "unreachable",
    "wait_for_database",
    "with_database",
]
