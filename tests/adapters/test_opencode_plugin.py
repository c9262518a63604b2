"""The journaling plugin fails closed: the real OpenCode CLI with the plugin, against the
fake model, and a harness endpoint that denies, fails, or is gone when the tool comes.

In each case the bash call is blocked (its effect never happens) and the model gets the
reason as the tool's error. The harness endpoint here is a small HTTP server on loopback
that answers the plugin's SessionStart (so the plugin loads) and then misbehaves.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from durable_harness.adapters.opencode.spec import find_opencode, prepare_home
from durable_harness.testing.fake_model import FakeModelServer

TOKEN = "launch-token"
SCRIPT = """
[[rule]]
name = "title"
when.system = "You are a title generator"
reply.text = "Blocked tool"

[[rule]]
name = "after"
when.last_tool_name = "bash"
reply.text = "The tool was blocked."

[[rule]]
name = "bash"
reply.tool_use = [ { name = "bash", input = { command = "touch ran.txt", description = "x" } } ]
"""


class _Harness(ThreadingHTTPServer):
    daemon_threads = True
    mode = "deny"
    events: list[tuple[str, dict[str, object]]]


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        server = self.server
        assert isinstance(server, _Harness)
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        event = self.path.removeprefix("/_dh/")
        server.events.append((event, payload))
        assert self.headers["X-Durable-Harness-Token"] == TOKEN
        status, reply = 200, {}
        if event == "PreToolUse" and server.mode == "deny":
            reply = {
                "hookSpecificOutput": {
                    "hookEventName": "PreToolUse",
                    "permissionDecision": "deny",
                    "permissionDecisionReason": "durable-harness: denied by the test",
                }
            }
        elif event == "PreToolUse":
            status, reply = 500, {"error": "the journal is unavailable"}
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if event == "SessionStart" and server.mode == "gone":
            threading.Thread(target=_close, args=(server,), daemon=True).start()


def _close(server: _Harness) -> None:
    server.shutdown()
    server.server_close()


@pytest.fixture
def model(tmp_path: Path) -> Iterator[FakeModelServer]:
    script = tmp_path / "script.toml"
    script.write_text(SCRIPT)
    with FakeModelServer(script, log_path=tmp_path / "model.jsonl") as server:
        server.start()
        yield server


@pytest.mark.parametrize("mode", ["deny", "error", "gone"])
def test_tool_is_blocked_unless_the_harness_allows_it(
    tmp_path: Path, model: FakeModelServer, mode: str
) -> None:
    harness = _Harness(("127.0.0.1", 0), _Handler)
    harness.mode, harness.events = mode, []
    threading.Thread(target=harness.serve_forever, kwargs={"poll_interval": 0.05}).start()
    try:
        ws = tmp_path / "ws"
        ws.mkdir()
        with tempfile.TemporaryDirectory(prefix="durable-harness-opencode-") as home:
            host, port = harness.server_address[:2]
            env = prepare_home(
                Path(home),
                model_url=model.url,
                harness_url=f"http://{host!s}:{port}",
                token=TOKEN,
                model="claude-sonnet-4-5",
            )
            out = subprocess.run(
                [find_opencode(), "run", "--format", "json", "--", "make a file"],
                cwd=ws,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )
    finally:
        if mode != "gone":
            _close(harness)
    assert out.returncode == 0, out.stderr
    assert not (ws / "ran.txt").exists()  # the tool never ran
    tools = [json.loads(line) for line in out.stdout.splitlines() if '"tool_use"' in line]
    assert [t["part"]["state"]["status"] for t in tools] == ["error"]
    error = tools[0]["part"]["state"]["error"]
    expected = {"deny": "denied by the test", "error": "HTTP 500", "gone": "cannot be reached"}
    assert expected[mode] in error, error
    events = [e for e, _ in harness.events]
    assert events[0] == "SessionStart"
    if mode != "gone":
        pre = next(p for e, p in harness.events if e == "PreToolUse")
        assert pre["tool_name"] == "bash" and str(pre["tool_use_id"]).startswith("toolu_")
        assert pre["tool_input"] == {"command": "touch ran.txt", "description": "x"}
    assert "The tool was blocked." in out.stdout
