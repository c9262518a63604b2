"""The setup phase (``run --setup "pip install -e .[dev]"``): the turn's setup command runs
in the session's container after its workspace is restored and before the agent starts,
once per container.

The container has no network (``network_mode="none"``) and keeps none: for the setup
command alone, :class:`~.egress.EgressProxy` (a CONNECT-only tunnel, a thread of the
worker) listens on a socket in the run folder, ``dh-bridge.js`` serves it on the
container's loopback, and the command gets ``HTTP(S)_PROXY`` pointing there, so pip, npm,
uv and cargo reach the registries the operator allows (``DURABLE_HARNESS_SETUP_REGISTRIES``;
empty: the setup runs with no network either). In order:

1. every process in the container but its init and main command is killed, so nothing
   the agent left running can sit beside the setup's network (and read its token);
2. the tunnel starts; the command runs through a ``docker exec`` under ``bash -e``, its
   output shown as it comes (escaped, a line at most :data:`_LINE` bytes), with a
   deadline kept on the host (``DURABLE_HARNESS_SETUP_TIMEOUT_S``: nothing in the
   container can stop that clock), and its exit code as Docker reports it;
3. everything the command left running is killed, the tunnel stops and its socket goes.
   The agent that follows has no way out, as without a setup.

*Once per container*: done is a mark in the session's host run folder (which the
container sees read-only, so nothing inside can forge or erase it) naming the container
and a digest of the command, image and registries. A new container (the old one removed,
another machine) runs the setup again, on the workspace as the World restored it: what a
setup installs lives in the container (pip's user site on the home volume), not in the
World. A worker that dies during the setup takes the tunnel with it (a thread); the next
worker's step 1 kills the setup it left and starts it again, so a setup command must be
safe to re-run, as a devcontainer's ``postCreateCommand`` is.

A setup that fails or times out fails the turn (:class:`TurnFailed`: a retry would fail
the same way), with its last output and the upstreams the tunnel refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shlex
import sys
import time
from collections.abc import Callable

from durable_harness.adapters.cli.docker_host import bridge_files, bridge_job, random_port
from durable_harness.adapters.cli.egress import EgressProxy
from durable_harness.core.errors import TurnFailed
from durable_harness.core.sandbox import Sandbox
from durable_harness.core.settings import Settings
from durable_harness.core.turn_config import TurnConfig
from durable_harness.sandbox.docker import DockerSandbox

__all__ = ["ensure_setup", "setup_done"]

_MARK = "setup.mark"
_HOMES = "/home/agent/.durable-harness/setup"
_SCRIPT = "setup.sh"
_TAIL = 3000
_LINE = 2000
_TIMEOUT_EXIT_CODE = 124

Say = Callable[[str], None]


def _stderr_say(line: str) -> None:
    print(f"durable-harness: setup: {line}", file=sys.stderr, flush=True)


def _key(command: str, image: str, registries: tuple[str, ...]) -> str:
    text = json.dumps([command, image, sorted(registries)])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def setup_done(sandbox: DockerSandbox, command: str, settings: Settings) -> bool:
    """Whether the session's current container has run ``command`` to success."""
    cid = sandbox.container_id()
    want = f"{cid} {_key(command, sandbox.image, settings.setup_registries)}"
    try:
        with open(os.path.join(sandbox.run_dir, _MARK), encoding="utf-8") as f:
            return f.read().strip() == want
    except OSError:
        return False


