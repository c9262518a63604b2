"""Finding Codex, the place it runs and its upstream (see :mod:`.codex.adapter`).

* :func:`find_codex` and :func:`check_version`: the one pinned version, on the host
  (``.tools/npm``) or in the agent image (``codex --version`` prints ``codex-cli 0.171.0``);
* :func:`open_host`: the session's Docker container (``--workspace docker``), or a host
  folder only with the developer opt-in :data:`~.cli.host.UNSAFE_HOST_ENV`;
* :func:`resolve_openai_endpoint` and :func:`codex_model`: the OpenAI-compatible upstream
  (the harness's own key, never the CLI's) and the model a turn asks for.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from durable_harness.adapters.cli.host import CliHost, HostCliHost, find_cli, require_unsafe_host
from durable_harness.adapters.cli.jobs import workspace_of
from durable_harness.core.errors import ConfigError
from durable_harness.core.settings import Settings
from durable_harness.harness.model import LOOPBACK_KEY, is_loopback

__all__ = [
    "BIN_ENV",
    "CODEX_VERSION",
    "check_version",
    "codex_model",
    "find_codex",
    "open_host",
    "resolve_openai_endpoint",
    "workspace_spec",
]

#: The one Codex version this adapter's rules were measured on (scripts/setup).
CODEX_VERSION = "0.171.0"
BIN_ENV = "DURABLE_HARNESS_CODEX_BIN"
DEFAULT_BASE_URL = "https://api.openai.com"
#: The model a turn asks for when it names none but the harness-wide default (a Claude
#: model, which no OpenAI-compatible endpoint serves).
DEFAULT_MODEL = "gpt-5-codex"
HOME_PREFIX = "durable-harness-codex-"
_versions_seen: dict[tuple[str, str], str] = {}  # (where, binary) -> version


def find_codex() -> str:
    """The ``codex`` binary: $DURABLE_HARNESS_CODEX_BIN, the pinned install, or PATH."""
    return find_cli("codex", BIN_ENV, "Codex", f"@openai/codex@{CODEX_VERSION}")


def check_version(binary: str, host: CliHost | None = None) -> None:
    """ConfigError unless ``binary --version`` (run where the CLI runs) is exactly
    :data:`CODEX_VERSION`."""
    sandbox = getattr(host, "sandbox", None)
    where = "host" if sandbox is None else f"image {sandbox.image}"
    version = _versions_seen.get((where, binary))
    if version is None:
        try:
            text = (host or HostCliHost(Path.cwd(), {})).version_text(binary)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"cannot run {binary} --version: {exc}") from None
        version = (text.split() or ["(nothing)"])[-1]
        _versions_seen[(where, binary)] = version
    if version != CODEX_VERSION:
        raise ConfigError(
            f"{binary} is Codex {version}, but durable-harness needs exactly {CODEX_VERSION} "
            f"(its request canonicalization is measured on that version): run scripts/setup, "
            f"or point {BIN_ENV} at that version"
        )


def resolve_openai_endpoint(base_url: str | None) -> tuple[str, str]:
    """``(base_url, api_key)`` of the OpenAI-compatible upstream (the harness's own key)."""
    url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
    key = os.environ.get("OPENAI_API_KEY", "")
    if not key:
        if not is_loopback(url):
            raise ConfigError(
                f"no API key for {url}: set OPENAI_API_KEY, or point OPENAI_BASE_URL at a "
                "local endpoint (e.g. `durable-harness fake-model`)"
            )
        key = LOOPBACK_KEY
    return url.rstrip("/").removesuffix("/v1"), key


def codex_model(config: dict[str, Any]) -> str:
    """The turn's model; the harness-wide default (a Claude model) means Codex's default."""
    model = str(config.get("model") or "")
    return DEFAULT_MODEL if model in ("", Settings.model_fields["model"].default) else model


def workspace_spec(config: dict[str, Any]) -> str:
    """``docker``, or a host folder when the developer opted in; ConfigError otherwise."""
    spec = str(config.get("workspace", "virtual"))
    if spec != "docker":
        require_unsafe_host("codex", spec)
        workspace_of(config, "codex")  # the virtual workspace cannot host the CLI
    return spec


def open_host(config: dict[str, Any], session_id: str) -> CliHost:
    """Where the turn's Codex runs: the session's container, or (opt-in) a host folder."""
    if workspace_spec(config) == "docker":
        from durable_harness.adapters.cli.docker_host import DockerCliHost

        return DockerCliHost(session_id)
    return HostCliHost(workspace_of(config, "codex"), {"codex": find_codex()}, HOME_PREFIX)
