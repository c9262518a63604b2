"""The egress proxy of a setup phase (``run --setup``, :mod:`.setup`): the one way out of a
session's container, for as long as its setup command runs, to the package registries the
operator allows.

It is proxy.py (a maintained HTTP/HTTPS forward proxy) in a child process of its own,
listening on a unix socket in the session's run folder, which the container has mounted
read-only at ``/run/durable-harness``; ``dh-bridge.js`` serves that socket on the
container's loopback and the setup command gets ``HTTP(S)_PROXY`` pointing there. What
holds, whoever runs in the container:

* **authenticated**: a random token per setup (``Proxy-Authorization: Basic``), only in
  the setup job's environment; 407 without it. The proxy ends when the setup does, so the
  token is worth nothing to whatever the setup leaves behind;
* **allowed upstreams only** (:mod:`.egress_plugin`): an exact ``host:port`` the operator
  listed, else 403 (the refusals are kept for the error message);
* **capped**: every byte from the upstreams counts against ``setup_max_bytes`` (the proxy
  ends past it); idle connections are closed after proxy.py's ``--timeout``; the process
  runs with an address-space limit, so a flood of connections or headers exhausts the
  proxy, never the worker; it dies with the worker (``PR_SET_PDEATHSIG``, its acceptor
  processes with it) and is killed as a process group when the setup ends;
* **no secret of the worker**: its environment is built here (PATH, a throwaway HOME, the
  policy), not inherited.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from durable_harness.core.errors import SandboxUnavailable

__all__ = ["CAPPED", "EgressProxy"]

#: What the proxy logs (``dh-egress cap …``) when the download cap ends it (:mod:`.egress_plugin`).
CAPPED = "cap"

_PLUGIN = "durable_harness.adapters.cli.egress_plugin.RegistriesOnly"
_USER = "dh"
_ADDRESS_SPACE = 2 << 30  # the proxy's threads (one per connection) and buffers
_IDLE_TIMEOUT_S = 30
_START_TIMEOUT_S = 30.0
_PR_SET_PDEATHSIG = 1


def _child_limits() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    resource.setrlimit(resource.RLIMIT_AS, (_ADDRESS_SPACE, _ADDRESS_SPACE))


class EgressProxy:
    """The proxy on ``socket_path`` (see the module docstring); a context manager."""

    def __init__(self, socket_path: str, registries: Sequence[str], max_bytes: int) -> None:
        self.socket_path = socket_path
        self.registries = [r.strip().lower() for r in registries if r.strip()]
        self.max_bytes = max_bytes
        self.token = secrets.token_urlsafe(24)
        self._dir = tempfile.mkdtemp(prefix="dh-egress-")
        self._log_path = os.path.join(self._dir, "proxy.log")
        self._process: subprocess.Popen[bytes] | None = None

    def proxy_url(self, port: int) -> str:
        """The URL a client in the container uses (the bridge's port on its loopback)."""
        return f"http://{_USER}:{self.token}@127.0.0.1:{port}"

    def start(self) -> EgressProxy:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)  # a dead worker's
        # The folder durable_harness is imported from: the plugin must import from there.
        package_root = os.path.abspath(os.path.join(os.path.dirname(__file__), *[".."] * 3))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": self._dir,  # proxy.py makes its data folder under HOME
            "PYTHONPATH": package_root,
            "DH_EGRESS_ALLOWED": ",".join(self.registries),
            "DH_EGRESS_MAX_BYTES": str(self.max_bytes),
        }
        argv = [sys.executable, "-m", "proxy", "--unix-socket-path", self.socket_path]
        argv += ["--basic-auth", f"{_USER}:{self.token}", "--plugins", _PLUGIN]
        argv += ["--threaded", "--num-acceptors", "1", "--backlog", "64"]
        argv += ["--timeout", str(_IDLE_TIMEOUT_S), "--log-level", "WARNING"]
        with open(self._log_path, "wb") as log:
            self._process = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
                start_new_session=True,
                preexec_fn=_child_limits,
            )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not os.path.exists(self.socket_path):
            if self._process.poll() is not None or time.monotonic() > deadline:
                log_text = self.log()[-800:]
                self.close()
                raise SandboxUnavailable(f"the setup's egress proxy did not start: {log_text}")
            time.sleep(0.05)
        os.chmod(self.socket_path, 0o666)  # the container's user (uid 1000) connects
        return self

    def log(self) -> str:
        try:
            with open(self._log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def refused(self) -> list[str]:
        """The ``host:port`` targets refused so far, in order, each once."""
        return self._targets("refused")

    def allowed(self) -> list[str]:
        """The ``host:port`` targets connected to so far, each once."""
        return self._targets("allowed")

    def _targets(self, verdict: str) -> list[str]:
        prefix = f"dh-egress {verdict} "
        seen = {line.removeprefix(prefix).strip(): None for line in self.log().splitlines()
                if line.startswith(prefix)}  # fmt: skip
        return list(seen)

    def capped(self) -> bool:
        """True when the download cap ended the proxy."""
        return any(line.startswith(f"dh-egress {CAPPED} ") for line in self.log().splitlines())

    def close(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def remove_files(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> EgressProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            self.remove_files()
