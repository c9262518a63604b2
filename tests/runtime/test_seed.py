"""``run --repo``: a new session's workspace seeded from a real repository made by the
test (a symlink, an executable script, a dirty tracked file, an untracked file, and
secrets in its ``.git/config``: a token in the remote URL and an ``http.extraheader``),
on the virtual workspace and in Docker; and the bad input, each refused with nothing
recorded."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import Harness, ids_of, make_harness

from durable_harness.core.errors import ConfigError
from durable_harness.core.seed import load_seed
from durable_harness.harness.journal import decode_output
from durable_harness.harness.workspace import SnapshotStore
from durable_harness.sandbox.docker import DockerSandbox
from durable_harness.worlds import open_world

TOKEN = "tok3n-of-the-user"
HEADER_SECRET = "s3cret-header-value"
# The model's commands name the secrets split in two, so the World's copy of the
# conversation never holds them whole: any whole occurrence came from the repository.
FIND_SECRETS = (
    "grep -rIl -e 'tok3n''-of-the' -e 's3cret''-header' {where} 2>/dev/null "
    "| sed 's/^/secret in: /'; true"
)
COMMITTED = "print('committed')\n"

SCRIPT = """
[[rule]]
name = "start"
when.last_user_text = "look at the repository"
reply.tool_use = [{{ name = "read", input = {{ path = "app.py" }} }}]

[[rule]]
name = "look around"
when.last_tool_name = "read"
reply.tool_use = [{{ name = "bash", input = {{ command = {command} }} }}]

[[rule]]
name = "done"
when.last_tool_name = "bash"
reply.text = "Seen it."
"""
VIRTUAL_LOOK = "ls .git; cat untracked.txt; cat .git/config"
DOCKER_LOOK = (
    "git log --format=%H -1; git status --porcelain; cat .git/config; "
    "stat -c '%a %n' run.sh; ./run.sh; " + FIND_SECRETS.format(where="/workspace /home /tmp /etc")
)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """The user's project: committed files, then uncommitted changes and secrets."""
    proj = tmp_path / "proj"
    (proj / "sub").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(proj)], check=True)
    (proj / "app.py").write_text(COMMITTED)
    (proj / "run.sh").write_text("#!/bin/sh\necho script-ran\n")
    (proj / "run.sh").chmod(0o755)
    (proj / "link.py").symlink_to("app.py")
    (proj / "sub" / "notes.md").write_text("notes\n")
    (proj / ".gitignore").write_text("*.log\n")
    git(proj, "add", "-A")
    git(proj, "commit", "-qm", "first")
    git(proj, "remote", "add", "origin", f"https://user:{TOKEN}@git.example.invalid/proj.git")
    git(proj, "config", "http.extraheader", f"Authorization: Bearer {HEADER_SECRET}")
    (proj / "app.py").write_text(COMMITTED + "print('dirty')\n")
    (proj / "untracked.txt").write_text("untracked\n")
    (proj / "build.log").write_text("ignored\n")
    return proj


def harness_for(tmp: Path, command: str) -> Iterator[Harness]:
    script = tmp / "script.toml"
    script.write_text(SCRIPT.format(command=json.dumps(command)))
    yield from make_harness(tmp, script)


@pytest.fixture
def virtual(tmp_path: Path) -> Iterator[Harness]:
    yield from harness_for(tmp_path, VIRTUAL_LOOK)


def tool_outputs(h: Harness, turn_id: str) -> dict[str, str]:
    with open_world("local", data_dir=h.tmp / "world") as world:
        return {
            step.name: str(decode_output(world, step)["content"])
            for step in world.load_steps(turn_id)
            if step.kind == "tool"
        }


def no_secret_in_world(h: Harness) -> None:
    for blob in (h.tmp / "world").rglob("*"):
        if blob.is_file():
            data = blob.read_bytes()
            assert TOKEN.encode() not in data and HEADER_SECRET.encode() not in data, blob


def test_run_repo_seeds_the_virtual_workspace(virtual: Harness, repo: Path) -> None:
    h = virtual
    head = git(repo, "rev-parse", "HEAD")
    out = h.cli("run", "--repo", str(repo), "look at the repository")
    assert out.returncode == 0, out.stderr
    assert f"from {repo} at {head[:12]}" in out.stderr
    # app.py (modified) and untracked.txt; the ignored build.log is not a change.
    assert "2 uncommitted change(s)" in out.stderr and "--include-uncommitted" in out.stderr
    first = ids_of(out)
    seen = tool_outputs(h, first["turn"])
    assert seen["read"] == COMMITTED
    assert "HEAD" in seen["bash"] and "objects" in seen["bash"] and "hooks" not in seen["bash"]
    assert "untracked\n" not in seen["bash"]
    assert f'url = "{repo}"' in seen["bash"]

    # The default repository is the one holding the current folder; uncommitted carried.
    out = h.cli("run", "--include-uncommitted", "look at the repository", cwd=repo / "sub")
    assert out.returncode == 0, out.stderr
    assert "left out" not in out.stderr and "with its uncommitted changes" in out.stderr
    second = ids_of(out)
    seen = tool_outputs(h, second["turn"])
    assert seen["read"] == COMMITTED + "print('dirty')\n"
    assert "untracked\n" in seen["bash"]

    with open_world("local", data_dir=h.tmp / "world") as world:
        seeds = [load_seed(world, world, ids["session"]) for ids in (first, second)]
        assert [(s.commit, s.repo, s.uncommitted) for s in seeds if s] == [
            (head, str(repo), False),
            (head, str(repo), True),
        ]
        state = SnapshotStore(world).load(seeds[0].snapshot)  # type: ignore[union-attr]
        assert state.links == {"link.py": "app.py"} and "run.sh" in state.executable
        assert ".git/HEAD" in state.files and "build.log" not in state.files
        assert b"dirty" not in state.files["app.py"]
        assert not any(p.startswith((".git/hooks/", ".git/logs/")) for p in state.files)
    # --no-repo: an empty workspace even inside the repository.
    out = h.cli("run", "--no-repo", "look at the repository", cwd=repo)
    assert out.returncode == 0, out.stderr
    assert "seeded" not in out.stderr
    assert "no such file" in tool_outputs(h, ids_of(out)["turn"])["read"]
    no_secret_in_world(h)


