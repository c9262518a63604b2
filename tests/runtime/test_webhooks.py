"""CI webhooks on a real ``signal-server`` process: GitHub (HMAC-signed) and GitLab (token)
results routed to the turns that watch the repository's commit or branch.

Each request is posted with httpx2 (the httpx the project uses) as the CI system would
send it; what the World holds afterwards is read back from the World itself.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from durable_harness.core.world import SUPERSEDED, World
from durable_harness.worlds import open_world

GITHUB_SECRET = "gh-secret-of-the-operator"
GITLAB_TOKEN = "gl-token-of-the-operator"
CLI = str(Path(sys.executable).with_name("durable-harness"))


@dataclass
class Server:
    url: str
    world: World
    env: dict[str, str]

    def watch(self, turn: str, repo: str, *ref: str) -> subprocess.CompletedProcess[str]:
        args = [CLI, "watch", turn, repo, *ref]
        return subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=60)

    def github(
        self, event: str, payload: dict[str, Any], delivery: str, secret: str = GITHUB_SECRET
    ) -> httpx.Response:
        body = json.dumps(payload).encode()
        signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        headers = {
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": signature,
            "Content-Type": "application/json",
        }
        return httpx.post(f"{self.url}/v1/webhooks/github", content=body, headers=headers)

    def gitlab(self, payload: dict[str, Any], token: str = GITLAB_TOKEN) -> httpx.Response:
        headers = {"X-Gitlab-Event": "Pipeline Hook", "X-Gitlab-Token": token}
        return httpx.post(f"{self.url}/v1/webhooks/gitlab", json=payload, headers=headers)

    def signals(self, turn: str, name: str = "ci") -> list[dict[str, Any]]:
        return [json.loads(s.payload) for s in self.world.list_signals(turn, name)]


def _start(tmp_path: Path, **secrets: str) -> Iterator[Server]:
    env = {
        **os.environ,
        "DURABLE_HARNESS_WORLD": "local",
        "DURABLE_HARNESS_DATA_DIR": str(tmp_path / "world"),
        **secrets,
    }
    with open_world("local", data_dir=env["DURABLE_HARNESS_DATA_DIR"]) as world:
        world.create_session("s")
        for turn in ("t1", "t2"):
            world.create_turn("s", turn, "prompt", {"signal_secret": f"secret-{turn}"})
        proc = subprocess.Popen(
            [CLI, "signal-server", "--port", "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("signal server listening on "), line
            yield Server(line.split()[-1], world, env)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.communicate(timeout=30)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    secrets = {
        "DURABLE_HARNESS_GITHUB_WEBHOOK_SECRET": GITHUB_SECRET,
        "DURABLE_HARNESS_GITLAB_WEBHOOK_TOKEN": GITLAB_TOKEN,
    }
    yield from _start(tmp_path, **secrets)


def workflow_run(sha: str, conclusion: str, action: str = "completed") -> dict[str, Any]:
    return {
        "action": action,
        "workflow_run": {
            "id": 7,
            "name": "tests",
            "head_sha": sha,
            "head_branch": "fix",
            "status": "completed" if action == "completed" else "in_progress",
            "conclusion": conclusion if action == "completed" else None,
            "html_url": "https://github.com/acme/shop/actions/runs/7",
        },
        "repository": {"full_name": "acme/shop"},
    }


def test_github_results_reach_the_turn_watching_the_commit(server: Server) -> None:
    assert server.watch("t1", "github:acme/shop", "--sha", "aaaa1111" * 5).returncode == 0
    answer = server.github("workflow_run", workflow_run("aaaa1111" * 5, "failure"), "d-1")
    assert answer.status_code == 202 and answer.json() == {"accepted": True}
    assert server.signals("t1") == [
        {
            "provider": "github",
            "event": "workflow_run",
            "repo": "acme/shop",
            "sha": "aaaa1111" * 5,
            "branches": ["fix"],
            "status": "failure",
            "name": "tests",
            "url": "https://github.com/acme/shop/actions/runs/7",
        }
    ]
    # The same delivery again (GitHub retries): ignored.
    assert server.github("workflow_run", workflow_run("aaaa1111" * 5, "failure"), "d-1").is_success
    assert len(server.signals("t1")) == 1
    # A run still going reports no result.
    running = workflow_run("aaaa1111" * 5, "", action="in_progress")
    assert server.github("workflow_run", running, "d-2").status_code == 202
    assert len(server.signals("t1")) == 1
    assert server.signals("t2") == []


def test_a_result_for_an_earlier_push_reaches_no_wait(server: Server) -> None:
    """A late result for A is not delivered once the turn watches B; one delivered
    before (A's second workflow) that no wait took is superseded by the watch of B, so
    the next wait takes B's result, not A's leftover."""
    server.watch("t1", "github:acme/shop", "--sha", "aaaa1111" * 5)
    server.github("workflow_run", workflow_run("aaaa1111" * 5, "failure"), "d-1")
    server.github("workflow_run", workflow_run("aaaa1111" * 5, "failure"), "d-1b")
    server.world.send_signal("t1", "ci", "a person says: looks good", None)  # not a CI result
    assert server.world.claim_signal("t1", "ci", 0, 5)  # the first wait (seq 5) took one
    server.watch("t1", "github:acme/shop", "--sha", "bbbb2222" * 5)  # the agent pushed again
    assert server.github("workflow_run", workflow_run("aaaa1111" * 5, "success"), "d-2").is_success
    assert len(server.world.list_signals("t1", "ci")) == 3  # the late one was not delivered
    server.github("workflow_run", workflow_run("bbbb2222" * 5, "success"), "d-3")
    signals = server.world.list_signals("t1", "ci")
    assert [s.claimed_by for s in signals] == [5, SUPERSEDED, None, None]
    assert json.loads(signals[3].payload)["sha"] == "bbbb2222" * 5


def test_check_suite_and_status_events_by_branch(server: Server) -> None:
    assert server.watch("t2", "github:Acme/Shop", "--branch", "main").returncode == 0
    suite = {
        "action": "completed",
        "check_suite": {
            "head_sha": "cccc3333" * 5,
            "head_branch": "main",
            "status": "completed",
            "conclusion": "success",
            "app": {"name": "GitHub Actions"},
            "url": "https://api.github.com/repos/acme/shop/check-suites/5",
        },
        "repository": {"full_name": "acme/shop"},  # names are case-insensitive
    }
    assert server.github("check_suite", suite, "d-1").status_code == 202
    status = {
        "sha": "dddd4444" * 5,
        "state": "failure",
        "context": "ci/jenkins",
        "target_url": "https://ci.example/42",
        "branches": [{"name": "main"}, {"name": "release"}],
        "repository": {"full_name": "acme/shop"},
    }
    assert server.github("status", status, "d-2").status_code == 202
    assert server.github("status", {**status, "state": "pending"}, "d-3").status_code == 202
    assert [(s["event"], s["sha"], s["status"]) for s in server.signals("t2")] == [
        ("check_suite", "cccc3333" * 5, "success"),
        ("status", "dddd4444" * 5, "failure"),
    ]
    assert server.github("ping", {"zen": "hi", "repository": {"full_name": "x/y"}}, "p").is_success


def test_a_forks_run_reaches_no_branch_watch_and_a_ping_is_accepted(server: Server) -> None:
    """A fork's pull request names its own branch (its ``main`` is the fork author's):
    its result reaches a commit watch only, never a watch on this repository's branch.
    A ping, which names no repository, is accepted and ignored."""
    assert server.watch("t2", "github:acme/shop", "--branch", "fix").returncode == 0
    fork = workflow_run("eeee5555" * 5, "success")
    fork["workflow_run"]["head_repository"] = {"full_name": "mallory/shop"}
    assert server.github("workflow_run", fork, "d-fork").status_code == 202
    assert server.signals("t2") == []
    ours = workflow_run("ffff9999" * 5, "failure")
    ours["workflow_run"]["head_repository"] = {"full_name": "acme/shop"}
    assert server.github("workflow_run", ours, "d-ours").status_code == 202
    assert [s["sha"] for s in server.signals("t2")] == ["ffff9999" * 5]
    assert server.github("ping", {"zen": "Keep it logically awesome."}, "d-p").status_code == 202
    # A short commit id would match no result (they name the full one): refused up front.
    assert server.watch("t1", "github:acme/shop", "--sha", "3f2c1e9").returncode != 0


def test_a_bad_signature_records_nothing(server: Server) -> None:
    server.watch("t1", "github:acme/shop", "--sha", "aaaa1111" * 5)
    payload = workflow_run("aaaa1111" * 5, "failure")
    assert server.github("workflow_run", payload, "d-1", secret="guess").status_code == 401
    unsigned = httpx.post(
        f"{server.url}/v1/webhooks/github",
        content=json.dumps(payload).encode(),
        headers={"X-GitHub-Event": "workflow_run"},
    )
    assert unsigned.status_code == 401
    # Authenticated before it is parsed: a body that is not even JSON is refused as unsigned.
    garbage = httpx.post(f"{server.url}/v1/webhooks/github", content=b"\xff{not json")
    assert garbage.status_code == 401
    assert server.gitlab({"object_kind": "pipeline"}, token="guess").status_code == 401
    assert server.signals("t1") == []


def test_unknown_repository_or_commit_is_accepted_and_ignored(server: Server) -> None:
    server.watch("t1", "github:acme/shop", "--sha", "aaaa1111" * 5)
    for repo, sha in (("acme/other", "aaaa1111" * 5), ("acme/shop", "ffff9999" * 5)):
        payload = workflow_run(sha, "success")
        payload["repository"]["full_name"] = repo
        answer = server.github("workflow_run", payload, f"d-{repo}-{sha}")
        assert answer.status_code == 202 and answer.json() == {"accepted": True}
        assert "t1" not in answer.text
    assert server.signals("t1") == []


def test_gitlab_pipeline_events(server: Server) -> None:
    assert server.watch("t1", "gitlab:group/sub/app", "--branch", "fix").returncode == 0

    def pipeline(status: str, pid: int) -> dict[str, Any]:
        return {
            "object_kind": "pipeline",
            "object_attributes": {
                "id": pid,
                "ref": "fix",
                "tag": False,
                "sha": "eeee5555" * 5,
                "status": status,
                "url": f"https://gitlab.example/group/sub/app/-/pipelines/{pid}",
            },
            "project": {"path_with_namespace": "group/sub/app"},
        }

    assert server.gitlab(pipeline("running", 1)).status_code == 202
    assert server.gitlab(pipeline("failed", 1)).status_code == 202
    assert server.gitlab(pipeline("failed", 1)).status_code == 202  # the same, again
    assert server.gitlab(pipeline("success", 2)).status_code == 202
    assert [(s["provider"], s["status"]) for s in server.signals("t1")] == [
        ("gitlab", "failed"),
        ("gitlab", "success"),
    ]
    assert server.gitlab({"object_kind": "pipeline"}).status_code == 400  # lacks fields


def test_limits_and_bad_input(server: Server) -> None:
    big = httpx.post(f"{server.url}/v1/webhooks/github", content=b"x" * (2 * 1024 * 1024))
    assert big.status_code == 413
    assert server.watch("t1", "gitlab:nogroup", "--branch", "x").returncode != 0
    assert server.watch("t1", "github:a/b", "--sha", "not-hex").returncode != 0
    assert server.watch("nope", "github:a/b", "--sha", "abcdef12" * 5).returncode != 0
    # The generic endpoint: an Idempotency-Key makes a retried POST one signal.
    url = f"{server.url}/v1/turns/t2/signals/ci"
    headers = {"Authorization": "Bearer secret-t2", "Idempotency-Key": "job-1"}
    assert httpx.post(url, json={"n": 1}, headers=headers).status_code == 200
    assert httpx.post(url, json={"n": 2}, headers=headers).status_code == 208
    assert server.signals("t2") == [{"n": 1}]


def test_an_unconfigured_provider_is_not_served(tmp_path: Path) -> None:
    for server in _start(tmp_path):  # no secrets set
        server.watch("t1", "github:acme/shop", "--sha", "aaaa1111" * 5)
        answer = server.github("workflow_run", workflow_run("aaaa1111" * 5, "failure"), "d-1")
        assert answer.status_code == 404
        assert server.gitlab({"object_kind": "pipeline"}).status_code == 404
        assert server.signals("t1") == []
