"""The setup phase (``run --setup "pip install -e .[dev]"``): the turn's setup command runs
in the session's container after its workspace is restored and before the agent starts,
once per container.

The container has no network (``network_mode="none"``) and keeps none: for the setup
command alone, :class:`~.egress.EgressProxy` is started on the host and reached through
``dh-bridge.js`` on the container's loopback, with ``HTTP(S)_PROXY`` in the command's
environment, so pip, npm, uv and cargo reach the registries the operator allows
(``DURABLE_HARNESS_SETUP_REGISTRIES``; empty: the setup runs with no network either). When
the command ends, the bridge is stopped, whatever the command left running is killed (the
job is contained) and the proxy is stopped: the agent that follows has no way out, as
without a setup.

*Once per container*: done is a mark in the session's host run folder (which the
container sees read-only, so nothing inside can forge or erase it) naming the container
and a digest of the command, image and registries. A new container (the old one removed,
another machine) runs the setup again, on the workspace as the World restored it: what a
setup installs lives in the container (pip's user site on the home volume), not in the
World. A worker that dies during the setup leaves the job running without its proxy; the
next worker kills it and starts the setup again (a setup command must be safe to re-run,
as a devcontainer's ``postCreateCommand`` is).

A setup that fails or times out fails the turn (:class:`TurnFailed`: a retry would fail
the same way), with its last output and the upstreams the proxy refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable

from durable_harness.adapters.cli.docker_host import bridge_files, bridge_job, random_port
from durable_harness.adapters.cli.egress import EgressProxy
from durable_harness.core.errors import TurnFailed
from durable_harness.core.sandbox import Sandbox
from durable_harness.core.settings import Settings
from durable_harness.core.turn_config import TurnConfig
from durable_harness.sandbox.docker import DockerSandbox

__all__ = ["SETUP_SOCKET", "ensure_setup", "setup_done"]

SETUP_SOCKET = "egress.sock"
_MARK = "setup.mark"
_HOMES = "/home/agent/.durable-harness/setup"
_SCRIPT = "setup.sh"
_TAIL = 3000

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
    prefix = f"setup-{key}-{cid[:12]}-"
    earlier = sorted(j for j in sandbox.jobs.list() if j.startswith(prefix))
    for job in earlier:  # a dead worker's, running without its proxy
        if not sandbox.jobs.status(job).finished:
            sandbox.jobs.kill(job, "KILL")
    job = f"{prefix}{len(earlier) + 1}"
    home = f"{_HOMES}/{job}"
    network = ", ".join(registries) if registries else "none"
    say(f"running `{command}` in the session's container (network: {network})")
    proxy = EgressProxy(os.path.join(sandbox.run_dir, SETUP_SOCKET), registries,
                        settings.setup_max_bytes) if registries else None  # fmt: skip
    try:
        env: dict[str, str] = {}
        if proxy is not None:
            proxy.start()
            port = random_port()
            url = proxy.proxy_url(port)
            for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
                env[name] = url
            env["NO_PROXY"] = env["no_proxy"] = ""
            for rel, data in bridge_files(b"").items():
                sandbox.write_bytes(f"{home}/{rel}", data)
            script = bridge_job(home, SETUP_SOCKET, port, ["bash", f"{home}/{_SCRIPT}"])
        else:
            script = f'bash "{home}/{_SCRIPT}" </dev/null'
        # stderr joins stdout, so the progress shown is the command's whole output; -e:
        # a step that fails fails the setup, rather than the agent starting without it.
        sandbox.write_bytes(f"{home}/{_SCRIPT}", f"exec 2>&1\nset -e\n{command}\n".encode())
        sandbox.jobs.start(job, script, timeout=settings.setup_timeout_s, env=env, contain=True)
        tail = _follow(sandbox, job, say)
        status = sandbox.jobs.wait(job)
        if status.exit_code != 0:
            raise TurnFailed(_failure(command, status.exit_code, tail, proxy, settings))
    finally:
        if proxy is not None:
            proxy.close()
            proxy.remove_files()
        with contextlib.suppress(Exception):
            sandbox.exec('rm -rf -- "$1"', home)
    _write_mark(sandbox.run_dir, f"{cid} {key}")
    say("done")


def _follow(sandbox: DockerSandbox, job: str, say: Say) -> str:
    """Show the job's output line by line as it comes; its last bytes."""
    jobs = sandbox.jobs
    pending = b""
    tail = b""
    for chunk in jobs.follow(job):
        tail = (tail + chunk)[-_TAIL:]
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for line in lines:
            say("| " + line.decode(errors="replace").rstrip())
    if pending:
        say("| " + pending.decode(errors="replace").rstrip())
    return tail.decode(errors="replace")


def _failure(
    command: str, code: int | None, tail: str, proxy: EgressProxy | None, settings: Settings
) -> str:
    if code == 124:
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
            + ", ".join(settings.setup_registries) + " are allowed: "
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
