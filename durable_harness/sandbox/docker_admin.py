"""The agent image and the sandbox containers as ``doctor`` and ``sandbox ls|rm`` see them:
whether the image is built from the shipped sources (or outdated, or missing), and the
session containers this Docker host runs. Apart from :mod:`.docker_image` (which builds the
image) so that neither grows past what one reads at once; importable without the Docker SDK.
"""

from __future__ import annotations

import os
from typing import Any

from durable_harness.core.errors import ConfigError, SandboxUnavailable
from durable_harness.core.extras import install_hint
from durable_harness.sandbox.docker_image import (
    CONTEXT_LABEL,
    LABEL_MANAGED,
    LABEL_SESSION,
    SOURCE_LABEL,
    connect,
    context_digest,
    default_image,
    reason,
)

__all__ = ["image_state", "list_sandboxes", "remove_sandbox", "sandbox_checks"]


def list_sandboxes(docker_host: str | None = None) -> list[dict[str, str]]:
    """The sandbox containers on this Docker host: session, status, creation time."""
    client = connect(docker_host)
    try:
        found = client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=1"})
        return [
            {
                "session": c.labels.get(LABEL_SESSION, "?"),
                "status": c.status,
                "created": str(c.attrs.get("Created", ""))[:19],
                "container": c.name,
            }
            for c in found
        ]
    finally:
        client.close()


def remove_sandbox(session_id: str, docker_host: str | None = None) -> int:
    """Remove a session's container and volumes; return how many objects went."""
    client = connect(docker_host)
    import docker.errors

    removed = 0
    try:
        selector = {"label": f"{LABEL_SESSION}={session_id}"}
        for container in client.containers.list(all=True, filters=selector):
            container.remove(force=True)
            removed += 1
        for volume in client.volumes.list(filters=selector):
            volume.remove(force=True)
            removed += 1
    except docker.errors.DockerException as exc:
        raise SandboxUnavailable(f"removing the sandbox of {session_id} failed: {exc}") from exc
    finally:
        client.close()
    return removed


def image_state(docker_host: str | None = None, image: str | None = None) -> tuple[str, str]:
    """The agent image's tag (``DURABLE_HARNESS_DOCKER_IMAGE`` or the default) and whether
    it is ``built``, ``outdated`` (from older sources), ``missing``, or why it cannot be
    told (Docker unreachable, the docker extra missing): for ``doctor``'s agent table."""
    image = image or os.environ.get("DURABLE_HARNESS_DOCKER_IMAGE") or default_image()
    try:
        import docker.errors
    except ImportError:
        return image, f"unknown: {install_hint('docker')}"
    try:
        client = connect(docker_host)
    except SandboxUnavailable:
        return image, "unknown: Docker is not reachable"
    try:
        found = client.images.get(image)
    except docker.errors.ImageNotFound:
        return image, "missing"
    except docker.errors.DockerException as exc:
        return image, f"unknown: {reason(exc)}"
    finally:
        client.close()
    try:
        fresh = found.labels.get(CONTEXT_LABEL) == context_digest()
    except (ConfigError, OSError):
        fresh = True
    return image, "built" if fresh else "outdated"


def sandbox_checks(docker_host: str | None = None, image: str | None = None) -> list[Any]:
    """``doctor`` lines: is Docker reachable, is the agent image built from these sources."""
    from durable_harness.core.types import Check

    image = image or os.environ.get("DURABLE_HARNESS_DOCKER_IMAGE") or default_image()
    try:
        import docker
    except ImportError:
        return [Check("docker", False, install_hint("docker"))]
    try:
        client = connect(docker_host)
    except SandboxUnavailable as exc:
        return [Check("docker", False, str(exc))]
    try:
        version = client.version().get("Version", "?")
        checks = [Check("docker", True, f"Docker {version} at {client.api.base_url}")]
        import docker.errors

        try:
            found = client.images.get(image)
        except docker.errors.ImageNotFound:
            checks.append(
                Check(
                    "agent image",
                    False,
                    f"{image} is not built: run `durable-harness sandbox build`",
                )
            )
            return checks
        size = int(found.attrs["Size"]) / 1e6
        try:
            fresh = found.labels.get(CONTEXT_LABEL) == context_digest()
        except (ConfigError, OSError):
            fresh = True  # no sources here to compare with
        detail = f"{image} ({size:.0f} MB)"
        if not fresh:
            detail += "; built from older sources: `durable-harness sandbox build` rebuilds it"
        checks.append(Check("agent image", True, detail))
        # Session images (run --image) carry the name of the image they were derived from.
        derived = client.images.list(filters={"label": SOURCE_LABEL})
        if derived:
            names = sorted({str(i.labels.get(SOURCE_LABEL)) for i in derived})
            checks.append(Check("session images", True, f"{len(derived)}, from {', '.join(names)}"))
        return checks
    finally:
        client.close()
