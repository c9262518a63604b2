"""Escape tests on a host folder, run from inside: the agent's own shell tool (a scripted
fake-model turn) runs code, base64-wrapped so that no command screening could recognise
it, that tries to take the worker's secrets and to outlive its command. The default,
hardened mode: no opt-in is set, so the agent runs as the unprivileged agent user
(sandbox/agent_user.py) with an allow-listed environment.

The attack, for the built-in agent on a local folder, Pi and OpenCode on a host folder:
read ``/proc/<pid>/environ`` of every process and of each ancestor (the CLI, the reaper,
the worker), its own environment, and every file of the World's folder (the journal, the
turn's signal secret); copy what it got into the workspace and print it (so it would reach
the model); leave a ``setsid`` sleeper and a double-forked ``setsid -f`` one behind.
Asserted: no secret of the worker (a provider key, the Postgres URL's password, a cloud
key, the turn's signal secret) is in what the model was sent (the journal's tool outputs,
the fake model's request log) nor in the workspace; the sleepers are gone; the turn
finishes. A control run of the built-in agent under the operator's unsafe same-user
opt-in shows the attack is not vacuous: there it finds the key.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Harness, make_harness

ATTACK = """
world={world}
{{
  echo "== own environment"; env
  echo "== every process"
  for f in /proc/[0-9]*/environ; do echo "-- $f"; tr '\\0' '\\n' < "$f"; done
  echo "== ancestors"
  p=$$
  while [ "$p" -gt 1 ]; do
    echo "-- $p $(tr '\\0' ' ' < /proc/$p/cmdline)"; tr '\\0' '\\n' < /proc/$p/environ
    p=$(awk '{{print $4}}' /proc/$p/stat)
  done
  echo "== world"; ls -laR "$world"
  find "$world" -type f -exec sh -c 'tr -cd "[:print:]\\n" < "$1"' _ {{}} \\;
  echo "== home"; ls -la ~; id
}} > loot.txt 2>&1
setsid sleep 987 < /dev/null > /dev/null 2>&1 &
echo $! > squatter1.pid
setsid -f sh -c 'echo $$ > squatter2.pid; exec sleep 988' < /dev/null > /dev/null 2>&1
sleep 0.5
cat loot.txt
echo "ATTACK-$((6*7))-DONE"
"""

FINAL = "The attack is over."

SCRIPT = """
[[rule]]
name = "title"
when.system = "You are a title generator"
reply.text = "Escape"

[[rule]]
name = "final"
when.conversation = "ATTACK-42-DONE"
reply.text = "{final}"

