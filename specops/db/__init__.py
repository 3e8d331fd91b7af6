"""The specops database: connection helpers and the numbered SQL migrations."""

from specops.db.dsn import with_database
from specops.db.migrate import migrate
from specops.db.migrations import MigrationError
from specops.db.pool import APP_ROLE, Connection, Pool, connect, create_pool, tenant_transaction

__all__ = [
    "APP_ROLE",
    "Connection",
    "MigrationError",
    "Pool",
    "connect",
    "create_pool",
    "migrate",
    "tenant_transaction",
    "with_database",
]
