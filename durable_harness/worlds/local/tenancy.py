"""The local World's tenancy: API tokens, owners of sessions and turns, rate counters."""

from __future__ import annotations

import math
import sqlite3
import time

from durable_harness.core.errors import NotFound, StepConflict
from durable_harness.core.types import ApiToken
from durable_harness.core.world import Tenancy
from durable_harness.worlds.local.db import Database


class LocalTenancy(Tenancy):
    """The :class:`Tenancy` facet of :class:`~durable_harness.worlds.local.LocalWorld`."""

    _db: Database

    def put_token(self, token: ApiToken) -> None:
        with self._db.transaction(write=True) as conn:
            try:
                conn.execute(
                    "INSERT INTO api_tokens (token_id, tenant, digest, created_at, operator,"
                    " label, revoked_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        token.token_id,
                        token.tenant,
                        token.digest,
                        token.created_at,
                        int(token.operator),
                        token.label,
                        token.revoked_at,
                    ),
                )
            except sqlite3.IntegrityError as exc:
                raise StepConflict(f"token {token.token_id} exists") from exc

    def get_token(self, token_id: str) -> ApiToken:
        with self._db.transaction(write=False) as conn:
            return _token(conn, token_id)

    def list_tokens(self) -> list[ApiToken]:
        with self._db.transaction(write=False) as conn:
            rows = conn.execute("SELECT * FROM api_tokens ORDER BY created_at, token_id").fetchall()
        return [_token_of(row) for row in rows]

    def revoke_token(self, token_id: str, at: float) -> ApiToken:
        with self._db.transaction(write=True) as conn:
            _token(conn, token_id)
            conn.execute(
                "UPDATE api_tokens SET revoked_at = COALESCE(revoked_at, ?) WHERE token_id = ?",
                (at, token_id),
            )
            return _token(conn, token_id)

    def put_owner(self, kind: str, item_id: str, tenant: str, created_at: float) -> None:
        with self._db.transaction(write=True) as conn:
            row = conn.execute(
                "SELECT tenant FROM owners WHERE kind = ? AND item_id = ?", (kind, item_id)
            ).fetchone()
            if row is not None:
                if row["tenant"] != tenant:
                    raise StepConflict(f"{kind} {item_id} belongs to another tenant")
                return
            conn.execute(
                "INSERT INTO owners (kind, item_id, tenant, created_at) VALUES (?, ?, ?, ?)",
                (kind, item_id, tenant, created_at),
            )

    def get_owner(self, kind: str, item_id: str) -> str | None:
        with self._db.transaction(write=False) as conn:
            row = conn.execute(
                "SELECT tenant FROM owners WHERE kind = ? AND item_id = ?", (kind, item_id)
            ).fetchone()
        return None if row is None else str(row["tenant"])

    def list_owned(
        self,
        tenant: str,
        kind: str,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[tuple[float, str]]:
        # No cursor: start above every item (an infinite time sorts after all of them).
        at, item = before if before is not None else (math.inf, "")
        with self._db.transaction(write=False) as conn:
            rows = conn.execute(
                "SELECT created_at, item_id FROM owners WHERE tenant = ? AND kind = ?"
                " AND (created_at < ? OR (created_at = ? AND item_id < ?))"
                " ORDER BY created_at DESC, item_id DESC LIMIT ?",
                (tenant, kind, at, at, item, limit),
            ).fetchall()
        return [(float(row["created_at"]), str(row["item_id"])) for row in rows]

    def take_rate(self, bucket: str, limit: int, window_s: float) -> bool:
        with self._db.transaction(write=True) as conn:
            window = int(time.time() // window_s)
            conn.execute(
                "INSERT INTO rate_counters (bucket, window, used) VALUES (?, ?, 0)"
                " ON CONFLICT (bucket, window) DO NOTHING",
                (bucket, window),
            )
            taken = conn.execute(
                "UPDATE rate_counters SET used = used + 1"
                " WHERE bucket = ? AND window = ? AND used < ?",
                (bucket, window, limit),
            ).rowcount
            # Old windows are never read again.
            conn.execute(
                "DELETE FROM rate_counters WHERE bucket = ? AND window < ?", (bucket, window)
            )
        return bool(taken)


def _token(conn: sqlite3.Connection, token_id: str) -> ApiToken:
    row = conn.execute("SELECT * FROM api_tokens WHERE token_id = ?", (token_id,)).fetchone()
    if row is None:
        raise NotFound(f"no API token {token_id!r}")
    return _token_of(row)


def _token_of(row: sqlite3.Row) -> ApiToken:
    return ApiToken(
        token_id=row["token_id"],
        tenant=row["tenant"],
        digest=row["digest"],
        created_at=float(row["created_at"]),
        operator=bool(row["operator"]),
        label=row["label"],
        revoked_at=None if row["revoked_at"] is None else float(row["revoked_at"]),
    )
