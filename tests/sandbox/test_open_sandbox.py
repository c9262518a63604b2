"""open_sandbox: choosing a backend by name or path."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_harness.core.errors import ConfigError
from durable_harness.sandbox import open_sandbox
from durable_harness.sandbox.local import LocalSandbox
from durable_harness.sandbox.virtual import VirtualSandbox


def test_virtual_with_options() -> None:
    with open_sandbox("virtual", max_files=3) as box:
        assert isinstance(box, VirtualSandbox)
        assert box.journaled


def test_directory_path_is_created(tmp_path: Path) -> None:
    target = tmp_path / "new" / "workspace"
    with open_sandbox(str(target), timeout=5) as box:
        assert isinstance(box, LocalSandbox)
        assert not box.journaled
        assert target.is_dir()


@pytest.mark.parametrize("spec", ["docker-ish", "virtul", ""])
def test_unknown_names_say_what_is_accepted(spec: str) -> None:
    with pytest.raises(ConfigError, match="'virtual', 'docker', or a directory path"):
        open_sandbox(spec)


def test_a_file_is_not_a_sandbox(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="is a file"):
        open_sandbox(str(tmp_path / "f"))


def test_options_the_backend_does_not_take(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not take max_files"):
        open_sandbox(str(tmp_path), max_files=3)
    with pytest.raises(ConfigError, match="does not take root"):
        open_sandbox("virtual", root=tmp_path)
