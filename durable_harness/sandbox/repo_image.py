"""A repository's own Dockerfile built into its toolchain image (``run`` with a
devcontainer ``build``, or ``run --image PATH``).

The build runs on this machine's Docker host, through the Docker SDK, at ``run``: the
process the operator typed, never a worker claiming someone else's turn (a worker only
runs the resulting tag, and only if it is allowed, as any ``--image``). What is sent is
decided here, not by the daemon or the repository:

* the context is a tar this module writes from the folder: ``.dockerignore`` applied (as
  ``docker build`` does) and ``.git`` left out (see :func:`_ignored`), symlinks sent as
  links and never followed (a link cannot bring one of this machine's files into the
  image), only regular files, folders and links, at most ``max_bytes`` of file contents
  in all; the Dockerfile is taken from its path even
  when it is outside the context (devcontainers often name ``..``);
* the tag is ``durable-harness-repo:<digest>``, the digest of the Dockerfile, the build
  arguments and target, and every path, mode bit and byte of the context as sent: an
  unchanged repository finds its image and builds nothing, any change makes a new tag. A
  base image that moved under the same ``FROM`` name is not noticed (``docker rmi`` the
  tag to rebuild);
* the build has ``timeout`` seconds (each wait for the daemon's next line too); its
  progress lines go to ``say``; a failure is one ConfigError line with the daemon's
  reason.

No label is added: a Dockerfile that only names its ``FROM`` gives that image's id, so
its session image (sandbox/session_image.py) is found, not built again.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from durable_harness.core.errors import ConfigError
from durable_harness.sandbox.docker_image import Say, connect, follow_build

__all__ = ["REPOSITORY", "RepoImage", "build_repo_image"]

REPOSITORY = "durable-harness-repo"
#: The Dockerfile's name in the context when it lies outside the context folder.
OUTSIDE_NAME = ".durable-harness.Dockerfile"
_FORMAT = b"durable-harness repo image 1\0"  # changes the digest if the walk below changes


@dataclass(frozen=True)
class RepoImage:
    """The tag of a repository's toolchain image, and whether it was built just now."""

    tag: str
    built: bool
    seconds: float


def build_repo_image(
    dockerfile: Path,
    context: Path,
    *,
    label: str,
    max_bytes: int,
    timeout: float,
    build_args: dict[str, str] | None = None,
    target: str | None = None,
    network: str | None = None,
    docker_host: str | None = None,
    say: Say,
) -> RepoImage:
    """The image of ``dockerfile`` built with ``context`` (see the module docstring):
    found by its tag, or built now. ``label`` names the Dockerfile in messages (as the
    user knows it). ConfigError when the context is over ``max_bytes``, the build fails
    or takes longer than ``timeout``. ``network``: the ``RUN`` steps' network (None: the
    daemon's default)."""
    import docker.errors
    import requests

    started = time.monotonic()
    args = dict(sorted((build_args or {}).items()))
    with tempfile.TemporaryFile() as tar:
        name, digest = _write_context(tar, dockerfile, context, label, max_bytes, args, target)
        tag = f"{REPOSITORY}:{digest}"
        client = connect(docker_host)
        try:
            try:
                client.images.get(tag)
                return RepoImage(tag, False, time.monotonic() - started)
            except docker.errors.ImageNotFound:
                pass
            say(f"building {label} as {tag} (once per Docker host)")
            tar.seek(0)
            _build(client, tar, name, tag, label, args, target, network, timeout, started, say)
            client.images.get(tag)  # the daemon said it built: make sure the tag is there
        except docker.errors.DockerException as exc:
            raise ConfigError(
                f"building {label} failed: {_one_line(str(exc))}: fix it, or give --image IMAGE"
            ) from exc
        except requests.RequestException as exc:  # the daemon said nothing for `timeout`
            raise ConfigError(
                f"building {label} took more than {timeout:.0f}s ({_one_line(str(exc))}): "
                "raise DURABLE_HARNESS_TOOLCHAIN_BUILD_TIMEOUT, or give --image IMAGE"
            ) from exc
        finally:
            client.close()
    seconds = time.monotonic() - started
    say(f"{tag} built in {seconds:.0f}s")
    return RepoImage(tag, True, seconds)


