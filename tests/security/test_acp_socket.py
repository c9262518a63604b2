"""Boundary 16 from inside the container: an ACP launch's unix socket attacked by a
process in the session's container (``acp_socket_attack.js``, as the agent user, as
anything an earlier command left running there would be). The worker listens on
``acp-<random>.sock`` for one connection carrying the launch's token; the attacker
connects the moment the socket appears, before the launch's own ``dh-acp.js``: with no
token, a wrong one, an earlier launch's (read from that launch's HOME), an oversized
first line, a slow sender (cut at the listener read timeout), and a second connection
once the launch has taken its own. Every attack is closed with nothing sent to it; the
launch's connection carries the agent's stdio (here ``cat``: a line comes back) as if
nothing happened."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from pathlib import Path

import pytest

from durable_harness.adapters.acp.docker import start_in_docker
from durable_harness.adapters.cli.docker_host import DockerCliHost
from durable_harness.sandbox.docker import RUN_DIR

ATTACK = Path(__file__).with_name("acp_socket_attack.js")
READ_TIMEOUT_S = "2"


async def _echo(host: DockerCliHost, job: str) -> bytes:
    agent = await start_in_docker(host, job, ["cat"], {}, {}, 1 << 20, 60)
    try:
        agent.stdin.write(b'{"jsonrpc":"2.0","method":"ping"}\n')
        await agent.stdin.drain()
        line = await asyncio.wait_for(agent.stdout.readline(), 30)
        # A launch talks for longer than the listener's read timeout (the slow sender's).
        await asyncio.sleep(float(READ_TIMEOUT_S) + 3)
        return line
    finally:
        await agent.stop()


def test_acp_socket_attacked_from_inside(docker_host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_HARNESS_LISTENER_READ_TIMEOUT_S", READ_TIMEOUT_S)
    host = DockerCliHost(f"test-acp-sock-{secrets.token_hex(4)}")
    try:
        host.sandbox.container_id()  # the container and its run folder
        # An earlier launch in this container: its socket is gone, its token file stays.
        assert asyncio.run(_echo(host, "launch-0")) == b'{"jsonrpc":"2.0","method":"ping"}\n'
        old = host.sandbox.exec(f"cat {host.home('launch-0')}/dh-acp-token", timeout=30)
        assert old.exit_code == 0, old.stderr
        old_token = old.stdout.decode().strip()
        assert len(old_token) >= 40

        attacker = host.home("attacker") + "/attack.js"
        host.sandbox.write_bytes(attacker, ATTACK.read_bytes())
        host.sandbox.jobs.start(
            "attacker", f"node {attacker} {RUN_DIR} {old_token} 120", contain=True
        )
        # The attacker is polling the run folder before the worker listens.
        time.sleep(1)
        echoed = asyncio.run(_echo(host, "launch-1"))
        assert echoed == b'{"jsonrpc":"2.0","method":"ping"}\n'  # the launch is unaffected

        host.sandbox.jobs.wait("attacker", timeout=120)
        out = host.sandbox.jobs.read_output("attacker", 0, "stdout").decode()
        line = next((x for x in out.splitlines() if x.startswith("ATTACK")), out)
        assert line.startswith("ATTACKS "), (
            line,
            host.sandbox.jobs.read_output("attacker", 0, "stderr").decode()[-500:],
        )
        results = json.loads(line.removeprefix("ATTACKS "))
        print(json.dumps(results, indent=1))
        refused_on_connect = (
            "no token",
            "wrong token",
            "earlier launch's token",
            "oversized first line",
            "slow sender",
        )
        for name in refused_on_connect:
            result = results[name]
            assert result["connected"] and result["received"] == 0, (name, results)
            assert result["closed"] and not result["timedOut"], (name, results)
        # Once the launch has taken its connection the socket is gone.
        second = results["second connection"]
        assert second["received"] == 0 and second["error"] in ("ENOENT", "ECONNREFUSED"), second
    finally:
        host.sandbox.remove()
