"""Connection strings: the same server, another database."""

from __future__ import annotations

from urllib.parse import quote, urlsplit, urlunsplit

from psycopg.conninfo import make_conninfo


def with_database(dsn: str, database: str) -> str:
    """`dsn` pointing at `database`; a URI stays a URI (socket host in the query survives)."""
    if "://" in dsn:
        return urlunsplit(urlsplit(dsn)._replace(path="/" + quote(database, safe="")))
    return make_conninfo(dsn, dbname=database)
