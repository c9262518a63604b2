"""Lossless bytes: whatever a model or tool produces is recorded and replayed exactly.

The untrusted side (the model, a tool's output, a shell in the sandbox) may produce text
that is not valid Unicode: a lone surrogate (a model's reply cut inside a pair, sent as the
JSON escape ``\\ud83d``), or bytes that are not UTF-8 (a shell's stdout, an upstream stream).
Before, such a step could not be stored (its outcome could not be encoded as UTF-8, or went
into PostgreSQL's jsonb), so it was paid again on every delivery and then dead-lettered.
Here, on each World: the step is recorded, and a replay returns it byte for byte.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import postgres_server
import pytest
import services_s3

from durable_harness.adapters.claude_code.canonical import ClaudeCodeCanonicalizer
from durable_harness.adapters.proxy.server import JournalingProxy, Upstream
from durable_harness.core.canonical import canonical_json
from durable_harness.core.keys import input_digest
from durable_harness.core.types import StepStatus
from durable_harness.core.world import World
from durable_harness.harness.crash import CRASH_POINTS
from durable_harness.harness.journal import Journal, OpenStep, Outcome, StepResult, decode_output
from durable_harness.testing.fake_model import FakeModelServer, parse_script
from durable_harness.testing.matrix import FreshRuns, run_cells
from durable_harness.worlds import open_world

TOKEN = "per-turn-token"
#: A lone high surrogate, a lone low one, a byte that is not UTF-8 (as surrogateescape
#: carries it), a NUL (which PostgreSQL text and jsonb refuse raw), and ordinary text.
ODD = "lone \ud83d and \ude00, byte \udcff, nul \x00, fine é ☃ 😀"
#: The same as the JSON escapes of a JSON string (what a script's text_json holds).
ODD_JSON = "lone \\ud83d and \\ude00, byte \\udcff, nul \\u0000, fine é ☃ 😀"
SCRIPT = f"""
[[rule]]
name = "surrogate"
when.last_user_text = "surrogate"
reply.text_json = '{ODD_JSON}'

