"""Finding an ACP agent's binary and checking it is the preset's pinned version.

Two checks, as the agent allows: ``<binary> --version`` before the launch (OpenCode),
and the ``initialize`` result's ``agentInfo.version`` in every launch (all three
presets report it; claude-code-acp and codex-acp have no ``--version``, so for them it
is the only check and an agent that reports no version is refused too). Either way a
wrong version is one :class:`ConfigError` before ``session/new``: nothing of the turn
has run, nothing is recorded finished.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from durable_harness.adapters.acp.preset import AcpPreset
from durable_harness.adapters.cli.host import CliHost, find_cli
from durable_harness.core.errors import ConfigError

__all__ = ["check_initialized", "check_version", "find_agent", "initialize_checked"]

#: (where, binary) -> the version it printed: asked once per host binary or image.
_versions: dict[tuple[str, str], str] = {}


def find_agent(preset: AcpPreset) -> str:
    """The host binary: ``$<bin_env>``, the pinned install (.tools/npm), or PATH; an
    operator's agent (no ``bin_env``): its command's program, a path or on PATH."""
    if not preset.bin_env:
        found = shutil.which(preset.binary)
        if found is None:
            raise ConfigError(
                f"acp:{preset.name}: its command {preset.binary!r} is not an executable "
                "file or a program on PATH (DURABLE_HARNESS_ACP_AGENTS)"
            )
        return found
    return find_cli(preset.binary, preset.bin_env, preset.product, preset.package)


def initialize_checked(preset: AcpPreset) -> bool:
    """Whether the ``initialize`` result's ``agentInfo.version`` is checked."""
    return bool(preset.version)


def check_version(preset: AcpPreset, host: CliHost, binary: str) -> None:
    """ConfigError unless ``<binary> --version`` is the preset's pinned version (presets
    without ``--version`` are checked at ``initialize`` only: :func:`check_initialized`)."""
    if preset.version_args != ("--version",) or not preset.version:
        return
    sandbox = getattr(host, "sandbox", None)
    where = "host" if sandbox is None else f"image {sandbox.image}"
    version = _versions.get((where, binary))
    if version is None:
        try:
            version = host.version(binary)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"cannot run {binary} --version: {exc}") from None
        _versions[(where, binary)] = version
    if version != preset.version:
        raise _wrong(preset, binary, version)


def check_initialized(preset: AcpPreset, binary: str, agent_info: Any) -> None:
    """ConfigError unless the ``initialize`` result's ``agentInfo`` (the library's
    ``Implementation``, or None) reports the preset's pinned version. A preset checked by
    ``--version`` accepts an agent that reports none (that check has passed)."""
    if not initialize_checked(preset):
        return
    reported = getattr(agent_info, "version", None)
    if reported is None and preset.version_args == ("--version",):
        return
    if reported != preset.version:
        shown = "no version" if reported is None else str(reported)
        raise _wrong(preset, binary, shown, " (its initialize result's agentInfo.version)")


def _wrong(preset: AcpPreset, binary: str, version: str, how: str = "") -> ConfigError:
    fix = (
        f"run scripts/setup, or point {preset.bin_env} at that version"
        if preset.bin_env
        else "install that version, or change its `version` in DURABLE_HARNESS_ACP_AGENTS"
    )
    return ConfigError(
        f"{binary} is {preset.product} {version}{how}, but acp:{preset.name} needs exactly "
        f"{preset.version}: {fix}"
    )
