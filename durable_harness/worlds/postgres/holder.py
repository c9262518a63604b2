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
at once on the closed socket (the server sends its FATAL message before exiting) and
either takes the lock back (below) or tells the lease keepers of the key's turns to stop
them (``Queue.on_holder_lost``), which takes milliseconds; the takeover waits
:data:`GRACE_SECONDS` after the lock was seen free. A
connection that dies silently (no FIN: a cut cable) is found by the watcher's ping every
:data:`PING_SECONDS` with ``tcp_user_timeout`` and keepalives of a few seconds, while the
server finds it only through its own TCP keepalives (``tcp_keepalives_idle``, by default
the operating system's two hours): keep those longer than ten seconds. Meanwhile the lease
runs as before, and the lease keeper fences its turn before that runs out.

**A dropped connection is taken back when it can be.** A server restart or a terminated
session need not cost the turns: the watcher connects again at once and takes the *same*
key's lock back (``pg_try_advisory_lock``), then reads which jobs still name that key.
A turn whose job no longer does (another worker cut its lease while the lock was free, or
it ended) is fenced; the others go on in the same delivery. The lock can only have been
free from the moment the old session ended, and a takeover comes :data:`GRACE_SECONDS`
after it was seen free; so the watcher gives up (and fences every turn of the key) if it
has not taken the lock back within :data:`REGAIN_SECONDS` of noticing, unless the server
refuses connections outright (it is down or starting: nobody can cut a lease then either;
it keeps trying for ``RECONNECT_SECONDS``). A key that was given up is never used again: the
next claim opens a new connection with a new key.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import select
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from durable_harness.core.errors import WorldError
from durable_harness.worlds.postgres import schema
from durable_harness.worlds.postgres.connections import RECONNECT_SECONDS, one_line

log = logging.getLogger("durable_harness.worlds.postgres")

#: How long after a holder's lock was seen free its turn may be claimed: the holder's
#: watcher stops its agents well within it.
GRACE_SECONDS = 0.5
#: How often an idle worker looks for dead holders while some turn runs.
HOLDER_POLL_SECONDS = 0.25
#: How often the watcher pings its connection (a closed socket wakes it at once).
PING_SECONDS = 1.0
#: How long the watcher may take to get the lock back before it fences (< GRACE_SECONDS).
REGAIN_SECONDS = 0.2
#: What a server that is down or starting answers: no other client can use it either.
_SERVER_DOWN = (
    "connection refused",
    "no such file or directory",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting connections",
)
#: libpq's TCP settings on the holder connection: a silent drop is an error within ~3 s.
_TCP = {
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 2,
    "tcp_user_timeout": 3000,
}

Lost = Callable[[str], None]


class _Attempt:
    """One try to take a dropped lock back, shared with its deadline timer."""

    def __init__(self) -> None:
        self.done = False  # the watcher decided (taken back, or given up)
        self.down = False  # the server refused connections: nobody can use it either
        self.abandoned = False  # the deadline passed first: the key is given up


class Holder:
    """This process's claim identity: the advisory lock, its watcher, who to tell."""

    def __init__(self, url: str, where: schema.Where) -> None:
        self._url, self._where = url, where
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._key: int | None = None
        self._ids = itertools.count()
        #: id -> (key claimed with, (turn, epoch), callback)
        self._callbacks: dict[int, tuple[int, tuple[str, int], Lost]] = {}
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

    def on_lost(self, key: int, turn: tuple[str, int], callback: Lost) -> Callable[[], None]:
        """Call ``callback`` if the lease on ``turn`` (turn id, epoch), claimed with
        ``key``, may be taken over before it runs out (at once if that is known)."""
        with self._lock:
            lost = key != self._key
            handle = next(self._ids)
            if not lost:
                self._callbacks[handle] = (key, turn, callback)
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

    def _connect(self, key: int | None = None) -> tuple[psycopg.Connection[Any], int]:
        """A new holder connection locking ``key`` (a new random key if None)."""
        if key is None:
            key = secrets.randbits(63)
            lock = "SELECT pg_advisory_lock(%s)"  # a fresh random key: nobody holds it
        else:
            lock = "SELECT pg_try_advisory_lock(%s)"
        kwargs = {**_TCP, **schema.connection_kwargs(self._url)}
        conn = psycopg.connect(self._url, **kwargs)
        try:
            row = conn.execute(lock, (key,)).fetchone()
        except BaseException:
            conn.close()
            raise
        if row is None or row[0] is False:
            conn.close()
            raise WorldError(f"the claim lock {key} is held by another session")
        return conn, key

    def _watch(self, conn: psycopg.Connection[Any], key: int) -> None:
        """Wait on the connection until it fails; then take the lock back or fence."""
        while True:
            why = self._wait_for_failure(conn)
            conn.close()
            attempt = _Attempt()
            # The deadline runs on a timer: one connection attempt can block for seconds.
            timer = threading.Timer(REGAIN_SECONDS, self._deadline, (key, attempt, why))
            timer.daemon = True
            timer.start()
            regained = self._regain(key, attempt)
            timer.cancel()
            with self._lock:
                attempt.done = True
                if regained is not None and not attempt.abandoned and self._key == key:
                    conn, held = regained
                    self._conn = conn
                    told = [
                        cb for k, t, cb in self._callbacks.values() if k == key and t not in held
                    ]
                    lost = False
                else:
                    if regained is not None:
                        regained[0].close()
                    told, lost = self._abandon(key), True
            self._tell(told, why)
            if lost:
                return
            log.warning("PostgreSQL claim connection lost (%s) and taken back", why)

    def _deadline(self, key: int, attempt: _Attempt, why: str) -> None:
        with self._lock:
            if attempt.done or attempt.down:
                return
            attempt.abandoned = True
            told = self._abandon(key)
        self._tell(told, f"{why}; not connected again within {REGAIN_SECONDS}s")

    def _abandon(self, key: int) -> list[Lost]:
        """Give up ``key`` (the caller holds the lock): the callbacks of its turns."""
        if self._key != key:
            return []
        self._conn, self._key = None, None
        told = [cb for k, _, cb in self._callbacks.values() if k == key]
        self._callbacks = {h: v for h, v in self._callbacks.items() if v[0] != key}
        return told

    @staticmethod
    def _wait_for_failure(conn: psycopg.Connection[Any]) -> str:
        while True:
            try:
                select.select([conn.fileno()], [], [], PING_SECONDS)
                conn.execute("SELECT 1")  # raises once the server ended the session
            except (psycopg.Error, OSError, ValueError) as exc:
                return one_line(exc)

    def _regain(
        self, key: int, attempt: _Attempt
    ) -> tuple[psycopg.Connection[Any], set[tuple[str, int]]] | None:
        """The lock on ``key`` taken back on a new connection, and the (turn, epoch) of
        the running jobs that still name it; None if that failed or was given up."""
        started, pause = time.monotonic(), 0.02
        while not (self._closed or attempt.abandoned):
            try:
                conn, _ = self._connect(key)
            except psycopg.OperationalError as exc:
                attempt.down = any(m in str(exc).lower() for m in _SERVER_DOWN)
                limit = RECONNECT_SECONDS if attempt.down else REGAIN_SECONDS
                if time.monotonic() - started > limit:
                    return None
                time.sleep(pause)
                pause = min(pause * 2, 0.2)
                continue
            except (psycopg.Error, WorldError):
                return None
            try:
                rows = conn.execute(
                    "SELECT turn_id, epoch FROM durable_harness.jobs"
                    " WHERE holder_key = %s AND status = 'running'",
                    (key,),
                ).fetchall()
            except psycopg.Error:
                conn.close()
                return None
            return conn, {(str(r[0]), int(r[1])) for r in rows}
        return None

    @staticmethod
    def _tell(told: list[Lost], why: str) -> None:
        if told:
            log.warning(
                "PostgreSQL claim connection lost (%s): stopping the %d turn(s) it no longer holds",
                why,
                len(told),
            )
        for callback in told:
            try:
                callback(f"the PostgreSQL connection its claim was tied to dropped ({why})")
            except Exception:
                log.exception("stopping a turn after its claim connection dropped failed")