[[rule]]
name = "raw"
when.last_user_text = "raw"
reply.text_json = 'not UTF-8: \\udcff\\udcfe\\udc80 end'
reply.raw_bytes = true
"""


@contextlib.contextmanager
def _world(kind: str, tmp_path: Path) -> Iterator[World]:
    if kind == "local":
        world = open_world("local", data_dir=str(tmp_path / "world"))
    elif kind == "postgres":
        if postgres_server.find_bindir() is None:
            pytest.fail("PostgreSQL binaries not found: run scripts/setup (it installs them)")
        with postgres_server.fresh_world() as options:
            world = open_world("postgres", **options)
            try:
                yield world
            finally:
                world.close()
            return
    else:
        server = services_s3.moto()
        with services_s3.s3sqs_env(server.url, server.url) as options:
            world = open_world("s3sqs", **options)
            try:
                yield world
            finally:
                world.close()
            return
    try:
        yield world
    finally:
        world.close()


@pytest.fixture(params=["local", "postgres", "s3sqs"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    with _world(request.param, tmp_path) as opened:
        yield opened


def _journal(world: World, attempt: int) -> Journal:
    if attempt == 1:
        world.create_session("ses_bytes", {})
        world.create_turn("ses_bytes", "turn_bytes", "p", {"agent": "claude-code"})
    else:
        # The first worker is gone: its lease ran out, a new one claims the turn.
        world.release(lease_of[world], delay=0)
    lease = world.claim_turn("turn_bytes", f"worker-{attempt}", 60)
    assert lease is not None
    lease_of[world] = lease
    return Journal(world, lease)


lease_of: dict[World, Any] = {}


def _tool_step(journal: Journal, n: int, tool_in: dict[str, Any]) -> OpenStep | StepResult:
    return journal.begin_keyed(
        kind="tool", name="emit", key=f"tool:emit{n}", input=tool_in, replay="never"
    )


def _post(proxy: JournalingProxy, text: str, stream: bool) -> bytes:
    parts = urlsplit(proxy.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
    }
    conn.request("POST", "/v1/messages", json.dumps(body), {"x-api-key": TOKEN})
    response = conn.getresponse()
    data = response.read()
    assert response.status == 200, data[:300]
    conn.close()
    return data


def _through_proxy(world: World, journal: Journal, fake: FakeModelServer) -> dict[str, bytes]:
    upstream = Upstream(fake.url, "provider-key", send_key=True)
    with JournalingProxy(
        journal, ClaudeCodeCanonicalizer(), upstream, TOKEN, models=("claude-sonnet-4-5",)
    ) as proxy:
        return {
            f"{text}-{'stream' if stream else 'json'}": _post(proxy, text, stream)
            for text in ("surrogate", "raw")
            for stream in (True, False)
            if not (text == "raw" and not stream)  # a JSON body that is not UTF-8: not JSON
        }


def test_model_and_tool_bytes_are_recorded_and_replayed_exactly(
    world: World, tmp_path: Path
) -> None:
    script = parse_script(SCRIPT)
    with FakeModelServer(script, log_path=tmp_path / "fake.jsonl") as fake:
        fake.start()
        journal = _journal(world, 1)
        first = _through_proxy(world, journal, fake)
        upstream_calls = fake.stats()["requests"]

        # Model replies: the lone surrogates went to the CLI as their JSON escapes, the
        # stream that is not UTF-8 as its very bytes.
        for escape in (b"\\ud83d", b"\\ude00", b"\\udcff", b"\\u0000"):
            assert escape in first["surrogate-stream"]
        assert b"\xff\xfe\x80" in first["raw-stream"]
        with pytest.raises(UnicodeDecodeError):
            first["raw-stream"].decode("utf-8")
        message = json.loads(first["surrogate-json"])
        assert message["content"][0]["text"] == ODD

        # A tool's str output with surrogates, its input with one, and a big output (a blob).
        tool_in = {"path": "x\udcff", "note": ODD}
        outputs = {"content": ODD, "bytes": b"\xff\x00\xfe".decode("utf-8", "surrogateescape")}
        big = {"content": ODD * 4000}
        for n, value in enumerate((outputs, big)):
            begun = _tool_step(journal, n, tool_in)
            assert isinstance(begun, OpenStep)
            step = journal.end(begun, Outcome(value, {"note": ODD}))
            assert step.status is StepStatus.DONE and not step.replayed
        recorded = world.load_steps("turn_bytes")
        assert [s.status for s in recorded] == [StepStatus.DONE] * len(recorded)
        assert recorded[-1].output_blob is not None  # the big one went to the blob store

        # Another worker replays every step from the World: the same values, the same
        # bytes to the CLI, no model call paid again, no tool run again.
        again = _journal(world, 2)
        replayed = _through_proxy(world, again, fake)
        assert replayed == first
        assert fake.stats()["requests"] == upstream_calls
        for n, value in enumerate((outputs, big)):
            step = _tool_step(again, n, tool_in)
            assert isinstance(step, StepResult), "a recorded tool would run again"
            assert step.replayed and step.value == value
            assert step.value["content"].encode("utf-16", "surrogatepass") == (
                value["content"].encode("utf-16", "surrogatepass")
            )
        tool_steps = [s for s in world.load_steps("turn_bytes") if s.kind == "tool"]
        carried = decode_output(world, tool_steps[0])["bytes"]
        assert carried.encode("utf-8", "surrogateescape") == b"\xff\x00\xfe"
        assert tool_steps[0].input_hash == input_digest(tool_in)


def test_canonical_json_keeps_old_spellings_and_escapes_only_lone_surrogates() -> None:
    # What was storable before is spelled as before (tests/harness/test_keys.py pins more).
    assert canonical_json({"a": "é ☃ 😀", "n": "\x00"}) == '{"a":"é ☃ 😀","n":"\\u0000"}'
    assert canonical_json("\ud83d|\udcff") == '"\\ud83d|\\udcff"'
    # Two code points forming a pair (two deltas joined) are spelled as their character.
    assert canonical_json("\ud83d" + "\ude00") == canonical_json("😀")
    assert json.loads(canonical_json(ODD)) == ODD


# --- the built-in agent, the crash matrix ----------------------------------------------

TOOLS_FILE = '''
import os
import sys
import time
from pathlib import Path
from pydantic import BaseModel
from durable_harness import tool

class Args(BaseModel):
    what: str = ""

@tool(replay="safe")
def emit(args: Args) -> str:
    """Text that is not valid Unicode: surrogates, and bytes that are not UTF-8."""
    return "tool says \\ud800 and " + b"\\xff\\xfe".decode("utf-8", "surrogateescape")

@tool(replay="never")
def leave(args: Args) -> str:
    """Ends the worker, if it can."""
    if args.what == "exit":
        sys.exit(3)
    if args.what == "sleep":  # until the operator's Ctrl-C
        Path(os.environ["MARKER"]).write_text("started")
        time.sleep(60)
    raise KeyboardInterrupt("from the tool")

TOOLS = [emit, leave]
'''
MATRIX_SCRIPT = f"""
[[rule]]
name = "final"
when.last_tool_name = "bash"
reply.text_json = 'done: {ODD_JSON}'

