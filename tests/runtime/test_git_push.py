"""``git_push``: the sandbox's commits pushed from the host, credentials never inside.

The remote is a bare repository on the host, reached through the worker's own git config
(an ``insteadOf`` rule whose target holds the "secret"); its ``pre-receive`` hook logs every
ref update it is offered and refuses the branch ``protected``. The built-in agent runs in
the session's Docker container against the scripted fake model, which commits with bash
and then pushes: the same SHA twice, a non-fast-forward, the protected branch. Pi pushes
to the same kind of remote served over HTTP (``git_http.py``), which answers only with the
token the worker's credential helper prints.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from git_http import GitHttpServer
from support import Harness, ids_of, make_harness

from durable_harness.adapters.push_tool import GitPushArgs, git_push_tool
from durable_harness.core.errors import RepositoryError
from durable_harness.core.settings import Settings
from durable_harness.core.types import StepStatus
from durable_harness.harness.crash import CRASH_EXIT_CODE
from durable_harness.harness.journal import decode_output
from durable_harness.harness.tools import ToolContext
from durable_harness.sandbox.docker import DockerSandbox
from durable_harness.worlds import open_world

SECRET = "s3cr3t-push-token-7f1d"  # stands for a token in the worker's insteadOf URL
PUBLIC = "https://git.example.invalid/team/"  # what the turn stores and the model sees
REMOTE_URL = PUBLIC + "app.git"
PROMPT = "commit the change and push it"
COMMIT = (
    "cd /workspace && git init -q -b work && printf 'v1\\n' > app.txt && git add app.txt && "
    "git -c user.name=agent -c user.email=agent@example.invalid commit -q -m one && "
    "git rev-parse HEAD"
)
PRE_RECEIVE = """#!/bin/sh
while read old new ref; do
  echo "$ref $new" >> {log}
  if [ "$ref" = refs/heads/protected ]; then echo "protected is protected" >&2; exit 1; fi
done
"""


def _push(branch: str) -> str:
    return f'{{ name = "git_push", input = {{ branch = "{branch}" }} }}'


SCRIPT = f"""
[[rule]]
name = "check after an interrupted push"
when.last_tool_name = "git_push"
when.last_tool_result = "may or may not have taken effect"
reply.tool_use = [{_push("feature")}]

[[rule]]
name = "done"
when.last_tool_name = "git_push"
when.last_tool_result = "rejected"
when.conversation = '"branch": "protected"'
reply.text = "Pushed feature once; main and protected refused."

[[rule]]
name = "protected"
when.last_tool_name = "git_push"
when.last_tool_result = "rejected"
reply.tool_use = [{_push("protected")}]

[[rule]]
name = "non-fast-forward"
when.last_tool_name = "git_push"
when.last_tool_result = "already pushed"
reply.tool_use = [{_push("main")}]

[[rule]]
name = "again"
when.last_tool_name = "git_push"
when.last_tool_result = "pushed "
reply.tool_use = [{_push("feature")}]

[[rule]]
name = "push"
when.last_tool_name = "bash"
reply.tool_use = [{_push("feature")}]

[[rule]]
name = "start"
when.last_user_text = "{PROMPT}"
reply.tool_use = [{{ name = "bash", input = {{ command = "{COMMIT}" }} }}]
"""
SAY_DONE = "printf 'COMMIT-%s' DONE"  # the marker is in the result, not in the command
#: Pi calls host tools by their own names; each rule keys on what the conversation holds.
PI_SCRIPT = f"""
[[rule]]
name = "final"
when.conversation = "pushed "
reply.text = "PUSHED-OK"

[[rule]]
name = "push"
when.conversation = "COMMIT-DONE"
reply.tool_use = [{_push("feature")}]

