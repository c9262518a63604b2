"""The private HOME of one OpenCode launch: its config folder and environment.

Kept apart from :mod:`.opencode` (which decides what runs) so that another launcher (a
Docker sandbox) can write the same files elsewhere. Nothing here reaches the network:
OpenCode's ``@ai-sdk/anthropic`` provider is bundled in its binary, and the config folder
declares ``@opencode-ai/plugin`` already installed (see :func:`prepare_home`).
"""

from __future__ import annotations

import json
import os
import shutil
from importlib import resources
from pathlib import Path

from durable_harness.adapters.mcp import SERVER_NAME
from durable_harness.adapters.provider_api import opencode_npm

__all__ = ["OPENCODE_ENV", "OPENCODE_VERSION", "PROVIDER", "base_env", "prepare_home"]

#: The one OpenCode version this adapter's rules were measured on (scripts/setup).
OPENCODE_VERSION = "1.18.33"
PROVIDER = "durable-harness"
PLUGIN_FILE = "opencode_plugin.js"
_PASSED_ENV = ("PATH", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
#: OpenCode switches: no update check, no models.dev fetch, no sharing, no LSP downloads,
#: no Claude Code files (~/.claude), no default plugins, no project config (a project's
#: opencode.json could switch the journaling plugin or the provider off).
OPENCODE_ENV = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
}


def prepare_home(
    home: Path,
    *,
    model_url: str,
    harness_url: str,
    token: str,
    model: str,
    mcp: bool = False,
    api: str = "anthropic",
) -> dict[str, str]:
    """Write a launch's private config folder below ``home`` (the provider pointed at
    ``model_url`` with ``token`` as its key, the journaling plugin, the endpoint file
    naming ``harness_url``, and with ``mcp`` the harness's host tools as a remote MCP
    server, ``api`` choosing the provider: :func:`~.provider_api.opencode_npm`) and return
    OpenCode's environment."""
    config_dir = home / ".config" / "opencode"
    (config_dir / "plugin").mkdir(parents=True)
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": opencode_npm(api),  # bundled in the binary: nothing is fetched
                "name": "durable-harness",
                "options": {"baseURL": f"{model_url}/v1", "apiKey": token},
                "models": {model: {"name": model}},
            }
        },
        "model": f"{PROVIDER}/{model}",
        "small_model": f"{PROVIDER}/{model}",
        # The harness decides what runs (the plugin); OpenCode's own "ask" would be
        # auto-rejected in a non-interactive run and end it. Paths outside the workspace
        # are denied: the model gets an error and carries on inside the workspace.
        "permission": {
            "bash": "allow",
            "edit": "allow",
            "webfetch": "allow",
            "external_directory": "deny",
        },
        "autoupdate": False,
        "share": "disabled",
    }
    if mcp:
        config["mcp"] = {
            SERVER_NAME: {
                "type": "remote",
                "url": f"{harness_url}/mcp",
                "headers": {"Authorization": f"Bearer {token}"},
                "enabled": True,
            }
        }
    (config_dir / "opencode.json").write_text(json.dumps(config, indent=1))
    plugin = resources.files("durable_harness.adapters").joinpath(PLUGIN_FILE)
    (config_dir / "plugin" / "durable-harness.js").write_bytes(plugin.read_bytes())
    # OpenCode installs @opencode-ai/plugin into a config folder at start unless a
    # lock file already lists it; offline that install waits ~70 s and fails. The
    # plugin imports nothing from it, so a lock that lists it is all that is needed.
    (config_dir / "node_modules").mkdir()
    dependency = {"@opencode-ai/plugin": OPENCODE_VERSION}
    (config_dir / "package.json").write_text(json.dumps({"dependencies": dependency}))
    lock = {"packages": {"": {"dependencies": dependency}}}
    (config_dir / "package-lock.json").write_text(json.dumps(lock))
    endpoint = home / "durable-harness-endpoint.json"
    endpoint.write_text(json.dumps({"url": harness_url, "token": token}))
    endpoint.chmod(0o600)
    return {
        **base_env(home),
        **OPENCODE_ENV,
        "DURABLE_HARNESS_ENDPOINT": str(endpoint),
    }


def base_env(home: Path) -> dict[str, str]:
    """A minimal environment with a private HOME and XDG folders under it."""
    env = {name: os.environ[name] for name in _PASSED_ENV if name in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(
        {
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "SHELL": shutil.which("bash") or "/bin/sh",
            "TERM": "dumb",
        }
    )
    return env
