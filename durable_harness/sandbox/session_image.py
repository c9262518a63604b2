"""The session image: a repository's own toolchain image with the agent's parts added
(``run --image IMAGE``), and the agent image built on first use.

The agent image (docker_image.py) has node, git and the agent CLIs but no Python; a real
repository needs its own toolchain. ``--image IMAGE`` names one (any glibc Linux image
with bash and coreutils: ``python:3.12``, a team's CI image). The session's container
then runs an image *derived* from it, built here with :data:`DOCKERFILE`, which adds
exactly what the agent image has:

* node, copied from this host (as the offline base does) into ``/opt/agent-node``, last
  on ``PATH`` so the repository's own node, if IMAGE has one, wins for its commands;
* the agent CLIs of ``image/tools/npm/package-lock.json`` (package data), installed once
  on the host by npm (the same cached ``node_modules`` as the offline agent image) into
  ``/opt/agent-clis``, owned by root, first on ``PATH``;
* the agent user 1000, ``/home/agent``, ``/workspace``, the agent image's environment,
  no ENTRYPOINT (tini runs ``sleep infinity``).

The derived image is tagged ``durable-harness/session:<digest>``, the digest of IMAGE's
id and of everything added (this Dockerfile, the lock file, the host's node version): a
new IMAGE (a moved tag), new CLIs or a new node make a new tag, an unchanged one is
found and reused (built once per Docker host). Its labels name the source image, so
``doctor`` and ``docker images`` tell what it is. No registry is needed: IMAGE must be on
the Docker host already (``docker pull`` it, or build it), since the harness never pulls
what an enqueued turn names.

Which images a turn may name is the operator's choice (runtime/admission.py,
``DURABLE_HARNESS_ALLOWED_IMAGES``): the image's code runs in the sandbox, with the
sandbox's limits, but it is still code the operator chose to run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from durable_harness.core.errors import ConfigError
from durable_harness.sandbox.docker_image import (
    CONTEXT_LABEL,
    PATH,
    SOURCE_LABEL,
    BuildResult,
    Say,
    build_image,
    connect,
    copy_node,
    default_cache_dir,
    default_image,
    follow_build,
    host_node,
    link_or_copy,
    prebuilt_clis,
    source_root,
)

__all__ = ["DERIVED_REPOSITORY", "SOURCE_LABEL", "build_session_image", "ensure_agent_image"]

DERIVED_REPOSITORY = "durable-harness/session"
#: The image a session image was derived from, by the name the turn gave (and its id).
SOURCE_ID_LABEL = "durable-harness.source-id"

#: Build arguments: SOURCE (IMAGE's id, so a tag moved meanwhile cannot slip in) and
#: SOURCE_PATH (IMAGE's own PATH, kept between the CLIs and the harness's node).
DOCKERFILE = """\
ARG SOURCE
FROM ${SOURCE}
ARG SOURCE_PATH
USER root
COPY node/ /opt/agent-node/
COPY tools/npm/ /opt/agent-clis/
# The harness's scripts need bash; the copied node needs a glibc as new as the host's.
RUN command -v bash >/dev/null && command -v tar >/dev/null \\
    || { echo "durable-harness: the image has no bash or tar: a session image needs both" >&2; \\
         exit 1; }
RUN /opt/agent-node/bin/node --version >/dev/null \\
    || { echo "durable-harness: this host's node does not run on the image (musl, or an" \\
              "older glibc than the host's?): give a glibc image at least as new" >&2; \\
         exit 1; }
# uid 1000 is the agent (an image may have named it already; the name does not matter).
RUN if ! grep -q '^[^:]*:[^:]*:1000:' /etc/passwd; then \\
      if command -v useradd >/dev/null; then \\
        useradd --uid 1000 --user-group --home-dir /home/agent --no-create-home \\
          --shell /bin/bash agent; \\
      else \\
        echo 'agent:x:1000:1000::/home/agent:/bin/bash' >> /etc/passwd \\
        && echo 'agent:x:1000:' >> /etc/group; \\
      fi; \\
    fi \\
    && mkdir -p /home/agent /workspace \\
    && chown 1000:1000 /home/agent /workspace
