"""Finding an ACP agent's binary and checking it is the preset's pinned version."""

from __future__ import annotations

import subprocess

from durable_harness.adapters.acp.preset import AcpPreset
from durable_harness.adapters.cli.host import CliHost, find_cli
from durable_harness.core.errors import ConfigError

__all__ = ["check_version", "find_agent"]

#: (where, binary) -> the version it printed: asked once per host binary or image.
_versions: dict[tuple[str, str], str] = {}


def find_agent(preset: AcpPreset) -> str:
    """The host binary: ``$<bin_env>``, the pinned install (.tools/npm), or PATH."""
    return find_cli(preset.binary, preset.bin_env, preset.product, preset.package)


def check_version(preset: AcpPreset, host: CliHost, binary: str) -> None:
    """ConfigError unless the agent is exactly the preset's pinned version."""
    sandbox = getattr(host, "sandbox", None)
    where = "host" if sandbox is None else f"image {sandbox.image}"
    version = _versions.get((where, binary))
    if version is None:
        try:
            version = host.version(binary) if preset.version_args == ("--version",) else ""
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"cannot run {binary} --version: {exc}") from None
        _versions[(where, binary)] = version
    if preset.version_args == ("--version",) and version != preset.version:
        raise ConfigError(
            f"{binary} is {preset.product} {version}, but acp:{preset.name} needs exactly "
            f"{preset.version}: run scripts/setup, or point {preset.bin_env} at that version"
        )
