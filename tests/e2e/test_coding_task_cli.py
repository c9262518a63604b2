# ruff: noqa: E501  (the fake model script below keeps one rule per line)
"""The coding task end to end (issue 14) for the four agent CLIs, the short scenario.

Claude Code, Codex, OpenCode and Pi, each in its session's Docker container on the
toolchain image (``--image``), get the user's project (fixtures/buggy_project.py) seeded
from its folder, with the bare remote whose ``post-receive`` hook is the CI (git_ci.py,
here with even the first job held). The scripted model fixes both bugs at once with the
CLI's own shell tool, commits, pushes with ``git_push`` (the CLI's name for the host
tool), waits for the signal ``ci`` and ends. The worker dies right after the push ran
(before its outcome was recorded): the CLI keeps running in its container, and its call
is posted again (Claude Code's, Codex's and OpenCode's by the stdio relay dh-mcp.js, Pi's
by its extension) and answered by the next worker that it may or may not have happened;
the model pushes again and is told it is already pushed. Then it waits, and that worker is SIGKILLed while the turn is
parked. CI reports with no worker alive, and a last worker finishes the turn. The full
scenario (two CI rounds, the container lost) is the built-in agent's: test_coding_task.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from coding_task_support import BRANCH, coding_task_harness, host_git, stop, wait_until
from support import Harness, ids_of

from durable_harness.core.types import StepStatus
from durable_harness.harness.crash import CRASH_EXIT_CODE
from durable_harness.harness.journal import decode_output
from durable_harness.sandbox.docker import DockerSandbox
from durable_harness.worlds import open_world

FINAL = f"CI is green: both bugs are fixed on {BRANCH}."


@dataclass(frozen=True)
class _Cli:
    """What differs between the CLIs here (their wire names: docs/fake-model.md)."""

    tool: str  # the fake model's tool_use naming host tool {name}
    shell: str  # the tool_use of the CLI's shell tool running {command}
    shell_step: str  # the journal's name of that shell tool
    push_seq: int  # the git_push step: launch 0, model 1, shell 2, model 3, git_push 4


# Both fixes at once (no backslash: the command goes through TOML and the CLI's JSON);
# the marker is made by printf, so it is in the conversation only as the tool's output.
_FIX = (
    "sed -i -e 's/prices.:-1./prices/' -e 's/price + price/price - price/' shop/pricing.py"
    " && git -c user.name=agent -c user.email=agent@example.invalid commit -qam 'Fix pricing'"
    " && printf 'COMMIT-%s' DONE"
)
_CLIS = {
    "claude-code": _Cli(
        tool='name = "mcp__durable-harness__{name}"',
        shell=f'name = "Bash", input = {{ command = "{_FIX}", description = "fix and commit" }}',
        shell_step="Bash",
        push_seq=4,
    ),
    "codex": _Cli(
        tool='name = "{name}", namespace = "mcp__durable_harness"',
        shell=f'name = "exec_command", input = {{ cmd = "{_FIX}", yield_time_ms = 30000 }}',
        shell_step="Bash",
        push_seq=4,
    ),
    "opencode": _Cli(
        tool='name = "durable-harness_{name}"',
        shell=f'name = "bash", input = {{ command = "{_FIX}", description = "fix and commit" }}',
        shell_step="bash",
        push_seq=5,  # its title request is model step 1
    ),
    "pi": _Cli(
        tool='name = "{name}"',
        shell=f'name = "bash", input = {{ command = "{_FIX}" }}',
        shell_step="bash",
        push_seq=4,
    ),
}


def _script(cli: str) -> str:
    """The rules key on the conversation (each CLI words its tool results its own way),
    latest stage first: the first match wins."""
    c = _CLIS[cli]
    push = f'{c.tool.format(name="git_push")}, input = {{ branch = "{BRANCH}" }}'
    wait = f'{c.tool.format(name="wait_for_signal")}, input = {{ name = "ci", timeout_seconds = 1800 }}'
    return f"""
[[rule]]
name = "title"
when.system = "You are a title generator"
reply.text = "Fix the shop"

[[rule]]
name = "final"
when.conversation = "arrived:"
reply.text = "{FINAL}"

[[rule]]
name = "wait for ci"
when.conversation = "pushed "
reply.tool_use = [{{ {wait} }}]

[[rule]]
name = "check an interrupted push by pushing again"
when.conversation = "may or may not have taken effect"
reply.tool_use = [{{ {push} }}]

[[rule]]
name = "push"
when.conversation = "COMMIT-DONE"
reply.tool_use = [{{ {push} }}]

