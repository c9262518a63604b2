"""The names every worker derives alike for a CLI launch (its job id, its proxy token, the
XDG folders of its private HOME) and the host folder of a host run."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from durable_harness.core.errors import ConfigError
from durable_harness.core.turn_config import VIRTUAL, TurnConfig


def launch_token(config: Mapping[str, Any] | TurnConfig, job: str) -> str:
    """The proxy token of a durable launch: derived from the turn's secret, so a worker that
    re-attaches to the CLI accepts the token the CLI was started with."""
    secret = TurnConfig.of(config).signal_secret or ""
    if not secret:
        raise ConfigError("this turn has no secret to derive its proxy token from")
    digest = hmac.new(secret.encode(), f"cli-proxy-token:{job}".encode(), hashlib.sha256)
    return digest.hexdigest()


def workspace_of(config: Mapping[str, Any] | TurnConfig, agent: str = "claude-code") -> Path:
    """The host folder of a host run (made if missing); the caller checked that a host
    folder is allowed (Claude Code and Codex: the opt-in, in their ``workspace_spec``).
    ConfigError for the virtual workspace."""
    spec = TurnConfig.of(config).workspace
    if spec == VIRTUAL:
        raise ConfigError(
            f"the {agent} agent runs the real CLI: give --workspace docker (the virtual "
            "workspace cannot host it)"
        )
    path = Path(spec).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"workspace {spec!r} is a file; give a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create workspace {spec!r}: {exc}") from None
    return path.resolve()


def job_id(turn_id: str, number: int) -> str:
    """The id of launch ``number`` of a turn: the same on every worker."""
    return f"{turn_id}-launch{number}"


def xdg_env(home: str) -> dict[str, str]:
    """HOME and the XDG folders, all under ``home`` (a launch's private HOME)."""
    return {
        "HOME": home,
        "XDG_CONFIG_HOME": f"{home}/.config",
        "XDG_DATA_HOME": f"{home}/.local/share",
        "XDG_CACHE_HOME": f"{home}/.cache",
        "XDG_STATE_HOME": f"{home}/.local/state",
    }