[[rule]]
name = "shell"
when.last_tool_name = "emit"
reply.text_json = 'a cut pair \\ud83d, then the shell'
reply.tool_use = [ {{ name = "bash", input = {{ command = "echo shell out" }} }} ]

[[rule]]
name = "first"
reply.text_json = 'starting \\ude00'
reply.tool_use = [ {{ name = "emit", input = {{ what = "go" }} }} ]
"""


@pytest.mark.timeout(600)  # 5 cells of 2 CLI runs each, on a loaded machine
@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_matrix_with_odd_bytes(tmp_path: Path, point: str) -> None:
    """A crash at every point (one test each, so they spread over workers) of every step
    of a turn whose model replies and tool output are not valid Unicode: resumed, no model
    call repeated, the same reply, and every step's recorded outcome equal to the clean
    run's."""
    tools = tmp_path / "tools.py"
    tools.write_text(TOOLS_FILE)
    script = tmp_path / "script.toml"
    script.write_text(MATRIX_SCRIPT)
    runner = FreshRuns(tmp_path / "runs", script, [f"{tools}:TOOLS"], "surrogates please", {})
    shown: dict[str, dict[str, Any]] = {}

    def turn(name: str, crash_at: str | None) -> tuple[dict[str, Any], list[str], str]:
        data, hashes, reply = runner.turn(name, crash_at)
        shown[name] = data
        return data, hashes, reply

    results = run_cells(turn, {"leave"}, points=(point,), say=lambda _line: None)
    assert len(results) == 5  # model, emit, model, bash, model
    bad = [r for r in results if not r.ok]
    assert not bad, bad
    clean = shown["clean"]
    assert clean["turn"]["result"] == "done: " + ODD.replace("\ud83d", "\ufffd").replace(
        "\ude00", "\ufffd"
    ).replace("\udcff", "\ufffd")
    outs = _outputs(tmp_path / "runs" / "clean", clean)
    assert outs[0]["content"][0]["text"] == "starting \ude00"
    assert outs[1]["content"] == "tool says \ud800 and \udcff\udcfe"
    assert outs[2]["content"][0]["text"] == "a cut pair \ud83d, then the shell"
    assert outs[4]["content"][0]["text"] == "done: " + ODD
    # Every crashed-and-resumed turn recorded exactly the clean run's outcomes (the model
    # steps' ids aside, which are seeded by the request and so equal too).
    for name, data in shown.items():
        got = _outputs(tmp_path / "runs" / name, data)
        assert [canonical_json(o) for o in got] == [canonical_json(o) for o in outs], name


