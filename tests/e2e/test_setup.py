"""``run --setup``: the setup command runs in the session's container before the agent,
once per container, with only the operator's registries reachable through the harness's
egress proxy (adapters/cli/setup.py, egress.py); the agent then has no way out.

The registry is the test's own package index on loopback (fixtures/package_index.py);
the worker's host services (the fake model) are what a setup must not reach."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from fixtures.package_index import GREETING, PackageIndex
from support import FIXTURES, Harness, ids_of, make_harness

from durable_harness.harness.journal import decode_output
from durable_harness.sandbox.docker import DockerSandbox, host_run_dir
from durable_harness.sandbox.docker_image import LABEL_SESSION
from durable_harness.worlds import open_world

PROBE = """
import os, re, socket, ssl, urllib.error, urllib.request
proxy = os.environ["HTTPS_PROXY"]
port = proxy.rsplit(":", 1)[1]
open(os.path.expanduser("~/setup-port.txt"), "w").write(port)
def status(url, proxies):
    unverified = urllib.request.HTTPSHandler(context=ssl._create_unverified_context())
    opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies), unverified)
    try:
        return str(opener.open(url, timeout=10).status)
    except urllib.error.HTTPError as exc:
        return str(exc.code)
    except OSError as exc:
        found = re.search(r"\\b([1-5][0-9][0-9])\\b", str(exc))
        return found.group(1) if found else type(exc).__name__
index = "https://localhost:{index}/simple/"
out = [
    "plain=" + status("http://localhost:{index}/simple/", {{"http": proxy}}),
    "connect=" + status("https://127.0.0.1:{model}/", {{"https": proxy}}),
    "noauth=" + status(index, {{"https": "http://127.0.0.1:" + port}}),
    "allowed=" + status(index, {{"https": proxy}}),
]
try:
    socket.create_connection(("192.0.2.1", 80), timeout=3)
    out.append("direct=open")
except OSError:
    out.append("direct=unreachable")
open(os.path.expanduser("~/setup-probe.txt"), "w").write("\\n".join(out) + "\\n")
"""


@pytest.fixture
def index(tmp_path: Path) -> Iterator[PackageIndex]:
    served = PackageIndex(tmp_path / "index")
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture
def harness(docker_host: str, tmp_path: Path, index: PackageIndex) -> Iterator[Harness]:
    for h in make_harness(tmp_path, FIXTURES / "setup.toml"):
        h.env["DURABLE_HARNESS_SETUP_REGISTRIES"] = f"localhost:{index.port}"
        yield h


def _setup_command(h: Harness, index: PackageIndex) -> str:
    model_port = h.server.url.rsplit(":", 1)[1].strip("/")
    probe = PROBE.format(model=model_port, index=index.port)
    return (
        "echo run >> ~/setup-runs.txt\n"
        "echo SETUP-STARTED\n"
        "sleep 1\n"
        # --user: the root is read-only, the home volume is not (Debian's pip also wants
        # --break-system-packages for that).
        "setsid sleep 4242 >/dev/null 2>&1 < /dev/null &\n"  # left running: killed after it
        "pip install --user --break-system-packages --no-cache-dir --disable-pip-version-check "
        f"--trusted-host localhost --index-url https://localhost:{index.port}/simple/ "
        "dh-greeting\n"
        f"python3 - <<'PY'\n{probe}\nPY\n"
    )


def _egress_listening(session_id: str) -> list[str]:
    """The egress sockets of this session's run folder that something still listens on."""
    run_dir = host_run_dir(session_id)
    live = []
    for name in os.listdir(run_dir):
        if name.startswith("egress-"):
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(os.path.join(run_dir, name))
                    live.append(name)
                except OSError:
                    pass
    return live


def _last_bash(h: Harness, turn_id: str) -> str:
    with open_world("local", data_dir=h.tmp / "world") as world:
        steps = [s for s in world.load_steps(turn_id) if s.kind == "tool"]
        return str(decode_output(world, steps[-1])["content"])


