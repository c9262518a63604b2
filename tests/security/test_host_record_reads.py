"""What the worker reads back from a host-folder launch (session records, OpenCode's
database) is the launch's own: the worker may be root and the files the agent user's, so
a symlink the agent planted (to the World's files, /proc/<worker>/environ) reads as no
file, and so does anything outside the launch's HOME and the workspace."""

from __future__ import annotations

from pathlib import Path

from durable_harness.adapters.cli.host import HostCliHost
from durable_harness.sandbox.agent_user import agent_user


def test_only_the_launchs_own_regular_files_are_read(tmp_path: Path) -> None:
    secret = tmp_path / "world-secret"
    secret.write_text("signal-secret")
    ws = tmp_path / "ws"
    ws.mkdir()
    host = HostCliHost(ws, {}, home_prefix="dh-test-records-", user=agent_user())
    home = Path(host.home("job-1"))
    try:
        (home / "record.jsonl").write_text("mine")
        (home / "link.jsonl").symlink_to(secret)
        (home / "environ").symlink_to("/proc/1/environ")
        (home / "dir").symlink_to(tmp_path)  # a folder on the way that leads out
        (ws / "note.txt").write_text("workspace")
        assert host.read_file(str(home / "record.jsonl")) == b"mine"
        assert host.read_file(str(ws / "note.txt")) == b"workspace"
        assert host.read_file(str(home / "link.jsonl")) is None
        assert host.read_file(str(home / "environ")) is None
        assert host.read_file(str(home / "dir" / "world-secret")) is None
        assert host.read_file(str(secret)) is None  # outside both
        assert host.read_file(str(home / "missing")) is None
    finally:
        host.close()