def one_line_error(out: subprocess.CompletedProcess[str], *needles: str) -> None:
    err = out.stderr.strip()
    assert out.returncode != 0, err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def test_bad_repositories_are_refused_and_nothing_is_recorded(
    virtual: Harness, repo: Path, tmp_path: Path
) -> None:
    h = virtual
    prompt = "look at the repository"
    not_a_repo = tmp_path / "plain"
    not_a_repo.mkdir()
    one_line_error(h.cli("run", "--repo", str(not_a_repo), prompt), "not a git repository")
    one_line_error(h.cli("run", "--repo", str(repo), "--ref", "no-such", prompt), "unknown ref")
    one_line_error(
        h.cli("run", "--repo", str(repo), "--max-files", "5", prompt),
        "cap of 5",
        "--max-files",
    )
    one_line_error(h.cli("run", "--repo", str(repo), "--max-bytes", "100", prompt), "--max-bytes")
    inside = repo / "sub"
    one_line_error(h.cli("run", "--repo", str(repo), "--workspace", str(inside), prompt), "inside")
    one_line_error(
        h.cli("run", "--repo", str(repo), "--workspace", str(not_a_repo.parent), prompt),
        "not empty",
    )
    # A URL's credentials are never shown, even in git's own error.
    url = f"https://user:{TOKEN}@127.0.0.1:9/proj.git"
    out = h.cli("run", "--repo", url, prompt)
    one_line_error(out, "cannot clone https://127.0.0.1:9/proj.git")
    assert TOKEN not in out.stderr
    one_line_error(h.cli("run", "--repo", url, "--include-uncommitted", prompt), "a URL has none")
    assert json.loads(h.cli("ls", "--json").stdout) == []

    out = h.cli("run", "--no-repo", prompt)
    assert out.returncode == 0, out.stderr
    session = ids_of(out)["session"]
    one_line_error(
        h.cli("run", "--repo", str(repo), "--session", session, prompt), "drop --session"
    )
    assert len(json.loads(h.cli("ls", "--json").stdout)) == 1
    # A known ref by name: a tag, checked out detached at its commit.
    git(repo, "tag", "v1")
    out = h.cli("run", "--repo", str(repo), "--ref", "v1", prompt)
    assert out.returncode == 0, out.stderr


def test_run_repo_in_docker(docker_host: str, repo: Path, tmp_path: Path) -> None:
    for h in harness_for(tmp_path, DOCKER_LOOK):
        head = git(repo, "rev-parse", "HEAD")
        out = h.cli("run", "--workspace", "docker", "look at the repository", cwd=repo)
        assert out.returncode == 0, out.stderr
        ids = ids_of(out)
        try:
            seen = tool_outputs(h, ids["turn"])
            assert seen["read"] == COMMITTED
            lines = seen["bash"].splitlines()
            assert head in lines
            assert "755 run.sh" in lines and "script-ran" in lines
            assert "[core]" in seen["bash"] and "extraheader" not in seen["bash"]
            assert TOKEN not in seen["bash"] and HEADER_SECRET not in seen["bash"]
            assert "secret in:" not in seen["bash"]
            # git status in the sandbox: the user's uncommitted changes were left out.
            assert " M app.py" not in lines and "?? untracked.txt" not in lines
            no_secret_in_world(h)
        finally:
            with DockerSandbox(ids["session"]) as box:
                box.remove()


def test_the_python_api_seeds_too(repo: Path, tmp_path: Path) -> None:
    from durable_harness import enqueue_turn

    with open_world("local", data_dir=tmp_path / "world") as world:
        turn = enqueue_turn(world, "look", repo=str(repo), ref="main", include_uncommitted=True)
        seed = load_seed(world, world, turn.session_id)
        assert seed is not None and seed.commit == git(repo, "rev-parse", "HEAD")
        assert (seed.ref, seed.uncommitted) == ("main", True)
        state = SnapshotStore(world).load(seed.snapshot)
        assert state.files["untracked.txt"] == b"untracked\n"
        # A URL: its default branch, stored as given (file:// has no credentials to drop).
        by_url = enqueue_turn(world, "look", repo=f"file://{repo}")
        url_seed = load_seed(world, world, by_url.session_id)
        assert url_seed is not None and url_seed.repo == f"file://{repo}"
        assert url_seed.commit == seed.commit and not url_seed.uncommitted
        with pytest.raises(ConfigError, match="drop --session"):
            enqueue_turn(world, "again", repo=str(repo), session_id=turn.session_id)
        assert len(world.list_turns(turn.session_id)) == 1
