"""Sandbox backends, one module each (virtual, local, docker), chosen by
:func:`open_sandbox` and imported lazily. They import only :mod:`durable_harness.core`
(the seam is core/sandbox.py), and one backend never imports another."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from durable_harness.core.errors import ConfigError
from durable_harness.core.extras import missing_extra
from durable_harness.core.sandbox import Sandbox

__all__ = ["open_sandbox"]

_ACCEPTED = "'virtual', 'docker', or a directory path (for example ./workspace or /srv/agent)"


def open_sandbox(spec: str, **options: Any) -> Sandbox:
    """The sandbox named by ``spec``: ``"virtual"``, ``"docker"`` (the session's container;
    pass ``session_id``), or a folder path for a local sandbox (created if missing; write
    ``./docker`` for a folder named docker). Backends are imported only when chosen.

    ConfigError for any other name, for a path that is a file, or for options the
    chosen backend does not take; SandboxUnavailable if Docker or its image is missing.
    """
    if spec == "virtual":
        from durable_harness.sandbox.virtual import VirtualSandbox

        _check_options(VirtualSandbox, spec, options)
        return VirtualSandbox(**options)
    if spec == "docker":
        try:
            from durable_harness.sandbox.docker import DockerSandbox
        except ImportError as exc:
            raise missing_extra("the docker sandbox", "docker", exc) from exc
        _check_options(DockerSandbox, spec, options)
        return DockerSandbox(**options)
    if not _looks_like_path(spec):
        raise ConfigError(f"unknown sandbox {spec!r}; use {_ACCEPTED}")
    from durable_harness.sandbox.local import LocalSandbox

    _check_options(LocalSandbox, spec, options)
    root = Path(spec).expanduser()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"sandbox path {spec!r} is a file; give a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create sandbox directory {spec!r}: {exc}") from exc
    return LocalSandbox(root, **options)


def _check_options(backend: type[Sandbox], spec: str, options: dict[str, Any]) -> None:
    accepted = set(inspect.signature(backend).parameters) - {"root"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ConfigError(
            f"the {spec!r} sandbox does not take {', '.join(unknown)}; "
            f"it takes {', '.join(sorted(accepted)) or 'no options'}"
        )


def _looks_like_path(spec: str) -> bool:
    """A path, not a mistyped backend name: has a separator, starts with ``.`` or ``~``,
    or names an existing directory."""
    if not spec:
        return False
    return "/" in spec or spec.startswith((".", "~")) or Path(spec).is_dir()
