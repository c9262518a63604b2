"""Every process started for an agent gets the allow-listed environment of
sandbox/agent_user.py, never the worker's: read in the code (no spawn under adapters/ or
sandbox/ passes ``os.environ`` on, each names its ``env``) and seen from inside (the local
shell's and a CLI version check's variables, with a canary in the worker's)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support import DEMO, make_harness

from durable_harness.adapters.cli.host import HostCliHost
from durable_harness.sandbox.agent_user import PASSED_ENV, agent_user
from durable_harness.sandbox.local import LocalSandbox

PACKAGE = Path(__file__).resolve().parents[2] / "durable_harness"
SPAWNED_FROM = ("adapters", "sandbox")
SPAWNS = {"run", "Popen", "call", "check_call", "check_output", "spawn", "execv", "execve"}
#: Spawns that may inherit their environment, and why.
INHERITS = {
    # Its own environment is already the launch's (agent_env): it passes it on.
    "adapters/cli/reaper.py",
    # Execs the command in its own place, with the environment it was given (agent_env).
    "sandbox/become.py",
    # Builds the Docker image on the operator's side (docker, npm): no agent code runs.
    "sandbox/docker_image.py",
}
#: What agent_env sets besides PASSED_ENV, and what the local shell adds or bash itself sets.
OWN = {"HOME", "USER", "LOGNAME", "SHELL", "XDG_CONFIG_HOME", "XDG_DATA_HOME"}
OWN |= {"XDG_CACHE_HOME", "XDG_STATE_HOME", "PS1", "PS2", "TERM", "PAGER", "GIT_PAGER"}
OWN |= {"GIT_TERMINAL_PROMPT", "HISTFILE", "PWD", "SHLVL", "OLDPWD", "_", "DISABLE_AUTOUPDATER"}
CANARY = "sk-test-canary-env"


def _sources() -> list[Path]:
    return [p for d in SPAWNED_FROM for p in sorted((PACKAGE / d).rglob("*.py"))]


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def _problems(source: str, rel: str) -> tuple[int, list[str]]:
    """(the spawns found, what is wrong) in one module's source."""
    problems: list[str] = []
    spawns = 0
    for node in ast.walk(ast.parse(source, rel)):
        if isinstance(node, ast.Dict) and any(
            k is None and _is_environ(v) for k, v in zip(node.keys, node.values, strict=True)
        ):
            problems.append(f"{rel}:{node.lineno}: {{**os.environ}}")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        # os.environ copied wholesale: dict(os.environ), os.environ.copy()
        receiver = func.value if isinstance(func, ast.Attribute) else None
        if name in ("dict", "copy") and any(_is_environ(a) for a in [*node.args, receiver]):
            problems.append(f"{rel}:{node.lineno}: copies os.environ")
        module = getattr(receiver, "id", None)
        if name not in SPAWNS or module not in ("subprocess", "pexpect", "os"):
            continue
        spawns += 1
        env = next((k.value for k in node.keywords if k.arg == "env"), None)
        if env is None and rel not in INHERITS:
            problems.append(f"{rel}:{node.lineno}: {name}() without env=")
        if env is not None and any(_is_environ(n) for n in ast.walk(env)):
            problems.append(f"{rel}:{node.lineno}: {name}() passes os.environ on")
    return spawns, problems


def test_no_spawn_passes_the_workers_environment_on() -> None:
    spawns, problems = 0, []
    for path in _sources():
        found, wrong = _problems(path.read_text(), path.relative_to(PACKAGE).as_posix())
        spawns, problems = spawns + found, problems + wrong
    assert spawns >= 5  # the walk found the spawns it checks
    assert problems == []


@pytest.mark.parametrize(
    "line",
    [
        "pexpect.spawn('bash', env={**os.environ, 'PS1': ''})",  # local.py's line of old
        "subprocess.run([b, '--version'], env={**os.environ, 'X': '1'})",  # host.py's
        "subprocess.run([b, '--version'], capture_output=True)",  # inherits it all
        "subprocess.Popen(argv, env=os.environ)",
        "subprocess.Popen(argv, env=dict(os.environ))",
        "env = os.environ.copy()",
    ],
)
def test_the_check_catches_each_way_of_passing_it_on(line: str) -> None:
    _, problems = _problems(f"import os, pexpect, subprocess\n{line}\n", "sandbox/x.py")
    assert problems, line


def _names(env_text: str) -> set[str]:
    return {line.split("=", 1)[0] for line in env_text.splitlines() if "=" in line}


def test_the_local_shell_sees_only_the_allow_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", CANARY)
    monkeypatch.setenv("DURABLE_HARNESS_POSTGRES_URL", f"postgresql://u:{CANARY}@h/db")
    with LocalSandbox(tmp_path) as box:
        out = box.bash("env; id -un").stdout
    assert CANARY not in out
    assert _names(out) <= set(PASSED_ENV) | OWN, _names(out) - set(PASSED_ENV) - OWN
    user = agent_user()
    assert user is not None and out.splitlines()[-1] == user.name


def test_a_cli_version_check_sees_only_the_allow_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", CANARY)
    cli = tmp_path / "fake-cli"
    cli.write_text("#!/bin/sh\nenv\nid -un\n")
    cli.chmod(0o755)
    out = HostCliHost(tmp_path, {}, user=agent_user()).version_text(str(cli))
    assert "HOME=" in out and CANARY not in out
    assert _names(out) <= set(PASSED_ENV) | OWN, _names(out) - set(PASSED_ENV) - OWN
    assert out.splitlines()[-1] == "durable-harness-agent"


@pytest.mark.parametrize("agent", ["builtin", "pi"])
def test_a_host_folder_without_its_agent_user_is_refused(tmp_path: Path, agent: str) -> None:
    """No such account (or root as the agent user): the turn is refused before anything
    runs, with what to do; nothing falls back to the worker's uid."""
    for h in make_harness(tmp_path, DEMO / "script.toml"):
        ws = tmp_path / "ws"
        for name, expected in (("dh-no-such-user", "does not exist"), ("root", "is root")):
            out = h.cli(
                "run", "--agent", agent, "--workspace", str(ws), "hi",
                DURABLE_HARNESS_AGENT_USER=name,
            )  # fmt: skip
            assert out.returncode == 2, out.stderr
            assert expected in out.stderr and "DURABLE_HARNESS_UNSAFE_SAME_USER=1" in out.stderr
        assert h.requests() == []  # no model call was made
