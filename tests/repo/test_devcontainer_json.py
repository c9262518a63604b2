"""repo/devcontainer.py on files made by the test, no Docker: JSON with comments, each
form of the toolchain and the setup commands, and every way a repository could point the
build at this machine's files (each refused in one line naming the file and --image).

Building and running what it finds: tests/e2e/test_devcontainer.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from durable_harness.core.errors import ConfigError
from durable_harness.repo.devcontainer import MAX_BYTES, find_devcontainer, strip_jsonc

JSONC = """{
  // a line comment, "with quotes", and a trailing comma below
  "name": "shop", /* a block
  comment over two lines */
  "url": "http://example.invalid//not-a-comment",
  "odd": "a /* kept */ b, } \\" // still a string",
  "list": [1, 2, /* nothing */ ],
}
"""


def test_jsonc_comments_and_trailing_commas() -> None:
    plain = strip_jsonc(JSONC)
    assert json.loads(plain) == {
        "name": "shop",
        "url": "http://example.invalid//not-a-comment",
        "odd": 'a /* kept */ b, } " // still a string',
        "list": [1, 2],
    }
    # Lines are kept, so a JSON error after a comment names the line the user sees.
    assert plain.count("\n") == JSONC.count("\n")
    with pytest.raises(json.JSONDecodeError) as bad:
        json.loads(strip_jsonc('{\n  /* one\n two */\n  "a": 1\n  "b": 2\n}'))
    assert bad.value.lineno == 5
    with pytest.raises(ValueError, match="not closed"):
        strip_jsonc('{"a": 1 /* open')


def _write(checkout: Path, name: str, text: str) -> None:
    path = checkout / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_each_form_of_the_toolchain_and_the_setup(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    assert find_devcontainer(repo) is None
    # The root file, an image, and the create-time commands in their order (an array is
    # quoted as one command; an object's commands are joined in key order).
    _write(
        repo,
        ".devcontainer.json",
        """{
          "image": "python:3.12", // the toolchain
          "postCreateCommand": {"deps": ["pip", "install", "-e", ".[dev]"], "hooks": "make hooks"},
          "onCreateCommand": "echo 'first'",
          "features": {"ghcr.io/devcontainers/features/node:1": {}},
        }""",
    )
    found = find_devcontainer(repo)
    assert found is not None
    assert (found.path, found.image, found.dockerfile) == (
        ".devcontainer.json",
        "python:3.12",
        None,
    )
    assert found.setup == "echo 'first' && pip install -e '.[dev]' && make hooks"
    assert found.setup_keys == ("onCreateCommand", "postCreateCommand")
    assert found.ignored == ("features",)
    # .devcontainer/devcontainer.json wins; build with a context of the repository's top,
    # args and target; a build wins over an image.
    _write(repo, ".devcontainer/Dockerfile", "FROM python:3.12\n")
    _write(
        repo,
        ".devcontainer/devcontainer.json",
        """{"image": "ignored", "build": {"dockerfile": "Dockerfile", "context": "..",
            "args": {"V": "1"}, "target": "dev"}, "postCreateCommand": ["make", "a b"]}""",
    )
    found = find_devcontainer(repo)
    assert found is not None and found.path == ".devcontainer/devcontainer.json"
    assert found.dockerfile == (repo / ".devcontainer/Dockerfile").resolve()
    assert found.context == repo.resolve()
    assert (found.build_args, found.target, found.image) == ({"V": "1"}, "dev", None)
    assert found.setup == "make 'a b'"
    # The older spelling: top-level dockerFile and context.
    _write(repo, ".devcontainer/devcontainer.json", '{"dockerFile": "Dockerfile"}')
    found = find_devcontainer(repo)
    assert found is not None and found.context == (repo / ".devcontainer").resolve()
    assert found.setup is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"image": "x",, }', "not valid JSON with comments"),
        ('{"image": "x" /* open', "not closed"),
        ('["image"]', "not a JSON object"),
        ('{"build": {"dockerfile": "Dockerfile", "context": "../.."}}', "outside the repository"),
        ('{"build": {"dockerfile": "../../etc/passwd"}}', "outside the repository"),
        ('{"build": {"dockerfile": "/etc/passwd"}}', "absolute"),
        ('{"build": {"dockerfile": "linked/Dockerfile"}}', "through a symlink"),
        ('{"build": {"dockerfile": "Dockerfile", "context": "linked"}}', "through a symlink"),
        ('{"build": {"dockerfile": "out.Dockerfile"}}', "through a symlink"),
        ('{"build": {"dockerfile": "missing"}}', "which is not a file"),
        ('{"build": {"dockerfile": "Dockerfile", "args": {"A": 1}}}', "build.args"),
        ('{"image": 3}', "not an image name"),
        ('{"image": "x", "postCreateCommand": 7}', "is not a command"),
    ],
)
def test_bad_devcontainers_are_refused_in_one_line(tmp_path: Path, text: str, why: str) -> None:
    repo = tmp_path / "repo"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "Dockerfile").write_text("FROM scratch\n")
    _write(repo, ".devcontainer/Dockerfile", "FROM python:3.12\n")
    (repo / ".devcontainer/linked").symlink_to(outside)
    (repo / ".devcontainer/out.Dockerfile").symlink_to(outside / "Dockerfile")
    _write(repo, ".devcontainer/devcontainer.json", text)
    with pytest.raises(ConfigError) as refused:
        find_devcontainer(repo)
    message = str(refused.value)
    assert why in message and "\n" not in message, message
    assert ".devcontainer/devcontainer.json" in message and "--image" in message


def test_a_linked_or_large_devcontainer_json_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    secret = tmp_path / "secret.json"
    secret.write_text('{"image": "x"}')
    (repo / ".devcontainer.json").symlink_to(secret)
    with pytest.raises(ConfigError, match="not a regular file"):
        find_devcontainer(repo)
    (repo / ".devcontainer").symlink_to(tmp_path)  # the folder itself a link out
    (tmp_path / "devcontainer.json").write_text('{"image": "x"}')
    with pytest.raises(ConfigError, match="not a regular file"):
        find_devcontainer(repo)
    (repo / ".devcontainer").unlink()
    (repo / ".devcontainer.json").unlink()
    _write(repo, ".devcontainer.json", '{"image": "x", "pad": "' + "x" * MAX_BYTES + '"}')
    with pytest.raises(ConfigError, match=f"over the cap of {MAX_BYTES:,}"):
        find_devcontainer(repo)
