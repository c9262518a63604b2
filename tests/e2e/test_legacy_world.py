"""Stored turns journaled by old code resume with today's code, paying for nothing twice.

``tests/fixtures/legacy_e4dc768/world/`` is a local World made once by the code of commit
e4dc768 and never regenerated (its README.md): one interrupted turn per agent (builtin
on the virtual workspace; Claude Code, Codex, OpenCode and Pi in the Docker sandbox),
each killed by crash injection after some model calls finished and after the ``never``
host tool ``notify`` ran (``turns.json`` says where). Each test copies that World,
starts the scripted fake model with the turn's stored script and finishes the turn with
the public CLI (``durable-harness resume --force``), then checks:

* the turn ends ``done`` with the scripted final reply;
* 0 repeated model calls: no request the fake model receives is one whose outcome the
  old journal holds (by the proxy's journal key, as the kill matrix counts, and by the
  fake model's request hash against its log from when the fixture was made), and every
  upstream call is one attempt of one journal step;
* ``notify`` ran exactly once overall: its ledger is the one saved with the fixture, and
  no tool step journaled before the crash was run again; in Docker, the CLI's shell
  command's effect, restored from the World's snapshot into a new container, is there once;
* ``durable-harness replay`` of the finished turn makes 0 upstream calls.

Only the CLI, the documented container label and the World folder are used, so this
survives refactors of the package. The one thing done to the World before the new code
opens it: the turns' ``--tools`` spec (made absolute by ``run``) holds the placeholder
``@LEGACY_FIXTURE@``, replaced here by this checkout's fixture folder (:func:`copy_world`).
``--force`` because the dead worker's lease may look unexpired on a machine whose clock
is behind the one that made the fixture.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "legacy_e4dc768"
MANIFEST = json.loads((FIXTURE / "turns.json").read_text())
TURNS = {t["agent"]: t for t in MANIFEST["turns"]}
LEDGER = (FIXTURE / "notify-ledger.txt").read_text()
#: Files the CLI's shell commands made in the workspace (each ``never``: one line per run).
EFFECTS = {"codex": ("bash_runs.txt", "write_runs.txt")}
SITE = {"site/index.html": "PRICING-42\n", "site/pricing.html": "<h1>Pricing</h1>\n"}


def _command() -> list[str]:
    """The public ``durable-harness`` command of this environment."""
    script = Path(sys.executable).with_name("durable-harness")
    if script.exists():
        return [str(script)]
    found = shutil.which("durable-harness")
    return [found] if found else [sys.executable, "-m", "durable_harness.cli"]


DH = _command()


def copy_world(dest: Path) -> Path:
    """The fixture's World copied to ``dest``, its ``--tools`` placeholder pointed at this
    checkout's fixture folder (``tools.py`` is loaded from there)."""
    shutil.copytree(FIXTURE / "world", dest)
    conn = sqlite3.connect(dest / "world.sqlite3")
    try:
        conn.execute(
            "UPDATE turns SET config = replace(config, ?, ?)",
            (MANIFEST["placeholder"], str(FIXTURE)),
        )
        conn.commit()
    finally:
        conn.close()
    return dest