[[rule]]
name = "fix both bugs and commit"
when.last_user_text = "Fix the shop"
reply.tool_use = [{{ {c.shell} }}]
"""


@pytest.fixture(params=list(_CLIS))
def task(
    request: pytest.FixtureRequest, docker_host: str, python_image: str, tmp_path: Path
) -> Iterator[Harness]:
    cli: str = request.param
    script = tmp_path / "script.toml"
    script.write_text(_script(cli))
    for h in coding_task_harness(tmp_path, script, python_image, hold_first=True):
        if cli == "codex":
            h.env["OPENAI_BASE_URL"] = h.server.url
            h.env.pop("OPENAI_API_KEY", None)
        h.env["DH_TEST_CLI"] = cli
        yield h


def _steps(h: Harness, turn_id: str) -> str:
    return json.dumps(
        [(s["seq"], s["kind"], s["name"], s["status"]) for s in h.show(turn_id)["steps"]]
    )


@pytest.mark.timeout(900)
def test_cli_fixes_pushes_waits_for_ci_across_crashes(task: Harness, python_image: str) -> None:
    h, project, remote = task, task.tmp / "shop", task.tmp / "remote.git"
    cli = _CLIS[h.env["DH_TEST_CLI"]]
    runs = h.tmp / "ci-runs.txt"
    # The setup phase runs on the CLI's path too, once for the container (three workers).
    setup = "echo ran >> ~/setup-runs.txt"
    h.env["DURABLE_HARNESS_ALLOWED_SETUP_COMMANDS"] = json.dumps([setup])
    queued = h.cli(
        "run", "--detach", "--agent", h.env["DH_TEST_CLI"], "--workspace", "docker",
        "--image", python_image, "--push-remote", str(remote), "--setup", setup,
        "--ci-repo", "github:acme/shop", "Fix the shop",
        cwd=project,
    )  # fmt: skip
    assert queued.returncode == 0, queued.stderr
    assert "workspace seeded from" in queued.stderr, queued.stderr
    ids = ids_of(queued)
    turn_id, session = ids["turn"], ids["session"]

    # 1. The push ran (its CI job is held); the worker dies before its outcome is recorded.
    first = h.cli(
        "worker", "--until-idle", timeout=600, DURABLE_HARNESS_CRASH_AT=f"{cli.push_seq}:after_run"
    )
    assert first.returncode == CRASH_EXIT_CODE, first.stderr + _steps(h, turn_id)
    assert "setup: done" in first.stderr, first.stderr
    (sha,) = runs.read_text().split()

    # 2. The next worker: the CLI is told the push may have happened, pushes again, is told
    # it is already pushed, waits; the turn parks and this worker is SIGKILLed.
    worker = h.popen("worker")
    try:
        with open_world("local", data_dir=h.tmp / "world") as world:
            wait_until(lambda: world.get_turn(turn_id).status.value == "waiting")
    finally:
        stop(worker)
    (h.tmp / "ci-hold").touch()  # CI reports now, with no worker alive
    with open_world("local", data_dir=h.tmp / "world") as world:
        wait_until(lambda: len(world.list_signals(turn_id, "ci")) == 1)

    # 3. A last worker records the wait's outcome, resumes the CLI, which ends.
    last = h.cli("worker", "--until-idle", timeout=600)
    assert last.returncode == 0, last.stderr
    shown = h.show(turn_id)
    assert shown["turn"]["status"] == "done", _steps(h, turn_id)
    assert shown["turn"]["result"] == FINAL, shown["turn"]

    with open_world("local", data_dir=h.tmp / "world") as world:
        tools = [s for s in world.load_steps(turn_id) if s.kind == "tool"]
        names = [s.name for s in tools]
        assert names == [cli.shell_step, "git_push", "git_push", "wait_for_signal"], names
        # The interrupted push is finished possibly_ran by the next worker answering the
        # call posted again; the model's second call is the check.
        assert tools[1].seq == cli.push_seq, _steps(h, turn_id)
        assert tools[1].status is StepStatus.POSSIBLY_RAN, tools[1]
        assert all(s.status is StepStatus.DONE for s in tools if s is not tools[1])
        outputs = [str(decode_output(world, s)) for s in tools]
        assert f"already pushed {sha} to {BRANCH}" in outputs[2], outputs[2]
        assert "success" in outputs[3] and sha in outputs[3], outputs[3]
        (signal,) = world.list_signals(turn_id, "ci")
        assert signal.claimed_by == tools[3].seq

    # The commit was pushed once and CI ran once for it; the remote's branch has the fix.
    assert runs.read_text().split() == [sha]
    with DockerSandbox(session) as box:
        assert box.exec("cat ~/setup-runs.txt").stdout == b"ran\n"
    assert host_git("--git-dir", str(remote), "rev-parse", BRANCH).strip() == sha
    pricing = host_git("--git-dir", str(remote), "show", f"{BRANCH}:shop/pricing.py")
    assert "sum(prices)" in pricing and "price - price * percent" in pricing
    assert h.repeated_requests() == {}
    # The model's next request after the crash carries the notice as the push's result.
    rules = [r["rule"] for r in h.requests() if r["rule"] != "title"]
    after_crash = "check an interrupted push by pushing again"
    assert rules == ["fix both bugs and commit", "push", after_crash, "wait for ci", "final"]

    diff = h.cli("diff", session, cwd=project)
    assert diff.returncode == 0, diff.stderr
    assert "-    return sum(prices[:-1])\n+    return sum(prices)\n" in diff.stdout
    assert "+    return price - price * percent / 100\n" in diff.stdout
