"""What the coding-task tests share (test_coding_task.py for the built-in agent,
test_coding_task_cli.py for the agent CLIs): the user's project with a bare remote whose
``post-receive`` hook is the CI, a real signal-server for its signed webhooks, and the
process helpers the tests stop things with.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from fixtures import buggy_project, git_ci
from support import Harness, make_harness

SECRET = "operator-github-secret"
TOKEN = "ghp_TOKENthatMustStayOnTheHost"
ORIGIN = f"https://x-access-token:{TOKEN}@git.example.invalid/acme/shop.git"
BRANCH = "fix/pricing"


def coding_task_harness(
    tmp_path: Path, script: Path, python_image: str, *, hold_first: bool = False
) -> Iterator[Harness]:
    """A harness whose workers may push to ``tmp_path/remote.git`` (the CI runs there) and
    use ``python_image``; the project is ``tmp_path/shop``, its origin URL holds a token.
    ``hold_first``: even the first push's CI job waits for ``tmp_path/ci-hold``."""
    project, remote = tmp_path / "shop", tmp_path / "remote.git"
    buggy_project.make(project)
    buggy_project.git(project, "remote", "add", "origin", ORIGIN)  # a token in the URL
    buggy_project.git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    buggy_project.git(project, "push", "-q", str(remote), "main")
    with contextlib.ExitStack() as stack:
        for h in make_harness(tmp_path, script, lease="5"):
            h.env["DURABLE_HARNESS_GITHUB_WEBHOOK_SECRET"] = SECRET
            # The workers are other processes: their operator allows this remote and image.
            h.env["DURABLE_HARNESS_ALLOWED_PUSH_REMOTES"] = str(remote)
            h.env["DURABLE_HARNESS_ALLOWED_IMAGES"] = python_image
            server = h.popen("signal-server", "--port", "0")
            stack.callback(stop, server)
            assert server.stdout is not None
            line = server.stdout.readline()
            assert line.startswith("signal server listening on "), line
            runs = tmp_path / "ci-runs.txt"
            config = {
                "signal_url": line.split()[-1],
                "secret": SECRET,
                "repo": "acme/shop",
                "runs": str(runs),
                "python": sys.executable,
                "hold": str(tmp_path / "ci-hold"),
            }
            if hold_first:
                config["hold_first"] = "1"
            git_ci.install(remote, config)
            stack.callback(stop_jobs, runs.with_suffix(".pids"))
            yield h


def stop(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def stop_jobs(pids: Path) -> None:
    for pid in pids.read_text().split() if pids.exists() else []:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pid), signal.SIGKILL)  # a CI job still holding


def wait_until(predicate: Callable[[], bool], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("timed out waiting")


def host_git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout
