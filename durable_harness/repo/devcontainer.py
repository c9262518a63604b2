"""The toolchain a repository declares for itself: its ``devcontainer.json``.

Read from the checkout the harness made of the seeded commit (``runtime/seed.py``), never
from the user's working tree. The repository is data, not trusted code, so everything
here is checked before it is used:

* the file is ``.devcontainer/devcontainer.json``, else ``.devcontainer.json``, at most
  :data:`MAX_BYTES`, a regular file (a symlink is refused: it could point at a file of
  this machine), JSON with comments (JSONC: ``//``, ``/* */``, trailing commas);
* ``build.dockerfile`` and ``build.context`` (or the older top-level ``dockerFile`` and
  ``context``) are relative to the file's folder and must stay inside the checkout, with
  no symlink on the way: ``..`` out of it, an absolute path or a link pointing out is
  refused;
* the commands run when a container is created (``onCreateCommand``,
  ``updateContentCommand``, ``postCreateCommand``; a string, an array of arguments, or an
  object of commands) become one shell command, the turn's ``setup``.

Each refusal is a ConfigError in one line naming the file and ``--image`` (which skips
the detection). What is not supported (Docker Compose, features) is reported in
:attr:`Devcontainer.ignored`, so ``run`` can say it was left out.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_harness.core.canonical import parse_json
from durable_harness.core.errors import ConfigError

__all__ = ["CANDIDATES", "MAX_BYTES", "Devcontainer", "find_devcontainer", "strip_jsonc"]

#: Where a devcontainer.json may be, in the order the devcontainer tools look.
CANDIDATES = (".devcontainer/devcontainer.json", ".devcontainer.json")
#: A devcontainer.json is a page of settings; anything larger is not one.
MAX_BYTES = 64 * 1024
#: The lifecycle commands that run once, when the container is created, in their order.
CREATE_COMMANDS = ("onCreateCommand", "updateContentCommand", "postCreateCommand")


@dataclass(frozen=True)
class Devcontainer:
    """What a repository's devcontainer.json asks for (paths absolute, inside the
    checkout). Exactly one of ``image`` and ``dockerfile`` is set, or neither (a file that
    names no toolchain)."""

    path: str  # relative to the checkout, as the user knows it
    image: str | None = None
    dockerfile: Path | None = None
    context: Path | None = None
    build_args: dict[str, str] = field(default_factory=dict)
    target: str | None = None
    setup: str | None = None
    setup_keys: tuple[str, ...] = ()  # the lifecycle keys ``setup`` came from
    ignored: tuple[str, ...] = ()  # keys we saw and do not support


def find_devcontainer(checkout: Path) -> Devcontainer | None:
    """The checkout's devcontainer.json read and checked (see the module docstring), or
    None when it has none."""
    checkout = checkout.resolve()
    for name in CANDIDATES:
        path = checkout / name
        if path.is_symlink() or path.exists():
            return _read(checkout, name)
    return None


def _refuse(name: str, why: str) -> ConfigError:
    return ConfigError(
        f"the repository's {name} {why}: fix it, or give --image IMAGE (or "
        "--no-devcontainer) to choose the toolchain yourself"
    )


def _read(checkout: Path, name: str) -> Devcontainer:
    path = checkout / name
    if path.is_symlink() or not path.is_file() or _linked(checkout, path.parent):
        raise _refuse(name, "is not a regular file of the checkout (a symlink?)")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise _refuse(name, f"has {size:,} bytes, over the cap of {MAX_BYTES:,}")
    try:
        data = parse_json(strip_jsonc(path.read_bytes().decode("utf-8")))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _refuse(name, f"is not valid JSON with comments ({_one_line(exc)})") from None
    if not isinstance(data, dict):
        raise _refuse(name, "is not a JSON object")
    folder = path.parent
    build = data.get("build")
    if build is not None and not isinstance(build, dict):
        raise _refuse(name, '"build" is not an object')
    build = build or {}
    dockerfile = build.get("dockerfile", data.get("dockerFile"))
    context = build.get("context", data.get("context", "."))
    image = data.get("image")
    ignored = tuple(k for k in ("dockerComposeFile", "features") if data.get(k))
    setup, keys = _setup(name, data)
    if dockerfile is not None:
        if not isinstance(dockerfile, str) or not isinstance(context, str):
            raise _refuse(name, '"dockerfile" and "context" must be strings')
        args = build.get("args") or {}
        if not isinstance(args, dict) or not all(isinstance(v, str) for v in args.values()):
            raise _refuse(name, '"build.args" must map names to strings')
        target = build.get("target")
        if target is not None and not isinstance(target, str):
            raise _refuse(name, '"build.target" must be a string')
        file = _inside(checkout, name, folder, dockerfile, "dockerfile")
        if not file.is_file():
            raise _refuse(name, f"names the Dockerfile {dockerfile!r}, which is not a file")
        where = _inside(checkout, name, folder, context, "context")
        if not where.is_dir():
            raise _refuse(name, f"names the build context {context!r}, which is not a folder")
        return Devcontainer(
            name,
            dockerfile=file,
            context=where,
            build_args={str(k): v for k, v in args.items()},
            target=target,
            setup=setup,
            setup_keys=keys,
            ignored=ignored,
        )
    if image is not None and (not isinstance(image, str) or not image.strip()):
        raise _refuse(name, '"image" is not an image name')
    return Devcontainer(name, image=image, setup=setup, setup_keys=keys, ignored=ignored)


def _inside(checkout: Path, name: str, folder: Path, given: str, what: str) -> Path:
    """``given`` (relative to ``folder``) as an absolute path inside the checkout, with no
    symlink anywhere on the way (a link could lead the build to this machine's files)."""
    if Path(given).is_absolute():
        raise _refuse(name, f"names an absolute {what} {given!r}: only paths in the repository")
    lexical = Path(_normalize(folder / given))
    if lexical != checkout and not lexical.is_relative_to(checkout):
        raise _refuse(name, f"names the {what} {given!r}, outside the repository")
    if _linked(checkout, lexical):
        raise _refuse(name, f"names the {what} {given!r}, through a symlink")
    return lexical


def _normalize(path: Path) -> str:
    import os.path

    return os.path.normpath(str(path))


def _linked(checkout: Path, path: Path) -> bool:
    """Whether ``path`` or a folder between it and ``checkout`` is a symlink."""
    while path != checkout and path.is_relative_to(checkout):
        if path.is_symlink():
            return True
        path = path.parent
    return False


def _setup(name: str, data: dict[str, Any]) -> tuple[str | None, tuple[str, ...]]:
    commands: list[str] = []
    keys: list[str] = []
    for key in CREATE_COMMANDS:
        value = data.get(key)
        if value is None or value == "" or value == [] or value == {}:
            continue
        parts = list(value.values()) if isinstance(value, dict) else [value]
        for part in parts:  # an object's commands, in key order (run in parallel there)
            commands.append(_command(name, key, part))
        keys.append(key)
    return (" && ".join(commands) if commands else None), tuple(keys)


def _command(name: str, key: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(a, str) for a in value):
        return shlex.join(value)
    raise _refuse(name, f'"{key}" is not a command (a string or an array of strings)')


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def strip_jsonc(text: str) -> str:
    """``text`` (JSON with comments) as plain JSON: ``//`` and ``/* */`` comments and the
    commas before a closing ``}`` or ``]`` removed, strings left exactly as they were.
    Line breaks inside comments are kept, so a JSON error still names the right line."""
    return _drop_trailing_commas(_drop_comments(text))


def _string_end(text: str, i: int) -> int:
    """The index after the string that starts with the quote at ``i``."""
    j = i + 1
    while j < len(text) and text[j] != '"':
        j += 2 if text[j] == "\\" else 1
    return j + 1


def _drop_comments(text: str) -> str:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] == '"':
            j = _string_end(text, i)
            out.append(text[i:j])
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise ValueError("a /* comment is not closed")
            out.append(" " + "\n" * text.count("\n", i, j))
            i = j + 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _drop_trailing_commas(text: str) -> str:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] == '"':
            j = _string_end(text, i)
            out.append(text[i:j])
            i = j
            continue
        if text[i] == ",":
            j = i + 1
            while j < n and text[j] in " \t\r\n":
                j += 1
            if j < n and text[j] in "}]":
                i += 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)