ENV HOME=/home/agent \\
    PATH=/opt/agent-clis/node_modules/.bin:${SOURCE_PATH}:/opt/agent-node/bin \\
    LANG=C.UTF-8 \\
    TERM=dumb \\
    PAGER=cat \\
    GIT_PAGER=cat \\
    GIT_TERMINAL_PROMPT=0 \\
    DISABLE_AUTOUPDATER=1 \\
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1
USER 1000:1000
WORKDIR /workspace
ENTRYPOINT []
CMD ["sleep", "infinity"]
"""


def stderr_say(line: str) -> None:
    """Progress of a build on first use: on stderr, where ``run`` prints its steps."""
    print(f"durable-harness: {line}", file=sys.stderr, flush=True)


def _source(client: Any, image: str) -> Any:
    import docker.errors

    try:
        return client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ConfigError(
            f"the image {image!r} is not on this Docker host: `docker pull {image}` (or build "
            "it) first; the harness never pulls the image a turn names"
        ) from None


def _digest(root: Path, source_id: str, node_version: str) -> str:
    h = hashlib.sha256(f"{source_id}\0{node_version}\0".encode() + DOCKERFILE.encode())
    for name in ("tools/npm/package.json", "tools/npm/package-lock.json"):
        h.update(b"\0" + (root / name).read_bytes())
    return h.hexdigest()[:16]


def _source_path(source: Any) -> str:
    for entry in source.attrs.get("Config", {}).get("Env") or []:
        if str(entry).startswith("PATH="):
            return str(entry)[5:]
    return PATH


def build_session_image(
    image: str,
    *,
    docker_host: str | None = None,
    cache_dir: Path | None = None,
    force: bool = False,
    say: Say = stderr_say,
) -> BuildResult:
    """The session image derived from ``image`` (see the module docstring): found by its
    tag, or built now with progress lines through ``say``. ConfigError when ``image`` is
    not on the Docker host or the build fails (the message says why)."""
    import docker.errors

    started = time.monotonic()
    root = source_root()
    _node_path, node_version = host_node()
    client = connect(docker_host)
    cache_dir = cache_dir or default_cache_dir()
    try:
        source = _source(client, image)
        digest = _digest(root, str(source.id), node_version)
        tag = f"{DERIVED_REPOSITORY}:{digest}"
        if not force:
            try:
                found = client.images.get(tag)
                return BuildResult(tag, time.monotonic() - started, found.attrs["Size"], True)
            except docker.errors.ImageNotFound:
                pass
        say(f"building the session image {tag} from {image} (once per Docker host)")
        cache_dir.mkdir(parents=True, exist_ok=True)
        clis = prebuilt_clis(root, cache_dir, say)
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix="session-image-") as tmp:
            context = Path(tmp)
            (context / "Dockerfile").write_text(DOCKERFILE)
            staged = context / "staged"
            copy_node(staged, _node_path)
            (staged / "usr/local").rename(context / "node")
            npm = context / "tools/npm"
            npm.mkdir(parents=True)
            for name in ("package.json", "package-lock.json"):
                shutil.copy2(root / "tools/npm" / name, npm / name)
            shutil.copytree(
                clis / "node_modules",
                npm / "node_modules",
                symlinks=True,
                copy_function=link_or_copy,
            )
            _build(client, context, tag, image, str(source.id), _source_path(source), digest, say)
            labels = client.images.get(tag).labels
            if labels.get(SOURCE_ID_LABEL) != str(source.id):
                raise ConfigError(f"building {tag} gave an image without its labels")
        size = int(client.images.get(tag).attrs["Size"])
    except docker.errors.DockerException as exc:
        raise ConfigError(f"building the session image from {image} failed: {exc}") from exc
    finally:
        client.close()
    say(f"session image {tag} built in {time.monotonic() - started:.0f}s")
    return BuildResult(tag, time.monotonic() - started, size, False)


def _build(
    client: Any,
    context: Path,
    tag: str,
    image: str,
    source_id: str,
    source_path: str,
    digest: str,
    say: Say,
) -> None:
    stream = client.api.build(
        path=str(context),
        tag=tag,
        buildargs={"SOURCE": source_id, "SOURCE_PATH": source_path},
        # The name is what the first build was asked for (one id may have several names).
        labels={CONTEXT_LABEL: digest, SOURCE_LABEL: image, SOURCE_ID_LABEL: source_id},
        network_mode="none",  # nothing is downloaded: everything is in the context
        rm=True,
        forcerm=True,
        decode=True,
    )
    follow_build(
        stream, say, lambda error: f"building the session image {tag} failed: {error.strip()}"
    )


def can_build_offline() -> bool:
    """Whether this machine can make the offline base (root, debootstrap, node, npm)."""
    return (
        os.geteuid() == 0
        and shutil.which("debootstrap") is not None
        and shutil.which("node") is not None
        and shutil.which("npm") is not None
    )


def ensure_agent_image(
    image: str, *, docker_host: str | None = None, say: Say = stderr_say
) -> None:
    """The default agent image built on first use (offline when this machine can, else
    from the registry), with progress through ``say``. Only :func:`default_image` is built
    here: another name is the operator's own image, which only they can make.
    ConfigError naming the one command to run when it cannot be built here."""
    command = "durable-harness sandbox build" + (" --offline" if can_build_offline() else "")
    if image != default_image():
        raise ConfigError(
            f"the agent image {image} is not built on this Docker host: build it, or unset "
            f"DURABLE_HARNESS_DOCKER_IMAGE and run `{command}` (docs/docker.md)"
        )
    try:
        source_root()
    except ConfigError as exc:
        raise ConfigError(
            f"the agent image {image} is not built on this Docker host and cannot be built "
            f"here ({exc}); run `{command}` in a clone of durable-harness (docs/docker.md)"
        ) from None
    say(f"the agent image {image} is not built yet: building it now ({command}; minutes cold)")
    try:
        build_image(offline=can_build_offline(), docker_host=docker_host, say=say)
    except ConfigError as exc:
        raise ConfigError(
            f"building the agent image {image} failed ({exc}); run `{command}` to see why "
            "and retry (docs/docker.md)"
        ) from None