def _write_context(
    out: IO[bytes],
    dockerfile: Path,
    context: Path,
    label: str,
    max_bytes: int,
    args: dict[str, str],
    target: str | None,
) -> tuple[str, str]:
    """Write the context's tar to ``out``; the Dockerfile's name in it, and the digest."""
    from docker.utils.build import exclude_paths

    dockerfile_bytes = dockerfile.read_bytes()
    inside = dockerfile.is_relative_to(context)
    name = dockerfile.relative_to(context).as_posix() if inside else OUTSIDE_NAME
    digest = hashlib.sha256(_FORMAT + dockerfile_bytes + b"\0")
    digest.update(f"{sorted(args.items())!r}\0{target!r}\0{name}\0".encode())
    total = len(dockerfile_bytes)
    paths = sorted(exclude_paths(str(context), _ignored(context), dockerfile=name))
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if not inside:
            _add(tar, OUTSIDE_NAME, tarfile.REGTYPE, 0o644, dockerfile_bytes)
        for rel in paths:
            path = context / rel
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                entry: tuple[bytes, int, bytes] = (b"l", 0o777, os.readlink(path).encode())
                _add(tar, rel, tarfile.SYMTYPE, 0o777, link=os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                entry = (b"d", 0o755, b"")
                _add(tar, rel, tarfile.DIRTYPE, 0o755)
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
                if total > max_bytes:
                    raise ConfigError(
                        f"the build context of {label} ({context}) has more than {max_bytes:,} "
                        "bytes: add a .dockerignore, raise "
                        "DURABLE_HARNESS_TOOLCHAIN_CONTEXT_MAX_BYTES, or give --image IMAGE"
                    )
                data = path.read_bytes()
                mode = 0o755 if st.st_mode & 0o111 else 0o644
                entry = (b"f", mode, hashlib.sha256(data).digest())
                _add(tar, rel, tarfile.REGTYPE, mode, data)
            else:
                continue  # a socket or a device is no part of a build
            digest.update(rel.encode("utf-8", "surrogateescape") + b"\0%s\0%o\0" % entry[:2])
            digest.update(entry[2] + b"\0")
    return name, digest.hexdigest()[:16]


def _ignored(context: Path) -> list[str]:
    """The context's ``.dockerignore`` patterns, read as ``docker build`` reads them, and
    ``.git``: the checkout's is the harness's own clone, different at every ``run`` (its
    index holds file times), so sending it would rebuild the image each time."""
    path = context / ".dockerignore"
    if path.is_symlink() or not path.is_file():
        return [".git"]
    lines = (line.strip() for line in path.read_text(errors="replace").splitlines())
    return [".git", *(line for line in lines if line and not line.startswith("#"))]


def _add(
    tar: tarfile.TarFile,
    name: str,
    kind: bytes,
    mode: int,
    data: bytes = b"",
    link: str = "",
) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def _build(
    client: Any,
    tar: IO[bytes],
    name: str,
    tag: str,
    label: str,
    args: dict[str, str],
    target: str | None,
    network: str | None,
    timeout: float,
    started: float,
    say: Say,
) -> None:
    stream = client.api.build(
        fileobj=tar,
        custom_context=True,
        dockerfile=name,
        tag=tag,
        buildargs=args,
        target=target,
        network_mode=network,
        rm=True,
        forcerm=True,
        decode=True,
        timeout=timeout,
    )

    def overdue() -> str | None:
        if time.monotonic() - started <= timeout:
            return None
        return (
            f"building {label} took more than {timeout:.0f}s: raise "
            "DURABLE_HARNESS_TOOLCHAIN_BUILD_TIMEOUT, or give --image IMAGE"
        )

    follow_build(
        stream,
        say,
        lambda error: f"building {label} failed: {_one_line(error)}: fix it, or give --image IMAGE",
        overdue,
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())
