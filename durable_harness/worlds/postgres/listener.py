"""``LISTEN`` on a connection of its own, shared by the World's threads.

A World has one :class:`Listener` per channel: :data:`~.schema.CHANNEL` for
``wait_for_work`` (a worker's idle loop), :data:`~.schema.EVENTS_CHANNEL` for
``wait_for_events`` (``serve``'s streams). One thread at a time waits on the connection;
the others wait on a condition, and a notification the connection hears wakes them all
(``serve`` follows many turns from many threads: a notification taken in by one of them
must not leave the rest asleep until their timeouts, nor be lost to a thread that was
between its read and its wait when it came).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from durable_harness.core.errors import DurableHarnessError, WorldError
from durable_harness.worlds.postgres import schema
from durable_harness.worlds.postgres.connections import log, one_line

#: ``due(conn)``: seconds until something is due that no notification announces (a lease
#: running out), asked on the listening connection before each wait; None when nothing is.
Due = Callable[[psycopg.Connection[Any]], float | None]


class Listener:
    """One channel's ``LISTEN``, connected on first use and again after a failure."""

    def __init__(self, url: str, where: schema.Where, channel: str) -> None:
        self._url = url
        self._where = where
        self._channel = channel
        self._conn: psycopg.Connection[Any] | None = None
        self._cond = threading.Condition()
        self._busy = False  # a thread is waiting on the connection
        self._wakes = 0  # how often the connection told its waiters to look again
        self._seen = threading.local()  # .wakes: the count this thread's last wait saw
        self._closed = False

    def wait(self, timeout: float, due: Due | None = None) -> None:
        """Return when a ``NOTIFY`` on the channel arrives, when ``due`` says so, or after
        ``timeout`` seconds.

        The first call only starts listening and returns at once, so that the caller
        looks again: a notification sent before ``LISTEN`` would be lost. So does the
        first call after the connection failed (it is connected again), and a thread's
        call after a notification some other thread took in since this thread's last
        call returned: it may be news of what this thread read too early to see.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            wakes = getattr(self._seen, "wakes", None)
            try:
                # A thread's first call either connects (nobody listens yet) or, like a
                # call after news, returns at once: it cannot know what it missed.
                connecting = wakes is None and self._conn is None and not self._busy
                if wakes != self._wakes and not connecting:
                    return
                wakes = self._wakes
                while self._busy:
                    remaining = deadline - time.monotonic()
                    if self._wakes != wakes or remaining <= 0:
                        return
                    self._cond.wait(remaining)
                if self._wakes != wakes:
                    return
                if self._closed:
                    raise WorldError(f"the PostgreSQL World at {self._where} is closed")
                self._busy = True
            finally:
                self._seen.wakes = self._wakes
        woke = True
        try:
            woke = self._listen(max(0.0, deadline - time.monotonic()), due)
        finally:
            with self._cond:
                self._busy = False
                if woke:
                    self._wakes += 1
                self._seen.wakes = self._wakes
                self._cond.notify_all()  # woken, or the next waiter takes the connection

    def _listen(self, timeout: float, due: Due | None) -> bool:
        """Wait on the connection (the caller is the one thread on it); True when every
        waiter should look again."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = schema.connect(self._url, self._where)
                self._conn.execute(f"LISTEN {self._channel}")
                return True
            shortened = False
            if due is not None:
                until = due(self._conn)
                if until is not None and until < timeout:
                    timeout, shortened = until, True
            if any(True for _ in self._conn.notifies(timeout=timeout, stop_after=1)):
                for _ in self._conn.notifies(timeout=0.0):  # drain: one wake-up is enough
                    pass
                return True
            return shortened
        except (psycopg.Error, DurableHarnessError) as exc:
            log.warning("listening on %s failed (%s); polling", self._channel, one_line(exc))
            if self._conn is not None:
                self._conn.close()
            self._conn = None
        time.sleep(timeout)
        return False

    def close(self) -> None:
        """Close the connection, once no thread waits on it (at most its timeout)."""
        with self._cond:
            self._closed = True
            while self._busy:
                self._cond.wait()
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
