"""The PostgreSQL World's tenancy: ``api_tokens``, ``owners``, ``rate_counts``.

Each operation is one autocommit statement (``put_owner`` and ``put_token`` read back
what a concurrent writer committed in a second one). Rate windows are the database
server's clock, like leases, so every ``serve`` counts in the same window.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg

from durable_harness.core.errors import NotFound, StepConflict, WorldError
from durable_harness.core.types import ApiToken
from durable_harness.core.world import Tenancy
from durable_harness.worlds.postgres import connections as db
from durable_harness.worlds.postgres.connections import PostgresConnections
from durable_harness.worlds.postgres.sql import Row

_TOKEN = "token_id, tenant, digest, created_at, operator, label, revoked_at"

PUT_TOKEN = f"""
INSERT INTO durable_harness.api_tokens ({_TOKEN})
VALUES (%(token_id)s, %(tenant)s, %(digest)s, %(created_at)s, %(operator)s, %(label)s,
        %(revoked_at)s)
ON CONFLICT (token_id) DO NOTHING
RETURNING token_id"""

GET_TOKEN = f"SELECT {_TOKEN} FROM durable_harness.api_tokens WHERE token_id = %s"

# Ties in code point order, as in every other World.
LIST_TOKENS = f"""
SELECT {_TOKEN} FROM durable_harness.api_tokens
ORDER BY created_at, token_id COLLATE "C"
"""

# A second revoke keeps the first time.
REVOKE_TOKEN = f"""
UPDATE durable_harness.api_tokens SET revoked_at = COALESCE(revoked_at, %s)
WHERE token_id = %s
RETURNING {_TOKEN}"""

# The owner after the statement: ours if the insert won, else the one recorded before.
# No row when a concurrent insert committed after the statement began: read it again.
PUT_OWNER = """
WITH put AS (
    INSERT INTO durable_harness.owners (kind, item_id, tenant, created_at)
    VALUES (%(kind)s, %(item_id)s, %(tenant)s, %(created_at)s)
    ON CONFLICT (kind, item_id) DO NOTHING
    RETURNING tenant
)
SELECT tenant FROM put
UNION ALL
SELECT tenant FROM durable_harness.owners
WHERE kind = %(kind)s AND item_id = %(item_id)s AND NOT EXISTS (SELECT FROM put)"""

GET_OWNER = "SELECT tenant FROM durable_harness.owners WHERE kind = %s AND item_id = %s"

# Keyset pages on the index owners_newest (tenant, kind, created_at DESC, item_id DESC).
LIST_OWNED = """
SELECT created_at, item_id FROM durable_harness.owners
WHERE tenant = %(tenant)s AND kind = %(kind)s
ORDER BY created_at DESC, item_id DESC LIMIT %(limit)s"""

LIST_OWNED_BEFORE = """
SELECT created_at, item_id FROM durable_harness.owners
WHERE tenant = %(tenant)s AND kind = %(kind)s
  AND (created_at, item_id) < (%(created_at)s, %(item_id)s)