@pytest.mark.timeout(600)
def test_setup_installs_from_an_allowed_registry_only_and_survives_a_killed_worker(
    harness: Harness, index: PackageIndex, python_image: str
) -> None:
    h = harness
    command = _setup_command(h, index)
    # The workers below are other processes: their operator allows this image and setup.
    h.env["DURABLE_HARNESS_ALLOWED_IMAGES"] = python_image
    h.env["DURABLE_HARNESS_ALLOWED_SETUP_COMMANDS"] = json.dumps([command])
    run = ["run", "--workspace", "docker", "--image", python_image, "--setup", command]
    # 1. The worker is SIGKILLed while the setup runs: its proxy dies with it.
    first = h.popen(*run, "--no-repo", "check the setup")
    assert first.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = first.stderr.readline()
        assert line, "".join(seen)
        seen.append(line)
        if line.strip().endswith("| SETUP-STARTED"):
            break
    os.killpg(first.pid, signal.SIGKILL)
    out, _ = first.communicate()
    assert "setup: running `echo run" in "".join(seen), seen
    ids = dict(line.split(" ", 1) for line in out.splitlines()[:2] if " " in line)
    session, turn = ids["session"], ids["turn"]
    # The tunnel was a thread of the dead worker: its socket is left, nothing listens.
    assert _egress_listening(session) == []
    assert [n for n in os.listdir(host_run_dir(session)) if n.startswith("egress-")]
    # 2. Another worker finishes the turn: the dead worker's setup job is killed, the setup
    # runs again (it must be safe to re-run) through a new proxy, then the agent.
    resumed = h.cli("worker", "--until-idle", timeout=400)
    assert resumed.returncode == 0, resumed.stderr
    assert "setup: done" in resumed.stderr, resumed.stderr
    assert "Successfully installed dh-greeting-1.0" in resumed.stderr, resumed.stderr
    shown = h.show(turn)["turn"]
    assert shown["status"] == "done", shown
    assert shown["result"] == "The package is installed and the sandbox has no way out."
    seen_by_agent = _last_bash(h, turn)
    assert GREETING in seen_by_agent, seen_by_agent
    # The setup reached the allowed registry only; without the token: 407.
    for line in ("plain=405", "connect=403", "noauth=407", "allowed=200",
                 "direct=unreachable", "runs=2", "daemons=0"):  # fmt: skip
        assert f"{line}\n" in seen_by_agent, seen_by_agent
    # The agent has no proxy in its environment, no proxy socket, no bridge, no network.
    assert "proxy_env=[]\n" in seen_by_agent, seen_by_agent
    assert "egress-" not in seen_by_agent.split("run_dir=")[1].split("\n")[0]
    assert "=open" not in seen_by_agent, seen_by_agent
    assert _egress_listening(session) == [] and not [
        n for n in os.listdir(host_run_dir(session)) if n.startswith("egress-")
    ]
    assert any("GET /simple/dh-greeting/" in r for r in index.requests()), index.requests()
    # 3. The session's next turn keeps its container: no setup.
    again = h.cli("run", "--session", session, *run[1:], "check the setup", timeout=300)
    assert again.returncode == 0, again.stderr
    assert "setup: running" not in again.stderr, again.stderr
    assert "runs=2\n" in _last_bash(h, ids_of(again)["turn"])
    # 4. A new container (the old one removed) runs it again, on the restored workspace.
    client = docker.DockerClient(base_url=h.env["DOCKER_HOST"])
    try:
        for container in client.containers.list(filters={"label": f"{LABEL_SESSION}={session}"}):
            container.remove(force=True)
    finally:
        client.close()
    third = h.cli("run", "--session", session, *run[1:], "check the setup", timeout=300)
    assert third.returncode == 0, third.stderr
    assert "setup: done" in third.stderr, third.stderr
    after = _last_bash(h, ids_of(third)["turn"])
    assert GREETING in after and "runs=3\n" in after, after
    with DockerSandbox(session) as box:
        box.remove()


@pytest.mark.timeout(400)
def test_a_failing_setup_fails_the_turn_saying_why(
    harness: Harness, index: PackageIndex, python_image: str
) -> None:
    h = harness
    base = ["run", "--no-repo", "--workspace", "docker", "--image", python_image]
    # A refused upstream, then a download past the cap: the proxy ends, the setup fails.
    fetch = (
        "import ssl, urllib.request as u; "
        "print(len(u.urlopen('{}', timeout=20, context=ssl._create_unverified_context()).read()))"
    )
    command = (
        f'python3 -c "{fetch.format(f"https://127.0.0.1:{index.port}/")}" || true\n'
        f'python3 -c "{fetch.format(f"https://localhost:{index.port}/big.bin")}"\n'
    )
    capped = h.cli(*base, "--setup", command, "check the setup", timeout=300,
                   DURABLE_HARNESS_SETUP_MAX_BYTES="20000")  # fmt: skip
    assert capped.returncode != 0
    error = h.show(ids_of(capped)["turn"])["turn"]["error"]
    assert "the setup command `python3 -c" in error and "failed with exit code 1" in error
    assert f"the egress proxy refused 127.0.0.1:{index.port}" in error, error
    assert "downloaded more than 20000 bytes (DURABLE_HARNESS_SETUP_MAX_BYTES)" in error, error
    assert not h.requests(), "the agent never started"
    # A setup that does not end in time.
    slow = h.cli(*base, "--setup", "sleep 60", "check the setup", timeout=300,
                 DURABLE_HARNESS_SETUP_TIMEOUT_S="2")  # fmt: skip
    assert slow.returncode != 0
    error = h.show(ids_of(slow)["turn"])["turn"]["error"]
    assert "`sleep 60` did not finish within 2 s (DURABLE_HARNESS_SETUP_TIMEOUT_S)" in error
    # No registry allowed: the setup runs with no network at all.
    url = f"https://localhost:{index.port}/simple/"
    download = f"pip download --retries 0 -d /tmp/x --index-url {url} dh-greeting"
    offline = h.cli(*base, "--setup", download, "check the setup", timeout=300,
                    DURABLE_HARNESS_SETUP_REGISTRIES="[]")  # fmt: skip
    assert offline.returncode != 0
    error = h.show(ids_of(offline)["turn"])["turn"]["error"]
    assert "it ran with no network (DURABLE_HARNESS_SETUP_REGISTRIES is empty)" in error
    # A worker in another process runs a stored turn's setup only if its operator allows it.
    h.env["DURABLE_HARNESS_ALLOWED_IMAGES"] = python_image
    queued = h.cli(*base, "--detach", "--setup", "true", "check the setup")
    assert queued.returncode == 0, queued.stderr
    worker = h.cli("worker", "--until-idle")
    assert worker.returncode == 0, worker.stderr
    error = h.show(ids_of(queued)["turn"])["turn"]["error"]
    assert "setup 'true' is not a setup command this worker allows" in error, error
    assert "(DURABLE_HARNESS_ALLOWED_SETUP_COMMANDS)" in error
    # Bad input: one line, nothing recorded.
    virtual = h.cli("run", "--no-repo", "--setup", "true", "check the setup")
    assert virtual.returncode == 2
    assert "--setup runs in the session's container" in virtual.stderr
    assert "add --workspace docker" in virtual.stderr
    assert len(virtual.stderr.strip().splitlines()) == 1, virtual.stderr
    for ids in (ids_of(capped), ids_of(slow), ids_of(offline)):
        with DockerSandbox(ids["session"]) as box:
            box.remove()
