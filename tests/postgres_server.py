"""A throwaway PostgreSQL server for tests and benchmarks (no pytest in here).

:class:`PostgresServer` runs ``initdb`` into a temporary folder, starts the server on
``127.0.0.1`` and a free port (its socket in that folder, never a system service), and stops
it by ``pg_ctl`` (or its PID). As root (CI, these VMs) every server command runs as the
``postgres`` user through ``runuser``, since PostgreSQL refuses to run as root.

The superuser ``postgres`` has the password :data:`PASSWORD` and TCP connections must give
it (``scram-sha-256``), so a wrong password is a real authentication failure.

Used by ``tests/conftest.py`` (the session fixture), ``tests/worlds/conftest.py`` (a fresh
database per contract test) and ``bench/postgres_overhead.py`` (with ``fsync`` on).
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PASSWORD = "dh-test-secret"
USER = "postgres"
_names = itertools.count()


def find_bindir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` holding ``initdb``, or PATH's."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One PostgreSQL cluster in a temp folder; see the module docstring."""

    def __init__(self, *, fsync: bool = False, bindir: Path | None = None) -> None:
        found = bindir or find_bindir()
        if found is None:
            raise RuntimeError(
                "PostgreSQL binaries not found (no /usr/lib/postgresql/*/bin/initdb): "
                "run scripts/setup or `apt-get install -y postgresql`"
            )
        self.bindir = found
        self.fsync = fsync
        self.root = Path(tempfile.mkdtemp(prefix="dh-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 0
        self._as_postgres = os.geteuid() == 0
        self._watchdog: subprocess.Popen[bytes] | None = None
        #: False for a server another process started (:meth:`attached`): never stopped here.
        self.owned = True
        if self._as_postgres:
            shutil.chown(self.root, USER, USER)
            self.root.chmod(0o700)

    @classmethod
    def attached(cls, description: dict[str, Any]) -> PostgresServer:
        """The running server of :func:`run_description`, started by another process."""
        server = cls.__new__(cls)
        server.bindir = Path(description["bindir"])
        server.fsync = False
        server.root = Path(description["root"])
        server.data = server.root / "data"
        server.log = server.root / "server.log"
        server.port = int(description["port"])
        server._as_postgres = os.geteuid() == 0
        server._watchdog = None
        server.owned = False
        return server

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> PostgresServer:
        pwfile = self.root / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        if self._as_postgres:
            shutil.chown(pwfile, USER, USER)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        )
        pwfile.unlink()
        for attempt in range(5):  # the free port may be taken between the probe and start
            self.port = free_port()
            options = [
                "-c listen_addresses=127.0.0.1",
                f"-p {self.port}",
                f"-k {self.root}",
                f"-c fsync={'on' if self.fsync else 'off'}",
                "-c max_connections=200",
            ]
            if not self.fsync:
                options.append("-c full_page_writes=off")
            try:
                self._run(
                    "pg_ctl",
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-w",
                    "-t",
                    "30",
                    "-o",
                    " ".join(options),
                    "start",
                )
                self._watch()
                return self
            except subprocess.CalledProcessError:
                if attempt == 4:
                    raise
        return self

    def _watch(self) -> None:
        """Start a watchdog that stops the server once this process is gone: a test run
        killed by a timeout or SIGKILL runs no atexit handler, and must not leave it."""
        command = [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]
        if self._as_postgres:
            command = ["runuser", "-u", USER, "--", *command]
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(self.root), *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a signal to our process group must not reach it
        )

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every client connection is cut, the data stays."""
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-m",
            "fast",
            "-w",
            "-t",
            "30",
            "restart",
        )

    def stop(self) -> None:
        """Stop the server (by ``pg_ctl``, else by the postmaster's PID) and remove its folder."""
        if self.data.exists():
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            except subprocess.CalledProcessError:
                pid = self.pid()
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)
        if self._watchdog is not None:
            with contextlib.suppress(ProcessLookupError):
                self._watchdog.kill()
            self._watchdog.wait()
            self._watchdog = None

    def pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data / "postmaster.pid").read_text().splitlines()[0])
        return None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- URLs and databases -----------------------------------------------------------
    def url(self, dbname: str = "postgres", password: str | None = PASSWORD) -> str:
        auth = USER if password is None else f"{USER}:{password}"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}"

    def admin(self, sql: str, params: Any = None, dbname: str = "postgres") -> list[Any]:
        """Run one statement as the superuser (autocommit); return its rows."""
        import psycopg

        with psycopg.connect(self.url(dbname), autocommit=True) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def create_database(self, prefix: str = "dh") -> str:
        name = f"{prefix}_{os.getpid()}_{next(_names)}"
        self.admin(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    @contextlib.contextmanager
    def database(self, prefix: str = "dh") -> Iterator[str]:
        """A new empty database for the block; yields its URL, drops it afterwards."""
        name = self.create_database(prefix)
        try:
            yield self.url(name)
        finally:
            self.drop_database(name)

    # -- helpers ------------------------------------------------------------------------
    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bindir / tool), *args]
        if self._as_postgres:
            command = ["runuser", "-u", USER, "--", *command]
        # Output goes to a file, never a pipe: a server started by pg_ctl would inherit the
        # pipe and keep it open, and reading it to the end would then wait forever.
        with tempfile.TemporaryFile("w+") as out:
            code = subprocess.run(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, timeout=120, check=False
            ).returncode
            if code != 0:
                out.seek(0)
                log = self.log.read_text()[-2000:] if self.log.exists() else ""
                raise subprocess.CalledProcessError(code, command, out.read() + log)


# argv: the PID to outlive, the server's folder, the stop command.
_WATCHDOG = """
import os, shutil, subprocess, sys, time
parent, root, stop = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
while True:
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        break
    time.sleep(1.0)
subprocess.run(stop, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
shutil.rmtree(root, ignore_errors=True)
"""

_shared: PostgresServer | None = None
#: Set by the run's controller (tests/run_services.py) for its pytest-xdist workers.
RUN_ENV = "DH_TEST_POSTGRES"


def shared_server() -> PostgresServer:
    """The test run's one server (fsync off): the run's, when its controller started one
    (:data:`RUN_ENV`), else started on first use and stopped at exit."""
    global _shared
    if _shared is None:
        attached = os.environ.get(RUN_ENV)
        if attached:
            _shared = PostgresServer.attached(json.loads(attached))
            return _shared
        import atexit

        server = PostgresServer(fsync=False).start()
        atexit.register(server.stop)
        _shared = server
    return _shared


def run_description(server: PostgresServer) -> str:
    """What :meth:`PostgresServer.attached` needs, for :data:`RUN_ENV`."""
    return json.dumps({"port": server.port, "root": str(server.root), "bindir": str(server.bindir)})


def wait_until(predicate: Any, timeout: float = 30.0, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")


def stop_shared() -> None:
    """Stop the shared server if this process started one (the test session's end)."""
    global _shared
    if _shared is not None:
        if _shared.owned:
            _shared.stop()
        _shared = None


@contextlib.contextmanager
def fresh_world() -> Iterator[dict[str, Any]]:
    """``open_world("postgres", **options)`` options of an empty World: a new database on
    the shared server, dropped afterwards."""
    with shared_server().database() as url:
        yield {"url": url}
