"""What the end-to-end tests share: a real fake-model server and the real CLI run in
subprocesses against one World folder.

Imported as ``support`` (``tests/`` is on sys.path through its conftest); kept out of
conftest.py because several conftest modules would shadow one another by name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from durable_harness.testing.fake_model import FakeModelServer

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "durable_harness" / "testing" / "demo"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: The tests' operator policy over stored turns (runtime/admission.py): the tools files
#: the tests' turns name, the safe_bash patterns of their agent configs.
TOOL_FILES = json.dumps(sorted(str(p) for p in [DEMO / "tools.py", *FIXTURES.glob("*_tools.py")]))
SAFE_BASH = json.dumps(["cat *", "ls", "ls *"])


def operator_policy(workspace_root: Path) -> dict[str, str]:
    """The environment that lets the tests' workers run the turns the tests enqueue (a
    worker in another process than ``run`` follows its operator's policy, not the turn)."""
    return {
        "DURABLE_HARNESS_TOOL_SETS": TOOL_FILES,
        "DURABLE_HARNESS_SAFE_BASH": SAFE_BASH,
        "DURABLE_HARNESS_WORKSPACE_ROOTS": str(workspace_root),
    }


@dataclass
class Harness:
    """One World folder, one fake model, and the CLI run as real processes."""

    tmp: Path
    server: FakeModelServer
    log: Path
    env: dict[str, str] = field(default_factory=dict)

    def use_postgres(self, url: str) -> Harness:
        """Point the harness's processes at the PostgreSQL database ``url`` (instead of
        the local World folder)."""
        self.env["DURABLE_HARNESS_WORLD"] = "postgres"
        self.env["DURABLE_HARNESS_POSTGRES_URL"] = url
        self.env.pop("DURABLE_HARNESS_DATA_DIR", None)
        return self

    @property
    def ledger(self) -> Path:
        return self.tmp / "ledger.txt"

    def ledger_lines(self) -> list[str]:
        return self.ledger.read_text().splitlines() if self.ledger.exists() else []

    def cli(
        self, *args: str, timeout: float = 120, cwd: Path | None = None, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "durable_harness.cli", *args],
            cwd=cwd,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def popen(self, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "durable_harness.cli", *args],
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group, killed as a group
        )

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def repeated_requests(self) -> dict[str, int]:
        counts = Counter(r["request_hash"] for r in self.requests())
        return {h: n for h, n in counts.items() if n > 1}

    def show(self, turn_id: str) -> dict[str, Any]:
        out = self.cli("show", turn_id, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)  # type: ignore[no-any-return]


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll ``predicate`` every 0.05 s until it returns something true, and return that;
    AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def ids_of(out: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in out.stdout.splitlines()[:2] if " " in line)


def make_harness(tmp: Path, script: Path, lease: str = "2") -> Iterator[Harness]:
    # 2 s, not 1: a 1 s lease was fenced under CI's load (a local World's renewal, an
    # fsync, or an S3 request starved for 0.9 s). A dead holder is taken over at once on
    # the local and PostgreSQL Worlds whatever the lease.
    log = tmp / "fake-model.jsonl"
    with FakeModelServer(script, log_path=log) as server:
        server.start()
        env = {
            **os.environ,
            "ANTHROPIC_BASE_URL": server.url,
            "DURABLE_HARNESS_WORLD": "local",
            "DURABLE_HARNESS_DATA_DIR": str(tmp / "world"),
            "DURABLE_HARNESS_LEASE_SECONDS": lease,
            "DURABLE_HARNESS_POLL_SECONDS": "0.1",
            "DURABLE_HARNESS_DEMO_LEDGER": str(tmp / "ledger.txt"),
            **operator_policy(tmp),
        }
        yield Harness(tmp, server, log, env)


DEMO_TOOLS = f"{DEMO / 'tools.py'}:TOOLS"
DEMO_PROMPT = "Refund order 42, then note the refund in refunds.md."
DEMO_REPLY = "Refunded order 42 once and noted it in refunds.md."


@dataclass
class Serve:
    proc: subprocess.Popen[str]
    url: str

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def http(self, token: str | None = None) -> httpx2.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx2.Client(base_url=self.url, headers=headers, timeout=30)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=15)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


#: Every `serve` a test started (tests/server/conftest.py kills the ones a failing test
#: left running).
STARTED_SERVES: list[subprocess.Popen[str]] = []


def start_serve(h: Harness, port: int = 0, **env: str) -> Serve:
    """`durable-harness serve` as a real subprocess of the harness, once it listens."""
    proc = h.popen("serve", "--port", str(port), **env)
    STARTED_SERVES.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on " not in line:
        proc.kill()
        _out, err = proc.communicate(timeout=10)
        raise AssertionError(f"serve did not start: {line!r} {err}")
    return Serve(proc, line.split("listening on ", 1)[1].split(" ", 1)[0])
