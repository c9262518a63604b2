"""The viewer's approve button cannot be pressed from an agent's sandbox: a turn's own
shell tool (the built-in agent on a host folder, the default hardened mode: the agent
user, an allow-listed environment) POSTs to ``serve``'s signal route of another tenant's
waiting turn with every credential-looking string its process can find (its
environment, every readable ``/proc/*/environ``, the files of its HOME and workspace, the
World's folder) as ``Authorization: Bearer``, and without one. Every answer is 401 and the
waiting turn holds no signal. The worker that runs the turn holds a real API token of the
waiting turn's tenant and that turn's signal secret in its environment: if either reached
the sandbox, the attack would find it (the control, under the operator's unsafe
same-user opt-in, does: its signal is accepted)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_cases import token, world_of
from support import Harness, make_harness, start_serve

from durable_harness.runtime.turns import new_id

FINAL = "The signal attack is over."
SCRIPT = """
[[rule]]
name = "title"
when.system = "You are a title generator"
reply.text = "Signal"

[[rule]]
name = "final"
when.conversation = "SIGNAL-ATTACK-DONE"
reply.text = "{final}"

[[rule]]
name = "attack"
reply.tool_use = [ {{ name = "bash", input = {{ command = "{command}" }} }} ]
"""

# Python, run by the agent user's /usr/bin/python3 (stdlib only).
ATTACK = r"""
import json, os, re, urllib.request, urllib.error
with open("target.json") as f:  # what the attacker is assumed to know: no credential
    target = json.load(f)
URL, TURN, WORLD = target["url"], target["turn"], target["world"]
found = set()
def add(text):
    found.add(text.strip())
    for word in re.split(r"[\s=:;,'\"\x00]+", text):
        if 8 <= len(word) <= 400:
            found.add(word)
def read(path):
    try:
        with open(path, "rb") as f:
            add(f.read(1 << 20).decode("latin-1"))
    except OSError:
        pass
for value in os.environ.values():
    add(value)
for pid in os.listdir("/proc"):
    if pid.isdigit():
        read(f"/proc/{pid}/environ")
        read(f"/proc/{pid}/cmdline")
for root in (os.path.expanduser("~"), os.getcwd(), WORLD):
    for folder, _dirs, files in os.walk(root):
        for name in files[:500]:
            read(os.path.join(folder, name))
# Anything shaped like an API token first: the cap must never hide one.
usable = (c for c in found if c and c.isprintable())
tried = sorted(usable, key=lambda c: (not c.startswith("dh_"), c))[:5000]
statuses = {}
def post(header):
    req = urllib.request.Request(
        f"{URL}/v1/turns/{TURN}/signals/approve", data=b'{"approved": true}',
        method="POST", headers={"content-type": "application/json", **header})
    try:
        with urllib.request.urlopen(req, timeout=10) as res:
            code = res.status
    except urllib.error.HTTPError as exc:
        code = exc.code
    statuses[str(code)] = statuses.get(str(code), 0) + 1
post({})
for candidate in tried:
    post({"Authorization": f"Bearer {candidate}"})
out = {"tried": len(tried) + 1, "statuses": statuses,
       "tokens_seen": sum(c.startswith("dh_") for c in tried)}
with open("signal-attack.json", "w") as f:
    json.dump(out, f)
print(json.dumps(out))
print("SIGNAL-ATTACK-" + "DONE")
"""


@pytest.fixture
def attack(tmp_path: Path) -> Iterator[tuple[Harness, str]]:
    """A harness whose worker environment holds acme's token and the waiting turn's
    secret; the waiting turn's id; `serve` on the same World."""
    ws = tmp_path / "ws"
    ws.mkdir()
    wrapped = base64.b64encode(ATTACK.encode()).decode()
    command = f"echo {wrapped} | base64 -d > attack.py && /usr/bin/python3 attack.py"
    script = tmp_path / "script.toml"
    script.write_text(SCRIPT.format(final=FINAL, command=command))
    for h in make_harness(tmp_path, script):
        h.env.pop("DURABLE_HARNESS_UNSAFE_SAME_USER", None)
        h.env.pop("DURABLE_HARNESS_UNSAFE_HOST_AGENT", None)
        with world_of(h) as world:
            acme = token(world, "acme")
            session_id = new_id("ses")
            world.put_owner("session", session_id, "acme", time.time())
            world.create_session(session_id, {"agent": "builtin"})
            waiting = new_id("turn")
            world.put_owner("turn", waiting, "acme", time.time())
            secret = f"signal-secret-canary-{waiting}"
            world.create_turn(session_id, waiting, "approve me", {"signal_secret": secret})
            lease = world.claim_turn(waiting, "test", 600.0)
            assert lease is not None
            world.suspend(lease, time.time() + 3600, "signal approve", "approve")
        h.env["DURABLE_HARNESS_TEST_API_TOKEN"] = acme
        h.env["DURABLE_HARNESS_TEST_SIGNAL_SECRET"] = secret
        serve = start_serve(h)
        try:
            target = {"url": serve.url, "turn": waiting, "world": str(tmp_path / "world")}
            (ws / "target.json").write_text(json.dumps(target))
            yield h, waiting
        finally:
            serve.stop()


def _run(h: Harness, **env: str) -> dict[str, object]:
    out = h.cli(
        "run", "--agent", "builtin", "--workspace", str(h.tmp / "ws"), "go", timeout=240, **env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == FINAL
    result: dict[str, object] = json.loads((h.tmp / "ws" / "signal-attack.json").read_text())
    print(f"signal attack from the sandbox: {result}")
    return result


def test_a_sandboxed_tool_cannot_signal_a_waiting_turn(attack: tuple[Harness, str]) -> None:
    h, waiting = attack
    result = _run(h)
    statuses = result["statuses"]
    assert isinstance(statuses, dict) and isinstance(result["tried"], int)
    # Every request reached serve (the sandbox can reach it) and was refused.
    assert statuses == {"401": result["tried"]}, result
    assert result["tried"] > 20  # it found plenty to try
    with world_of(h) as world:
        turn = world.get_turn(waiting)
        assert (turn.status.value, turn.waiting_for) == ("waiting", "signal approve")
        assert world.list_signals(waiting, "approve") == []


def test_the_control_finds_the_workers_credentials(attack: tuple[Harness, str]) -> None:
    """Under the unsafe same-user opt-in the same attack reads the worker's environment
    and gets in: the hardened run above is refused, not merely missing its target."""
    h, waiting = attack
    result = _run(h, DURABLE_HARNESS_UNSAFE_SAME_USER="1")
    statuses = result["statuses"]
    assert isinstance(statuses, dict) and statuses.get("200", 0) >= 1, result
    with world_of(h) as world:
        assert [s.payload for s in world.list_signals(waiting, "approve")] == ['{"approved": true}']