def _outputs(folder: Path, data: dict[str, Any]) -> list[Any]:
    world = open_world("local", data_dir=str(folder / "world"))
    try:
        steps = world.load_steps(data["turn"]["turn_id"])
        return [
            {k: v for k, v in decode_output(world, s).items() if k != "id"}
            if s.kind == "model"
            else decode_output(world, s)
            for s in steps
        ]
    finally:
        world.close()


# --- a tools file that exits ------------------------------------------------------------

EXIT_SCRIPT = """
[[rule]]
name = "after"
when.last_tool_name = "leave"
reply.text = "survived"

[[rule]]
name = "exit"
when.last_user_text = "exit"
reply.tool_use = [ { name = "leave", input = { what = "exit" } } ]

[[rule]]
name = "interrupt"
when.last_user_text = "interrupt"
reply.tool_use = [ { name = "leave", input = { what = "interrupt" } } ]

[[rule]]
name = "sleep"
when.last_user_text = "sleep"
reply.tool_use = [ { name = "leave", input = { what = "sleep" } } ]
"""


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_harness.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_tools_file_cannot_exit_the_worker(tmp_path: Path) -> None:
    tools = tmp_path / "tools.py"
    tools.write_text(TOOLS_FILE)
    exits_on_import = tmp_path / "bad.py"
    exits_on_import.write_text("import sys\nsys.exit(7)\nTOOLS = []\n")
    script = tmp_path / "script.toml"
    script.write_text(EXIT_SCRIPT)
    with FakeModelServer(script) as fake:
        fake.start()
        env = {
            **os.environ,
            "ANTHROPIC_BASE_URL": fake.url,
            "DURABLE_HARNESS_WORLD": "local",
            "DURABLE_HARNESS_DATA_DIR": str(tmp_path / "world"),
            "DURABLE_HARNESS_LEASE_SECONDS": "2",
            "DURABLE_HARNESS_POLL_SECONDS": "0.1",
        }
        spec = f"{tools}:TOOLS"
        for prompt, raised in (("exit", "SystemExit(3)"), ("interrupt", "KeyboardInterrupt")):
            out = _cli(env, "run", "--tools", spec, prompt)
            assert out.returncode == 0, out.stderr
            assert out.stdout.strip().splitlines()[-1] == "survived"
            turn = out.stdout.split("turn ", 1)[1].split()[0]
            world = open_world("local", data_dir=str(tmp_path / "world"))
            try:
                step = next(s for s in world.load_steps(turn) if s.kind == "tool")
                result = decode_output(world, step)
            finally:
                world.close()
            assert step.status is StepStatus.DONE and step.attempts == 1, step
            assert result["is_error"] is True
            assert f"ToolExited: tool 'leave' raised {raised}" in result["content"]

        out = _cli(env, "run", "--tools", f"{exits_on_import}:TOOLS", "exit")
        assert out.returncode != 7, "the tools file's sys.exit(7) ended the process"
        assert "importing" in out.stderr and "SystemExit(7)" in out.stderr, out.stderr

        # A Ctrl-C the worker really gets while a tool runs is the operator's: it still
        # stops the worker, and the call is not recorded as the tool's failure.
        marker = tmp_path / "started"
        worker = subprocess.Popen(
            [sys.executable, "-m", "durable_harness.cli", "run", "--tools", spec, "sleep"],
            env={**env, "MARKER": str(marker)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 90
        while not marker.exists():
            assert worker.poll() is None and time.monotonic() < deadline, "the tool never ran"
            time.sleep(0.1)
        worker.send_signal(signal.SIGINT)
        stdout, _ = worker.communicate(timeout=60)
        assert worker.returncode != 0
        turn = stdout.split("turn ", 1)[1].split()[0]
        world = open_world("local", data_dir=str(tmp_path / "world"))
        try:
            step = next(s for s in world.load_steps(turn) if s.kind == "tool")
        finally:
            world.close()
        assert step.status is StepStatus.INTENT, step
