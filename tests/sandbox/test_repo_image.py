"""sandbox/repo_image.py's build context, written without a Docker daemon: what is sent
(``.dockerignore`` applied, ``.git`` left out, links as links, never followed; a
Dockerfile outside the context added), the cap, and a digest that depends on the files
and nothing else. The build itself: tests/e2e/test_devcontainer.py."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from durable_harness.core.errors import ConfigError
from durable_harness.sandbox.repo_image import OUTSIDE_NAME, _write_context


def _context(tmp: Path, name: str) -> Path:
    root = tmp / name
    (root / ".git/objects").mkdir(parents=True)
    (root / ".git/index").write_bytes(name.encode())  # differs per clone, as git's does
    (root / "src").mkdir()
    (root / "src/app.py").write_text("print('app')\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "build.log").write_text("ignored\n")
    (root / ".dockerignore").write_text("# logs\n*.log\n")
    (root / "outside").symlink_to(tmp / "secret.txt")
    (root / ".devcontainer").mkdir()
    (root / ".devcontainer/Dockerfile").write_text("FROM python:3.12\nCOPY . /src\n")
    return root


Sent = dict[str, tuple[bytes, int, str | bytes]]


def _sent(root: Path, dockerfile: Path, max_bytes: int = 1 << 20) -> tuple[str, str, Sent]:
    """The Dockerfile's name in the context, the digest, and each non-folder entry."""
    out = io.BytesIO()
    name, digest = _write_context(out, dockerfile, root, "Dockerfile", max_bytes, {}, None)
    out.seek(0)
    sent: Sent = {}
    with tarfile.open(fileobj=out) as tar:
        for member in tar.getmembers():
            if member.isreg():
                data = tar.extractfile(member)
                assert data is not None
                sent[member.name] = (member.type, member.mode, data.read())
            elif member.issym():
                sent[member.name] = (member.type, member.mode, member.linkname)
    return name, digest, sent


def test_the_context_as_sent_and_its_digest(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("the host's secret\n")
    one = _context(tmp_path, "one")
    name, digest, sent = _sent(one, one / ".devcontainer/Dockerfile")
    assert name == ".devcontainer/Dockerfile"
    assert sent == {
        ".dockerignore": (tarfile.REGTYPE, 0o644, b"# logs\n*.log\n"),
        ".devcontainer/Dockerfile": (tarfile.REGTYPE, 0o644, b"FROM python:3.12\nCOPY . /src\n"),
        "outside": (tarfile.SYMTYPE, 0o777, str(tmp_path / "secret.txt")),  # never followed
        "run.sh": (tarfile.REGTYPE, 0o755, b"#!/bin/sh\n"),
        "src/app.py": (tarfile.REGTYPE, 0o644, b"print('app')\n"),
    }
    # Another clone of the same files (its .git differs): the same digest, so the same tag.
    two = _context(tmp_path, "two")
    assert _sent(two, two / ".devcontainer/Dockerfile")[1] == digest
    # Any change to what is sent makes a new one: a byte, a mode bit, the Dockerfile.
    (two / "src/app.py").write_text("print('app!')\n")
    changed = _sent(two, two / ".devcontainer/Dockerfile")[1]
    (two / "src/app.py").write_text("print('app')\n")
    (two / "run.sh").chmod(0o644)
    moded = _sent(two, two / ".devcontainer/Dockerfile")[1]
    assert len({digest, changed, moded}) == 3
    # A Dockerfile outside the context (a devcontainer's context "." of another folder).
    name, _, sent = _sent(one / "src", one / ".devcontainer/Dockerfile")
    assert name == OUTSIDE_NAME and set(sent) == {OUTSIDE_NAME, "app.py"}
    with pytest.raises(ConfigError, match=r"more than 20 bytes: add a \.dockerignore"):
        _sent(one, one / ".devcontainer/Dockerfile", 20)
