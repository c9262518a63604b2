"""The PostgreSQL World's connections: the pool, the retrying :meth:`_run`, row helpers.

Every facet's operation is an ``op(conn, retried)`` run by :meth:`PostgresConnections._run`
on a pooled connection; a lost connection is replaced and ``op`` run again with
``retried`` true (see the package docstring, **Reconnection**).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolClosed

from durable_harness.core.errors import (
    DurableHarnessError,
    LeaseLost,
    NotFound,
    WorldError,
)
from durable_harness.worlds.postgres import schema, sql
from durable_harness.worlds.postgres.sql import Row

if TYPE_CHECKING:
    from durable_harness.worlds.postgres.holder import Holder
    from durable_harness.worlds.postgres.listener import Listener

log = logging.getLogger("durable_harness.worlds.postgres")

#: How long an operation keeps trying to get a working connection back before it fails.
RECONNECT_SECONDS = 30.0

_T = TypeVar("_T")


class PostgresConnections:
    """What every facet of :class:`~durable_harness.worlds.postgres.PostgresWorld` runs on."""

    where: schema.Where
    _pool: ConnectionPool[psycopg.Connection[Any]]
    _work_listener: Listener  # wait_for_work
    _event_listener: Listener  # wait_for_events
    _holder: Holder  # the advisory lock this process's claims are tied to

    def _run(self, what: str, op: Callable[[psycopg.Connection[Any], bool], _T]) -> _T:
        """Run ``op(conn, retried)`` on a pooled connection, retrying on a lost connection.

        ``retried`` is True when an earlier try failed with the connection: that try may
        have committed, and ``op`` must then accept its own committed write as success.
        """
        deadline = time.monotonic() + RECONNECT_SECONDS
        retried, pause = False, 0.05
        while True:
            try:
                with self._pool.connection() as conn:
                    return op(conn, retried)
            except PoolClosed as exc:
                raise WorldError(f"the PostgreSQL World at {self.where} is closed") from exc
            except psycopg.OperationalError as exc:
                # OperationalError covers a cut connection, the server shutting down or not
                # yet accepting connections, no connection free in time (PoolTimeout), and
                # serialization failures: all worth a retry.
                if time.monotonic() + pause > deadline:
                    raise WorldError(
                        f"PostgreSQL at {self.where} failed during {what} and did not come "
                        f"back within {RECONNECT_SECONDS:.0f}s: {one_line(exc)}; check that the "
                        "server is running and DURABLE_HARNESS_POSTGRES_URL"
                    ) from exc
                log.warning("PostgreSQL %s failed (%s); retrying", what, one_line(exc))
                if not retried:
                    with contextlib.suppress(psycopg.Error):
                        self._pool.check()  # a restart killed the idle connections too
                retried = True
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
            except DurableHarnessError:
                raise
            except psycopg.errors.InsufficientPrivilege as exc:
                user = self.where.user
                raise WorldError(
                    f"PostgreSQL World at {self.where}: {what}: {one_line(exc)}; GRANT SELECT, "
                    f"INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA durable_harness TO {user} "
                    "(durable-harness doctor lists what is missing)"
                ) from exc
            except psycopg.Error as exc:
                raise WorldError(f"PostgreSQL World at {self.where}: {what}: {exc}") from exc

    def close(self) -> None:
        self._holder.close()
        self._work_listener.close()
        self._event_listener.close()
        self._pool.close()

    def _fence_error(self, conn: psycopg.Connection[Any], turn_id: str, epoch: int) -> Exception:
        """Why a fenced write on ``turn_id`` matched no row: LeaseLost, or NotFound."""
        turn = one_row(conn, sql.GET_TURN, (turn_id,))
        if turn is None:
            return NotFound(f"no turn {turn_id!r}")
        return LeaseLost(
            f"turn {turn_id}: a write with lease epoch {epoch} was refused; the turn is "
            f"{turn['status']} at epoch {turn['epoch']} (another worker took it over)"
        )


# -- helpers ------------------------------------------------------------------------------
def one_row(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Row | None:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchone()


def all_rows(conn: psycopg.Connection[Any], query: str, params: Any = None) -> list[Row]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall()


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
