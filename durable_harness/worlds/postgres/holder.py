"""Claims tied to a connection: a dead worker's turns are taken over within a grace period.

Each :class:`~durable_harness.worlds.postgres.PostgresWorld` (one per worker process) holds
a session-level advisory lock on a random 63-bit key on a connection of its own, opened on
its first claim, and every claim it makes records that key in the job row (``holder_key``).
When the process dies, the kernel closes its socket, the server ends the session and the
lock goes with it. Any claim (``claim``, ``claim_turn``, and an idle worker's
``wait_for_work``, which looks every :data:`HOLDER_POLL_SECONDS` while a turn runs) first
runs :data:`~.sql.PULL_IN_DEAD`: a running job whose holder's lock can be taken
(``pg_try_advisory_xact_lock``, held only for that statement) has its holder cleared and
its lease cut to end :data:`GRACE_SECONDS` from now; the ordinary claim of an expired
lease then takes it, bumping the epoch as always. A live holder, even stopped by SIGSTOP,
keeps its session and its lock, so its lease stands.

**The grace period orders the two sides.** The session can also end while the process
lives (``pg_terminate_backend``, a server restart, a connection cut): then the lock is
free while the worker's agent still runs. The worker's own watcher (:class:`Holder`) wakes
at once on the closed socket (the server sends its FATAL message before exiting) and tells
every lease keeper of this World to stop its turn (``Queue.on_holder_lost``), which takes
milliseconds; the takeover waits :data:`GRACE_SECONDS` after the lock was seen free. A
connection that dies silently (no FIN: a cut cable) is found by the watcher's ping every
:data:`PING_SECONDS` with ``tcp_user_timeout`` and keepalives of a few seconds, while the
server finds it only through its own TCP keepalives (``tcp_keepalives_idle``, by default
the operating system's two hours): keep those longer than ten seconds. Meanwhile the lease
runs as before, and the lease keeper fences its turn before that runs out.

A lost holder connection is opened again, with a new key, at the next claim; leases
claimed under the old key stay fenced.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import select
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from durable_harness.core.errors import WorldError
from durable_harness.worlds.postgres import schema
from durable_harness.worlds.postgres.connections import one_line

log = logging.getLogger("durable_harness.worlds.postgres")

#: How long after a holder's lock was seen free its turn may be claimed: the holder's
#: watcher stops its agents well within it.
GRACE_SECONDS = 0.5
#: How often an idle worker looks for dead holders while some turn runs.
HOLDER_POLL_SECONDS = 0.25
#: How often the watcher pings its connection (a closed socket wakes it at once).
PING_SECONDS = 1.0
#: libpq's TCP settings on the holder connection: a silent drop is an error within ~3 s.
_TCP = {
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 2,
    "tcp_user_timeout": 3000,
}

Lost = Callable[[str], None]


class Holder:
    """This process's claim identity: the advisory lock, its watcher, who to tell."""

    def __init__(self, url: str, where: schema.Where) -> None:
        self._url, self._where = url, where
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._key: int | None = None
        self._ids = itertools.count()
        self._callbacks: dict[int, tuple[int, Lost]] = {}  # id -> (key claimed with, callback)
        self._closed = False

    def key(self) -> int:
        """The key a claim records now: the lock is held (taken here on first use)."""
        with self._lock:
            if self._closed:
                raise WorldError(f"the PostgreSQL World at {self._where} is closed")
            if self._key is None:
                self._conn, self._key = self._connect()
                threading.Thread(
                    target=self._watch, args=(self._conn, self._key), name="pg-holder", daemon=True
                ).start()
            return self._key

    def current(self) -> int | None:
        """The key held now, if any (opens nothing)."""
        return self._key

    def on_lost(self, key: int, callback: Lost) -> Callable[[], None]:
        """Call ``callback`` if the lock on ``key`` is (or already was) lost."""
        with self._lock:
            lost = key != self._key
            handle = next(self._ids)
            if not lost:
                self._callbacks[handle] = (key, callback)
        if lost:
            callback("the connection its claim was tied to was already gone")

        def remove() -> None:
            with self._lock:
                self._callbacks.pop(handle, None)

        return remove

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conn, self._conn, self._key = self._conn, None, None
            self._callbacks.clear()
        if conn is not None:
            conn.close()  # the watcher sees it closed and ends without calling anyone

    def _connect(self) -> tuple[psycopg.Connection[Any], int]:
        key = secrets.randbits(63)
        kwargs = {**_TCP, **schema.connection_kwargs(self._url)}
        try:
            conn = psycopg.connect(self._url, **kwargs)
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        except psycopg.Error as exc:
            raise WorldError(
                f"cannot open the claim connection to PostgreSQL at {self._where}: {one_line(exc)}"
            ) from exc
        return conn, key

    def _watch(self, conn: psycopg.Connection[Any], key: int) -> None:
        """Wait on the connection until it fails; then stop every turn claimed with it."""
        why = "its connection closed"
        while True:
            try:
                select.select([conn.fileno()], [], [], PING_SECONDS)
                conn.execute("SELECT 1")  # raises once the server ended the session
                continue
            except (psycopg.Error, OSError, ValueError) as exc:
                why = one_line(exc)
            break
        with self._lock:
            if self._key != key:  # closed by close(): nobody to tell
                return
            self._conn, self._key = None, None
            told = [cb for k, cb in self._callbacks.values() if k == key]
            self._callbacks = {h: v for h, v in self._callbacks.items() if v[0] != key}
        log.warning(
            "PostgreSQL claim connection lost (%s): stopping the %d turn(s) claimed with it",
            why,
            len(told),
        )
        for callback in told:
            try:
                callback(f"the PostgreSQL connection its claim was tied to dropped ({why})")
            except Exception:
                log.exception("stopping a turn after its claim connection dropped failed")
        conn.close()