[[rule]]
name = "attack"
reply.tool_use = [ {{ name = "bash", input = {{ command = "{command}"{more} }} }} ]
"""


@pytest.fixture
def h(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Harness]:
    ws = tmp_path / "ws"
    ws.mkdir()
    attack = ATTACK.format(world=tmp_path / "world")
    wrapped = base64.b64encode(attack.encode()).decode()
    command = f"echo {wrapped} | base64 -d | bash"
    # OpenCode's bash tool wants a description; the others take none.
    more = ', description = "run"' if "opencode" in request.node.name else ""
    script = tmp_path / "script.toml"
    script.write_text(SCRIPT.format(final=FINAL, command=command, more=more))
    for harness in make_harness(tmp_path, script):
        harness.env.pop("DURABLE_HARNESS_UNSAFE_SAME_USER", None)
        harness.env.pop("DURABLE_HARNESS_UNSAFE_HOST_AGENT", None)
        harness.env.update(SECRETS)
        yield harness


SECRETS = {
    "ANTHROPIC_API_KEY": f"sk-test-canary-{secrets.token_hex(8)}",
    "DURABLE_HARNESS_POSTGRES_URL": (
        f"postgresql://dh:pg-pass-{secrets.token_hex(8)}@127.0.0.1:9/durable"
    ),
    "AWS_SECRET_ACCESS_KEY": f"aws-canary-{secrets.token_hex(8)}",
}
PASSWORD = SECRETS["DURABLE_HARNESS_POSTGRES_URL"].split(":")[2].split("@")[0]


def _worker_secrets(h: Harness) -> list[str]:
    """The canaries of the worker's environment and every turn's signal secret (read
    from the World's own database, where the attack tried to read it)."""
    found = [SECRETS["ANTHROPIC_API_KEY"], SECRETS["AWS_SECRET_ACCESS_KEY"], PASSWORD]
    with sqlite3.connect(h.tmp / "world" / "world.sqlite3") as db:
        rows = db.execute("SELECT config FROM turns").fetchall()
    for (config,) in rows:
        secret = json.loads(config).get("signal_secret")
        assert secret, "every turn has a signal secret"
        found.append(str(secret))
    return found


def _journal(h: Harness) -> str:
    """Everything the turn recorded: each step's input (the model requests, with the tool
    results the model was sent) and output, and every blob they refer to."""
    world = h.tmp / "world"
    with sqlite3.connect(world / "world.sqlite3") as db:
        rows = db.execute("SELECT input, output FROM steps").fetchall()
    text = "\n".join(f"{i or ''}\n{o or ''}" for i, o in rows)
    files = [p for p in (world / "blobs").rglob("*") if p.is_file()]
    blobs = (p.read_bytes().decode("utf-8", "replace") for p in files)
    return text + "\n".join(b for b in blobs if b)


def _attack(h: Harness, agent: str, **env: str) -> tuple[str, str]:
    """Run the attack turn with ``agent`` on the workspace; (the text the model was sent
    back, everything in the workspace), after checking that the turn finished."""
    started = time.monotonic()
    out = h.cli("run", "--agent", agent, "--workspace", str(h.tmp / "ws"), "go", timeout=240, **env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    print(f"{agent}: attack turn took {time.monotonic() - started:.1f}s")
    sent = _journal(h) + h.log.read_text()
    ws = h.tmp / "ws"
    files = "\n".join(
        p.read_bytes().decode("utf-8", "replace") for p in ws.rglob("*") if p.is_file()
    )
    assert "ATTACK-42-DONE" in sent, "the attack ran and its output went back to the model"
    return sent, files


def _assert_refused(h: Harness, agent: str, sent: str, files: str) -> None:
    loot = (h.tmp / "ws" / "loot.txt").read_text(errors="replace")
    assert "== ancestors" in loot and "== world" in loot  # the attack got that far
    assert "Permission denied" in loot  # and was refused, not skipped
    for secret in _worker_secrets(h):
        assert secret not in sent, f"{agent}: a worker secret reached the model"
        assert secret not in files, f"{agent}: a worker secret is in the workspace"
    for name in ("squatter1.pid", "squatter2.pid"):
        pid = int((h.tmp / "ws" / name).read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_builtin_agent_on_a_local_folder(h: Harness) -> None:
    sent, files = _attack(h, "builtin")
    _assert_refused(h, "builtin", sent, files)
    assert "uid=" in files and "durable-harness-agent" in files  # ran as the agent user


def test_the_unsafe_same_user_opt_in_is_what_the_attack_needs(h: Harness) -> None:
    """The control: with the operator's unsafe opt-in the same attack finds the key, so
    the hardened runs above are refused, not merely missing their target."""
    sent, _ = _attack(h, "builtin", DURABLE_HARNESS_UNSAFE_SAME_USER="1")
    assert SECRETS["ANTHROPIC_API_KEY"] in sent


def test_pi_on_a_host_folder(h: Harness) -> None:
    sent, files = _attack(h, "pi")
    _assert_refused(h, "pi", sent, files)


def test_opencode_on_a_host_folder(h: Harness) -> None:
    sent, files = _attack(h, "opencode")
    _assert_refused(h, "opencode", sent, files)
