"""A tenant's corpora for the rest family: `POST datastores` (the body streamed to disk),
`GET datastores[/{id}]`, and the rows their registration events write.

The names below are what other parts of the gateway may use; the modules inside are this
resource's own (an import-linter contract in pyproject.toml holds that).
"""

from specops_services.gateway.datastores.db import insert_datastore

__all__ = [
    "insert_datastore",
]