ORDER BY created_at DESC, item_id DESC LIMIT %(limit)s"""

# Counts one use in the current window unless it is full (then no row comes back). The
# bucket's earlier windows go in the same statement, so the table holds one row per
# bucket, not one per window ever used.
TAKE_RATE = """
WITH now AS (
    SELECT floor(durable_harness.epoch_now() / %(window_s)s)::bigint AS window_no
), expired AS (
    DELETE FROM durable_harness.rate_counts
    WHERE bucket = %(bucket)s AND window_s = %(window_s)s
      AND window_no < (SELECT window_no FROM now)
)
INSERT INTO durable_harness.rate_counts AS r (bucket, window_s, window_no, count)
SELECT %(bucket)s, %(window_s)s, window_no, 1 FROM now
ON CONFLICT (bucket, window_s, window_no) DO UPDATE SET count = r.count + 1
WHERE r.count < %(limit)s
RETURNING count"""


class PostgresTenancy(PostgresConnections, Tenancy):
    """The tenancy facet of :class:`~durable_harness.worlds.postgres.PostgresWorld`."""

    def put_token(self, token: ApiToken) -> None:
        params = dataclasses.asdict(token)  # its fields are the table's columns

        def op(conn: psycopg.Connection[Any], retried: bool) -> None:
            if db.one_row(conn, PUT_TOKEN, params) is not None:
                return
            if retried:
                row = db.one_row(conn, GET_TOKEN, (token.token_id,))
                if row is not None and token_of(row) == token:
                    return  # the first try committed; only its reply was lost
            raise StepConflict(f"API token {token.token_id!r} exists already: make a new token id")

        self._run("put_token", op)

    def get_token(self, token_id: str) -> ApiToken:
        row = self._run("get_token", lambda c, _: db.one_row(c, GET_TOKEN, (token_id,)))
        if row is None:
            raise NotFound(f"no API token {token_id!r}")
        return token_of(row)

    def list_tokens(self) -> list[ApiToken]:
        rows = self._run("list_tokens", lambda c, _: db.all_rows(c, LIST_TOKENS))
        return [token_of(row) for row in rows]

    def revoke_token(self, token_id: str, at: float) -> ApiToken:
        params = (float(at), token_id)
        row = self._run("revoke_token", lambda c, _: db.one_row(c, REVOKE_TOKEN, params))
        if row is None:
            raise NotFound(f"no API token {token_id!r}")
        return token_of(row)

    def put_owner(self, kind: str, item_id: str, tenant: str, created_at: float) -> None:
        params = {
            "kind": kind,
            "item_id": item_id,
            "tenant": tenant,
            "created_at": float(created_at),
        }

        def op(conn: psycopg.Connection[Any], retried: bool) -> str | None:
            row = db.one_row(conn, PUT_OWNER, params) or db.one_row(
                conn, GET_OWNER, (kind, item_id)
            )
            return None if row is None else str(row["tenant"])

        owner = self._run("put_owner", op)
        if owner is None:
            raise WorldError(f"the owner of {kind} {item_id!r} was neither recorded nor found")
        if owner != tenant:
            raise StepConflict(f"{kind} {item_id!r} belongs to another tenant")

    def get_owner(self, kind: str, item_id: str) -> str | None:
        row = self._run("get_owner", lambda c, _: db.one_row(c, GET_OWNER, (kind, item_id)))
        return None if row is None else str(row["tenant"])

    def list_owned(
        self,
        tenant: str,
        kind: str,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[tuple[float, str]]:
        params: dict[str, Any] = {"tenant": tenant, "kind": kind, "limit": limit}
        query = LIST_OWNED
        if before is not None:
            query = LIST_OWNED_BEFORE
            params["created_at"], params["item_id"] = float(before[0]), before[1]
        rows = self._run("list_owned", lambda c, _: db.all_rows(c, query, params))
        return [(float(r["created_at"]), str(r["item_id"])) for r in rows]

    def take_rate(self, bucket: str, limit: int, window_s: float) -> bool:
        """One statement, atomic across processes. A use whose reply was lost with its
        connection is counted again by the retry: the bucket may refuse one use early,
        never allow one more than ``limit``."""
        if window_s <= 0:
            raise WorldError(f"rate window of {window_s}s: it must be a positive number")
        if limit <= 0:
            return False
        params = {"bucket": bucket, "limit": limit, "window_s": float(window_s)}
        row = self._run("take_rate", lambda c, _: db.one_row(c, TAKE_RATE, params))
        return row is not None


def token_of(row: Row) -> ApiToken:
    return ApiToken(
        token_id=row["token_id"],
        tenant=row["tenant"],
        digest=row["digest"],
        created_at=float(row["created_at"]),
        operator=bool(row["operator"]),
        label=row["label"],
        revoked_at=None if row["revoked_at"] is None else float(row["revoked_at"]),
    )
