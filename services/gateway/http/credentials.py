"""Who is asking, without I/O: roles, API tokens, and the console's session cookie with its CSRF check."""

from __future__ import annotations

import hashlib
import secrets

from specops_schemas.catalog import Role

# head_reviewer signs heads off to production, which outranks the developer's uat step
# (the product's roles), so on the runs API it has a developer's rights; only admin is above.
ROLE_RANK: dict[Role, int] = {Role.VIEWER: 0, Role.DEVELOPER: 1, Role.HEAD_REVIEWER: 1, Role.ADMIN: 2}


def has_role(role: Role, required: Role) -> bool:
    return ROLE_RANK[role] >= ROLE_RANK[required]


TOKEN_PREFIX = "spk_"


def new_token() -> str:
    """A bearer secret; only its sha256 is stored, so it is shown to its owner exactly once."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    # A plain hash suffices: the token is 256 random bits, not a guessable password.
    return hashlib.sha256(token.encode()).hexdigest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme is case-insensitive)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token


# The session cookie holds a random session id (HttpOnly, SameSite=Strict) whose hash names a
# server-side session, never the API token, so signing out or revoking the token ends it; the
# CSRF cookie a random value the console's script echoes in CSRF_HEADER (double submit), which a
# page of another origin cannot read.
SESSION_COOKIE = "specops_session"
CSRF_COOKIE = "specops_csrf"
CSRF_HEADER = "X-Specops-CSRF"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


SESSION_PREFIX = "sps_"


def new_session_id() -> str:
    """A console session's secret; like a token, only its sha256 (`hash_token`) is stored."""
    return SESSION_PREFIX + secrets.token_urlsafe(32)


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


def csrf_refusal(method: str, cookie: str | None, header: str | None) -> str | None:
    """Why a request authenticated by the session cookie is refused as a possible cross-site
    forgery, or None: unsafe methods must echo the CSRF cookie in CSRF_HEADER."""
    if method.upper() in SAFE_METHODS:
        return None
    if not cookie or not header:
        return f"a request with the session cookie needs the {CSRF_HEADER} header (the {CSRF_COOKIE} cookie)"
    if not secrets.compare_digest(cookie.encode(), header.encode()):
        return f"the {CSRF_HEADER} header does not match the {CSRF_COOKIE} cookie"
    return None
