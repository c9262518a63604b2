"""API tokens: ``dh_<token_id>_<secret>``, of which the World keeps only sha256(secret).

A token is made by the operator (``durable-harness token create``) and shown once. A
request carries it as ``Authorization: Bearer dh_<token_id>_<secret>``; :func:`caller_of`
looks the id up and compares the digests in constant time. Unknown, malformed, revoked
and wrong tokens all get the same 401 (a caller learns nothing about which ids exist),
and a header that is not ASCII is a wrong token, never a 500.

A tenant token sees its tenant's sessions and turns only; an operator token
(``--operator``) sees every tenant's, and the items made outside ``serve``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

from durable_harness.core.errors import ConfigError, NotFound
from durable_harness.core.types import ApiToken
from durable_harness.core.world import Tenancy

PREFIX = "dh_"
_TOKEN = re.compile(r"dh_(?P<id>[0-9a-f]{16})_(?P<secret>[A-Za-z0-9_-]{20,128})")
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: Compared against when the token id is unknown, so that case costs what a wrong secret does.
_DUMMY = hashlib.sha256(b"no such token").hexdigest()


@dataclass(frozen=True)
class Caller:
    """Who a request is from: the token's tenant, and whether it administers."""

    token_id: str
    tenant: str
    operator: bool

    def owns(self, owner: str | None) -> bool:
        """Whether this caller may see an item owned by ``owner`` (None: made outside serve)."""
        return self.operator or (owner is not None and owner == self.tenant)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(
    world: Tenancy, tenant: str, *, operator: bool = False, label: str = ""
) -> tuple[ApiToken, str]:
    """Store a new token; return it and the text the caller presents (shown once)."""
    if not _TENANT.fullmatch(tenant):
        raise ConfigError(
            f"--tenant {tenant!r}: a tenant is 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    token_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    token = ApiToken(token_id, tenant, digest(secret), time.time(), operator, label)
    world.put_token(token)
    return token, f"{PREFIX}{token_id}_{secret}"


def parse_bearer(header: str | None) -> tuple[str, str] | None:
    """``(token_id, secret)`` of an ``Authorization: Bearer dh_...`` header, or None."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    match = _TOKEN.fullmatch(value.strip())
    return (match["id"], match["secret"]) if match else None


def caller_of(world: Tenancy, header: str | None) -> Caller | None:
    """The caller an ``Authorization`` header proves, or None (answer 401)."""
    parsed = parse_bearer(header)
    if parsed is None:
        return None
    token_id, secret = parsed
    try:
        token: ApiToken | None = world.get_token(token_id)
    except NotFound:
        token = None
    expected = token.digest if token is not None else _DUMMY
    if not hmac.compare_digest(digest(secret).encode(), expected.encode()):
        return None
    if token is None or token.revoked_at is not None:
        return None
    return Caller(token.token_id, token.tenant, token.operator)