def ensure_setup(
    sandbox: Sandbox, config: TurnConfig, settings: Settings, say: Say = _stderr_say
) -> None:
    """Run the turn's setup command in ``sandbox`` (the session's Docker container) unless
    this container has run it (see the module docstring)."""
    command = config.setup
    if command is None:
        return
    if not isinstance(sandbox, DockerSandbox):
        raise TurnFailed(f"--setup needs the Docker workspace, not {config.workspace!r}")
    if setup_done(sandbox, command, settings):
        return
    registries = settings.setup_registries
    key = _key(command, sandbox.image, registries)
    cid = sandbox.container_id()
    sandbox.kill_all()  # 1. an earlier worker's setup, daemons the agent left
    _remove_stale_sockets(sandbox.run_dir)
    home = f"{_HOMES}/{secrets.token_hex(8)}"
    # A socket name of its own per setup: a stale one is never taken for it.
    socket_name = f"egress-{secrets.token_hex(6)}.sock"
    proxy = (
        EgressProxy(
            os.path.join(sandbox.run_dir, socket_name), registries, settings.setup_max_bytes
        )
        if registries
        else None
    )
    say(f"running `{command}` in the session's container (network: {_network(registries)})")
    try:
        env: dict[str, str] = {}
        # stderr joins stdout, so what is shown is the command's whole output; -e: a step
        # that fails fails the setup, rather than the agent starting without it.
        sandbox.write_bytes(f"{home}/{_SCRIPT}", f"exec 2>&1\nset -e\n{command}\n".encode())
        argv = ["timeout", "-k", "5", f"{settings.setup_timeout_s:g}", "bash", f"{home}/{_SCRIPT}"]
        if proxy is not None:
            proxy.start()
            port = random_port()
            url = proxy.proxy_url(port)
            for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
                env[name] = url
            env["NO_PROXY"] = env["no_proxy"] = ""
            for rel, data in bridge_files(b"").items():
                sandbox.write_bytes(f"{home}/{rel}", data)
            script = bridge_job(home, socket_name, port, argv)
        else:
            script = f"{shlex.join(argv)} </dev/null"
        code, tail = _run(sandbox, script, env, settings.setup_timeout_s + 15, say)  # 2.
    finally:
        with contextlib.suppress(Exception):
            sandbox.kill_all()  # 3. whatever the setup left running
        if proxy is not None:
            proxy.close()
        with contextlib.suppress(Exception):
            sandbox.exec('rm -rf -- "$1"', home)
    if code != 0:
        raise TurnFailed(_failure(command, code, tail, proxy, settings))
    _write_mark(sandbox.run_dir, f"{cid} {key}")
    say("done")


def _remove_stale_sockets(run_dir: str) -> None:
    """A dead worker's tunnel sockets (nothing listens on them: it was a thread of it)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(run_dir):
            if name.startswith("egress-") and name.endswith(".sock"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(run_dir, name))


def _network(registries: tuple[str, ...]) -> str:
    return ", ".join(registries) if registries else "none"


def _run(
    sandbox: DockerSandbox, script: str, env: dict[str, str], limit: float, say: Say
) -> tuple[int | None, str]:
    """Run ``script``, showing its output line by line; (exit code, its last bytes). The
    exit code is :data:`_TIMEOUT_EXIT_CODE` when the host's deadline passed first."""
    deadline = time.monotonic() + limit
    line = bytearray()
    tail = bytearray()
    chunks = sandbox.stream(script, environment=env)
    try:
        while True:
            try:
                chunk = next(chunks)
            except StopIteration as end:
                code: int | None = end.value
                break
            if time.monotonic() > deadline:
                code = _TIMEOUT_EXIT_CODE
                break
            tail += chunk
            del tail[:-_TAIL]
            for byte_line in chunk.splitlines(keepends=True):
                line += byte_line
                if line.endswith(b"\n") or len(line) >= _LINE:
                    say("| " + _shown(bytes(line[:_LINE])))
                    line.clear()
    finally:
        chunks.close()
    if line:
        say("| " + _shown(bytes(line)))
    return code, _shown(bytes(tail), keep_newlines=True)


def _shown(data: bytes, *, keep_newlines: bool = False) -> str:
    """Output of the sandbox as it may reach a terminal or a log: no control characters."""
    text = (
        data.decode(errors="replace").rstrip("\r\n")
        if not keep_newlines
        else data.decode(errors="replace")
    )
    return "".join(
        ch if ch.isprintable() or (keep_newlines and ch in "\n\t") else f"\\x{ord(ch):02x}"
        for ch in text
    )


def _failure(
    command: str, code: int | None, tail: str, proxy: EgressProxy | None, settings: Settings
) -> str:
    if code == _TIMEOUT_EXIT_CODE:
        limit = f"{settings.setup_timeout_s:g} s (DURABLE_HARNESS_SETUP_TIMEOUT_S)"
        what = f"did not finish within {limit}"
    else:
        what = f"failed with exit code {code}"
    parts = [f"the setup command `{command}` {what}"]
    if proxy is not None and proxy.capped():
        parts.append(
            f"it downloaded more than {settings.setup_max_bytes} bytes "
            "(DURABLE_HARNESS_SETUP_MAX_BYTES) and its network was cut"
        )
    if proxy is not None and proxy.refused():
        parts.append(
            "the egress proxy refused " + ", ".join(proxy.refused()) + " (only "
            + _network(settings.setup_registries) + " are allowed: "
            "DURABLE_HARNESS_SETUP_REGISTRIES)"
        )  # fmt: skip
    elif proxy is None:
        parts.append("it ran with no network (DURABLE_HARNESS_SETUP_REGISTRIES is empty)")
    return "; ".join(parts) + f"; its last output:\n{tail}"


def _write_mark(run_dir: str, text: str) -> None:
    path = os.path.join(run_dir, _MARK)
    part = f"{path}.{os.getpid()}"
    with open(part, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    os.replace(part, path)
