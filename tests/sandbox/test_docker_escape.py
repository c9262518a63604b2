"""Escape tests, run from inside the Docker sandbox as the agent would: no network, no
secret of the worker, nothing writable outside the workspace, no Docker socket.
(Fork bombs and memory hogs: test_docker_sandbox.py.)"""

from __future__ import annotations

import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator

import pytest

from durable_harness.sandbox.docker import DockerSandbox

LIMITS = {"memory": "256m", "pids": 128, "cpus": 1.0, "timeout": 120.0}
WRITABLE = ("/workspace", "/home/agent", "/tmp")


@pytest.fixture
def box(docker_host: str) -> Iterator[DockerSandbox]:
    with DockerSandbox(f"test-{uuid.uuid4().hex[:12]}", **LIMITS) as sandbox:
        yield sandbox
        sandbox.remove()


def _host_addresses() -> list[str]:
    """Every address of this machine, loopback included."""
    found = ["127.0.0.1", "::1"]
    for family in ("-4", "-6"):
        out = subprocess.run(
            ["ip", "-o", family, "addr", "show"], capture_output=True, text=True, check=False
        ).stdout
        for line in out.splitlines():
            address = line.split()[3].split("/")[0]
            if address not in found and not address.startswith("fe80"):
                found.append(address)
    return found


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP server on every IPv4 and IPv6 address of the host, accepting anything."""
    server = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                conn.close()
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join()
    server.close()


def test_no_address_is_reachable(box: DockerSandbox, listener: int) -> None:
    assert box.bash("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '").stdout == "lo\n"
    targets = [(a, listener) for a in _host_addresses()] + [("1.1.1.1", 443), ("127.0.0.1", 2375)]
    # The host's own listener answers from the host: the check below is not vacuous.
    socket.create_connection(("127.0.0.1", listener), timeout=2).close()
    probe = "; ".join(
        f"timeout 3 bash -c 'echo > /dev/tcp/{a}/{p}' 2>/dev/null && echo 'REACHED {a} {p}'"
        for a, p in targets
    )
    result = box.bash(probe, timeout=60)
    assert "REACHED" not in result.stdout


def test_the_workers_secrets_are_nowhere_in_the_container(
    monkeypatch: pytest.MonkeyPatch, docker_host: str
) -> None:
    secret = "sk-ant-" + uuid.uuid4().hex
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    with DockerSandbox(f"test-{uuid.uuid4().hex[:12]}", **LIMITS) as box:
        try:
            box.write("x.txt", "work")
            box.jobs.start("job", "sleep 30")
            # The command text must not hold the secret itself, or grep finds the command.
            half = len(secret) // 2
            needle = f'"{secret[:half]}""{secret[half:]}"'
            result = box.bash(
                f'n={needle}; env | grep -cF "$n"; '
                f'cat /proc/[0-9]*/environ 2>/dev/null | tr "\\0" "\\n" | grep -cF "$n"; '
                f'ps -eo args > /tmp/ps.txt; grep -cF "$n" /tmp/ps.txt; '
                f'grep -rlsF --exclude-dir=proc --exclude-dir=sys "$n" /; echo done',
                timeout=120,
            )
            assert result.stdout.split() == ["0", "0", "0", "done"], result
            config = box.client.containers.get(box.container_id()).attrs["Config"]
            assert not any(secret in e for e in config["Env"])
        finally:
            box.remove()


def test_nothing_outside_the_workspace_is_writable(box: DockerSandbox) -> None:
    listing = box.bash(
        "find / \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o -writable -print "
        "2>/dev/null; echo; find /dev -writable ! -type c ! -type l 2>/dev/null",
        timeout=60,
    ).stdout
    rootfs, dev = listing.split("\n\n", 1)
    outside = [p for p in rootfs.split("\n") if p and not p.startswith(WRITABLE)]
    assert outside == []
    # In /dev only the standard character devices, shared memory and message queues.
    assert sorted(p for p in dev.split("\n") if p) == ["/dev/mqueue", "/dev/shm"]
    failed = box.bash(
        "for d in / /etc /usr/bin /opt/agent-clis /var /root; do "
        'touch "$d/probe" 2>/dev/null && echo "WROTE $d"; done; '
        "mount -t tmpfs x /mnt 2>/dev/null && echo MOUNTED; "
        "su -c id root </dev/null 2>/dev/null && echo ROOT; echo checked"
    )
    assert failed.stdout == "checked\n"


def test_the_docker_socket_is_not_reachable(box: DockerSandbox, docker_host: str) -> None:
    path = docker_host.removeprefix("unix://")
    result = box.bash(
        f"ls /var/run/docker.sock /run/docker.sock {path} 2>/dev/null; "
        "find / \\( -path /proc -o -path /sys \\) -prune -o -type s -print 2>/dev/null; "
        "echo checked",
        timeout=60,
    )
    assert result.stdout == "checked\n"


def test_the_proxy_run_folder_is_read_only(box: DockerSandbox) -> None:
    """The one host folder in the container (where a CLI adapter serves its model proxy's
    socket) is mounted read-only: the agent can connect to a socket there, not plant one."""
    result = box.bash(
        "grep ' /run/durable-harness ' /proc/mounts | cut -d' ' -f4 | cut -d, -f1; "
        "touch /run/durable-harness/probe 2>/dev/null && echo WROTE; "
        "echo checked"
    )
    assert result.stdout == "ro\nchecked\n", result