class FakeModel:
    """``durable-harness fake-model`` as a subprocess, with its request log."""

    def __init__(self, script: Path, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [*DH, "fake-model", "--script", str(script), "--port", "0", "--log", str(log)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = re.search(r"listening on (http://\S+)", line)
        if found is None:
            self.stop()
            pytest.fail(f"the fake model did not start: {line!r}")
        self.url = found.group(1)

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class Run:
    """The copied World, the fake model and the CLI pointed at both."""

    def __init__(self, tmp: Path, agent: str) -> None:
        self.turn = TURNS[agent]
        self.ledger = tmp / "notify-ledger.txt"
        self.ledger.write_text(LEDGER)
        world = copy_world(tmp / "world")
        self.model = FakeModel(FIXTURE / "scripts" / f"{agent}.toml", tmp / "fake-model.jsonl")
        # The sandbox's run folder (the proxy's socket) is named after the session, which
        # is fixed: a private root keeps two runs of this test from sharing it.
        self.run_dir = tempfile.mkdtemp(prefix="dh-legacy-", dir="/tmp")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_HARNESS_")}
        for key in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
            env.pop(key, None)
        self.env = {
            **env,
            "DURABLE_HARNESS_WORLD": "local",
            "DURABLE_HARNESS_DATA_DIR": str(world),
            "DURABLE_HARNESS_POLL_SECONDS": "0.1",
            "DURABLE_HARNESS_DOCKER_RUN_DIR": self.run_dir,
            "ANTHROPIC_BASE_URL": self.model.url,
            "OPENAI_BASE_URL": self.model.url,
            "LEGACY_NOTIFY_LEDGER": str(self.ledger),
            # The worker's operator registers the tools file the old turns name by path,
            # and allows the safe_bash patterns of their agent config (runtime/admission.py).
            "DURABLE_HARNESS_TOOL_SETS": str(FIXTURE / "tools.py"),
            "DURABLE_HARNESS_SAFE_BASH": json.dumps(["cat *", "ls", "ls *"]),
        }

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*DH, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def show(self) -> dict[str, Any]:
        out = self.cli("show", self.turn["turn"], "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.model.stop()
        if self.turn["workspace"] == "docker":
            self.cli("sandbox", "rm", self.turn["session"])
        shutil.rmtree(self.run_dir, ignore_errors=True)


def container_text(session: str, path: str) -> str | None:
    """A file of the session's container (found by its documented label), or None."""
    import docker

    client = docker.DockerClient(base_url=os.environ["DOCKER_HOST"], timeout=60)
    try:
        label = f"durable-harness.session={session}"
        [container] = client.containers.list(filters={"label": label})
        code, out = container.exec_run(["cat", path], user="1000:1000")
        return out.decode() if code == 0 else None
    finally:
        client.close()


def dump(show: dict[str, Any]) -> str:
    return json.dumps(show, indent=1)


@pytest.fixture(params=list(TURNS))
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Run]:
    if TURNS[request.param]["workspace"] == "docker":
        request.getfixturevalue("docker_host")
    r = Run(tmp_path, request.param)
    try:
        yield r
    finally:
        r.close()


@pytest.mark.timeout(600)
def test_legacy_turn_resumes(run: Run) -> None:
    turn = run.turn
    turn_id, final = turn["turn"], turn["final"]
    done_before = set(turn["done_model_keys"])
    assert done_before  # the fixture's point: model calls finished before the crash

    # Today's code reads the old journal as it was left: the same steps, unfinished.
    before = run.show()
    assert before["turn"]["status"] not in ("done", "failed"), dump(before)
    steps_before = {s["key"]: s for s in before["steps"]}
    for key in done_before:
        assert steps_before[key]["status"] == "done", dump(before)

    resumed = run.cli("resume", "--force", turn_id, timeout=540)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip().splitlines()[-1] == final, resumed.stderr
    after = run.show()
    assert after["turn"]["status"] == "done", dump(after)
    assert after["turn"]["result"] == final

    # 0 repeated model calls: nothing finished before the crash went upstream again ...
    upstream = run.model.requests()
    assert upstream, "the resume made no model call: the fixture's turns end with one"
    keys = [str(r.get("request_key")) for r in upstream]
    if turn["agent"] != "builtin":  # the built-in agent calls the model without the proxy
        assert [k for k in keys if k in done_before] == [], dump(after)
        # ... and every upstream call is one attempt of one journal step.
        attempts_before = {k: s["attempts"] for k, s in steps_before.items()}
        attempts = {
            s["key"]: s["attempts"] - attempts_before.get(s["key"], 0)
            for s in after["steps"]
            if s["kind"] == "model"
        }
        assert dict(Counter(keys)) == {k: n for k, n in attempts.items() if n}, dump(after)
    made = FIXTURE / "requests" / f"{turn['agent']}.jsonl"
    answered = {json.loads(line)["request_hash"] for line in made.read_text().splitlines()}
    assert [r["rule"] for r in upstream if r["request_hash"] in answered] == []
    model_steps = [s for s in after["steps"] if s["kind"] == "model"]
    live = [s for s in model_steps if s["key"] not in done_before]
    assert len(upstream) == sum(
        s["attempts"] - (steps_before[s["key"]]["attempts"] if s["key"] in steps_before else 0)
        for s in live
    ), dump(after)
    assert upstream[-1]["rule"] == "final"

    # The never host tool ran once overall, and no tool step of the crashed delivery ran
    # again (each is as the old journal left it).
    assert run.ledger.read_text() == LEDGER
    assert sum(line.startswith(f"{turn_id}:") for line in LEDGER.splitlines()) == 1
    for s in after["steps"]:
        old = steps_before.get(s["key"])
        if s["kind"] == "tool" and old is not None:
            assert (s["status"], s["attempts"]) == (old["status"], old["attempts"]), dump(after)
    assert [s["status"] for s in after["steps"] if s["name"] == "notify"] == ["done"]

    if turn["workspace"] == "docker":
        # The container was gone: a new one got the workspace back from the World's
        # snapshot, with the shell command's effect made once, not made again.
        for name in EFFECTS.get(turn["agent"], ("bash_runs.txt",)):
            assert container_text(turn["session"], f"/workspace/{name}") == "ran\n", name
        for path, text in SITE.items():
            assert container_text(turn["session"], f"/workspace/{path}") == text, path

    # A replay of the finished turn: the same reply, 0 upstream calls, no tool run.
    calls = len(run.model.requests())
    replay = run.cli("replay", turn_id, timeout=300)
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.strip() == final
    assert len(run.model.requests()) == calls
    assert run.ledger.read_text() == LEDGER

    print(
        "\nLEGACY-WORLD "
        + json.dumps(
            {
                "agent": turn["agent"],
                "crash_at": turn["crash_at"],
                "upstream calls after the crash": [r["rule"] for r in upstream],
                "steps": " ".join(f"{s['kind']}:{s['name']}:{s['status']}" for s in after["steps"]),
            }
        )
    )