[[rule]]
name = "commit"
reply.tool_use = [{{ name = "bash", input = {{ command = "{COMMIT} && {SAY_DONE}" }} }}]
"""
PUSH_SEQ = 3  # model 0, bash 1, model 2, the first git_push 3


def _git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def h(docker_host: str, tmp_path: Path) -> Iterator[Harness]:
    yield from _harness(tmp_path, SCRIPT)


@pytest.fixture
def plain(tmp_path: Path) -> Iterator[Harness]:
    yield from _harness(tmp_path, SCRIPT)


def _harness(tmp_path: Path, text: str) -> Iterator[Harness]:
    script = tmp_path / "script.toml"
    script.write_text(text)
    hidden = tmp_path / SECRET
    _make_remote(hidden / "app.git", tmp_path)
    config = tmp_path / "xdg" / "git" / "config"
    config.parent.mkdir(parents=True)
    config.write_text(f'[url "{hidden}/"]\n\tinsteadOf = {PUBLIC}\n')
    for harness in make_harness(tmp_path, script):
        # The worker's git config: where the operator's credentials live.
        harness.env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
        harness.env["DURABLE_HARNESS_ALLOWED_PUSH_REMOTES"] = REMOTE_URL
        yield harness


def _make_remote(remote: Path, tmp_path: Path) -> None:
    """A bare remote whose hook logs each offered ref update and refuses ``protected``,
    and whose main has history the sandbox never saw."""
    _git("init", "-q", "--bare", "-b", "main", str(remote))
    hook = remote / "hooks" / "pre-receive"
    hook.write_text(PRE_RECEIVE.format(log=tmp_path / "pushes.log"))
    hook.chmod(0o755)
    # The remote's main has history the sandbox never saw: pushing there is not a fast-forward.
    seed = tmp_path / "seed"
    _git("init", "-q", "-b", "main", str(seed))
    _git("-c", "user.name=x", "-c", "user.email=x@x", "commit", "-q", "--allow-empty",
         "-m", "base", cwd=seed)  # fmt: skip
    _git("push", "-q", str(remote), "main", cwd=seed)
    (tmp_path / "pushes.log").unlink()  # the seed's own push is not the agent's


def _pushes(h: Harness) -> list[str]:
    log = h.tmp / "pushes.log"
    return log.read_text().splitlines() if log.exists() else []


def _push_results(h: Harness, turn_id: str) -> list[str]:
    """What each finished git_push step returned, in order."""
    with open_world("local", data_dir=h.tmp / "world") as world:
        return [
            str(decode_output(world, step)["content"])
            for step in world.load_steps(turn_id)
            if step.name == "git_push" and step.status is StepStatus.DONE
        ]


def _assert_secret_stayed_out(h: Harness, session: str, secret: str = SECRET) -> None:
    with DockerSandbox(session) as box:
        try:
            # Everywhere a running container's files can change (the image is fixed); a
            # planted copy in /tmp shows the search finds what is there.
            where = "/workspace /home /tmp /run /etc /var /dev/shm"
            # (The secret is put together in the shell: the command's own file holds it split.)
            half = len(secret) // 2
            found = box.bash(
                f's={secret[:half]}; s=${{s}}{secret[half:]}; printf %s "$s" > /tmp/planted; '
                f'grep -rl -- "$s" {where} 2>/dev/null; rm -f /tmp/planted'
            )
            assert found.stdout.split() == ["/tmp/planted"], found
            environ = box.bash("env; cat /proc/1/environ | tr '\\0' '\\n'")
            assert "PATH=" in environ.stdout and secret not in environ.stdout
            assert secret not in str(box.client.api.inspect_container(box.container_id()))
        finally:
            box.remove()
    world = h.tmp / "world"
    for path in world.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_push_twice_then_refused_twice(h: Harness) -> None:
    out = h.cli("run", "--workspace", "docker", "--push-remote", REMOTE_URL, PROMPT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "Pushed feature once; main and protected refused."
    ids = ids_of(out)
    sha = _git("rev-parse", "feature", cwd=h.tmp / SECRET / "app.git")
    # One push reached the remote's feature branch; main was refused before sending
    # (not a fast-forward), protected by the remote's hook.
    assert _pushes(h) == [f"refs/heads/feature {sha}", f"refs/heads/protected {sha}"]
    texts = _push_results(h, ids["turn"])
    assert texts[0] == f"pushed {sha} to feature"
    assert texts[1] == f"already pushed {sha} to feature (nothing to do)"
    assert "rejected" in texts[2] and "main" in texts[2]
    assert "rejected" in texts[3] and "pre-receive hook declined" in texts[3]
    assert "protected is protected" in texts[3]
    _assert_secret_stayed_out(h, ids["session"])


def test_killed_during_the_push_then_checked_not_repeated(h: Harness) -> None:
    crashed = h.cli(
        "run", "--workspace", "docker", "--push-remote", REMOTE_URL, PROMPT,
        DURABLE_HARNESS_CRASH_AT=f"{PUSH_SEQ}:after_run",
    )  # fmt: skip
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    ids = ids_of(crashed)
    assert len(_pushes(h)) == 1  # the push happened; its outcome was never recorded
    # Another process resumes: only the operator's setting lets it push there.
    resumed = h.cli("resume", ids["turn"])
    assert resumed.returncode == 0, resumed.stderr
    steps = h.show(ids["turn"])["steps"]
    assert steps[PUSH_SEQ]["status"] == "possibly_ran"
    texts = _push_results(h, ids["turn"])
    sha = _git("rev-parse", "feature", cwd=h.tmp / SECRET / "app.git")
    assert texts[0] == f"already pushed {sha} to feature (nothing to do)"
    assert [line for line in _pushes(h) if "feature" in line] == [f"refs/heads/feature {sha}"]
    assert h.repeated_requests() == {}
    _assert_secret_stayed_out(h, ids["session"])


def test_a_branch_outside_the_operators_patterns_is_refused_untouched() -> None:
    # DURABLE_HARNESS_PUSH_BRANCHES: refused before the sandbox is opened or git runs.
    def no_sandbox() -> Any:
        raise AssertionError("the sandbox was opened for a refused branch")

    tool = git_push_tool("/nowhere.git", no_sandbox, 1 << 20, branches=("dh/*", "fix/*"))
    ctx = ToolContext(turn_id="turn_x", session_id="ses_x", seq=3)
    for branch in ("main", "dh", "release/dh/x", "DH/x"):
        with pytest.raises(RepositoryError) as info:
            tool.fn(GitPushArgs(branch=branch), ctx)
        assert f"branch {branch!r} is not one this worker pushes to" in str(info.value)
        assert "(allowed: dh/*, fix/*; the operator's DURABLE_HARNESS_PUSH_BRANCHES)" in str(
            info.value
        )
    with pytest.raises(AssertionError, match="sandbox was opened"):
        tool.fn(GitPushArgs(branch="dh/ses_1/fix"), ctx)  # "*" crosses "/"
    assert Settings().push_branches == ("*",)


def test_bad_push_remote_is_one_line_and_nothing_recorded(plain: Harness) -> None:
    h = plain
    for remote, says in [
        (str(h.tmp / "missing.git"), "cannot be read"),
        ("https://x-token:abc123@git.example.invalid/app.git", "carries credentials"),
    ]:
        out = h.cli("run", "--push-remote", remote, PROMPT)
        assert out.returncode == 2, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and "abc123" not in lines[0], lines
    listed = h.cli("ls", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) in ([], {}), listed.stdout
    assert h.requests() == []


def test_pi_pushes_through_its_own_host_tool_path(docker_host: str, tmp_path: Path) -> None:
    """A CLI agent reaches git_push as one of its host tools (Pi's extension, the MCP
    bridge), the bundle made in its session's container all the same; the remote is on
    HTTP and answers only with the token the worker's credential helper prints."""
    token = "tok-9c2e-from-the-helper"
    _make_remote(tmp_path / "served" / "app.git", tmp_path)
    config = tmp_path / "xdg" / "git" / "config"
    config.parent.mkdir(parents=True)
    config.write_text(
        f'[credential]\n\thelper = "!f() {{ echo username=ci; echo password={token}; }}; f"\n'
    )
    script = tmp_path / "script.toml"
    script.write_text(PI_SCRIPT)
    with GitHttpServer(tmp_path / "served", "ci", token) as server:
        remote = f"{server.url}/app.git"
        for h in make_harness(tmp_path, script):
            h.env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
            out = h.cli("run", "--agent", "pi", "--push-remote", remote, PROMPT)
            assert out.returncode == 0, out.stderr
            assert out.stdout.strip().splitlines()[-1] == "PUSHED-OK"
            ids = ids_of(out)
            sha = _git("rev-parse", "feature", cwd=tmp_path / "served" / "app.git")
            assert _pushes(h) == [f"refs/heads/feature {sha}"]
            assert _push_results(h, ids["turn"]) == [f"pushed {sha} to feature"]
            assert server.asked_without > 0  # the token came from the helper, on request
            _assert_secret_stayed_out(h, ids["session"], token)
