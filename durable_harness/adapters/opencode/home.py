"""The private HOME of one OpenCode launch: its config folder and environment.

Kept apart from :mod:`.opencode.spec` (which decides what runs): :func:`home_files` gives the
files and environment to a :class:`~.cli.host.CliLaunch`, whichever host writes them
(a host folder or the session's container). Nothing here reaches the network:
OpenCode's ``@ai-sdk/anthropic`` provider is bundled in its binary, and the config folder
declares ``@opencode-ai/plugin`` already installed (see :func:`prepare_home`).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from durable_harness.adapters.cli.jobs import xdg_env
from durable_harness.adapters.cli.mcp import SERVER_NAME
from durable_harness.adapters.opencode.provider import opencode_npm
from durable_harness.sandbox.agent_user import agent_env

__all__ = [
    "DATABASE",
    "OPENCODE_ENV",
    "OPENCODE_VERSION",
    "PROVIDER",
    "base_env",
    "home_files",
    "prepare_home",
]

#: The one OpenCode version this adapter's rules were measured on (scripts/setup).
OPENCODE_VERSION = "1.18.33"
PROVIDER = "durable-harness"
PLUGIN_FILE = "plugin.js"
ENDPOINT_FILE = "durable-harness-endpoint.json"
#: OpenCode's session database, relative to HOME (XDG_DATA_HOME is HOME/.local/share).
DATABASE = ".local/share/opencode/opencode.db"
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
    """Write a launch's private config folder below ``home`` (see :func:`home_files`)
    and return OpenCode's environment on this host."""
    files, env = home_files(
        str(home),
        model_url=model_url,
        harness_url=harness_url,
        token=token,
        model=model,
        mcp=mcp,
        api=api,
    )
    for rel, data in files.items():
        target = home / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(0o600)
    return {**base_env(home), **env}


def home_files(
    home: str,
    *,
    model_url: str,
    harness_url: str,
    token: str,
    model: str,
    mcp: bool = False,
    retry: bool = False,
    api: str = "anthropic",
    mcp_command: list[str] | None = None,
) -> tuple[dict[str, bytes], dict[str, str]]:
    """The files of a launch's private HOME ``home`` (HOME-relative paths: the provider
    pointed at ``model_url`` with ``token`` as its key, the journaling plugin, the endpoint
    file naming ``harness_url``, and with ``mcp`` the harness's host tools as a remote MCP
    server, ``api`` choosing the provider: :func:`~.opencode.provider.opencode_npm`) and the
    environment OpenCode needs besides the host's. ``retry``: the plugin
    waits for a new worker when the harness cannot be reached (the CLI outlives its
    worker in Docker)."""
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
        # ``mcp_command`` (Docker): the stdio relay, which posts a call again when the
        # worker died under it (OpenCode's own client gives the model the broken
        # connection); else the proxy's /mcp over HTTP.
        server: dict[str, object] = {"type": "local", "command": mcp_command}
        if mcp_command is None:
            bearer = {"Authorization": f"Bearer {token}"}
            server = {"type": "remote", "url": f"{harness_url}/mcp", "headers": bearer}
        config["mcp"] = {SERVER_NAME: {**server, "enabled": True}}
    config_dir = ".config/opencode"
    plugin = resources.files("durable_harness.adapters.opencode").joinpath(PLUGIN_FILE)
    # OpenCode installs @opencode-ai/plugin into a config folder at start unless a
    # lock file already lists it; offline that install waits ~70 s and fails. The
    # plugin imports nothing from it, so a lock that lists it is all that is needed
    # (with an empty node_modules, made by the placeholder file).
    dependency = {"@opencode-ai/plugin": OPENCODE_VERSION}
    endpoint: dict[str, object] = {"url": harness_url, "token": token}
    if retry:
        endpoint["retry"] = True
    files = {
        f"{config_dir}/opencode.json": json.dumps(config, indent=1).encode(),
        f"{config_dir}/plugin/durable-harness.js": plugin.read_bytes(),
        f"{config_dir}/node_modules/.keep": b"",
        f"{config_dir}/package.json": json.dumps({"dependencies": dependency}).encode(),
        f"{config_dir}/package-lock.json": json.dumps(
            {"packages": {"": {"dependencies": dependency}}}
        ).encode(),
        ENDPOINT_FILE: json.dumps(endpoint).encode(),
    }
    env = {
        **xdg_env(home),
        **OPENCODE_ENV,
        "TERM": "dumb",
        "DURABLE_HARNESS_ENDPOINT": f"{home}/{ENDPOINT_FILE}",
    }
    return files, env


def base_env(home: Path) -> dict[str, str]:
    """A minimal environment with a private HOME and XDG folders under it (the
    allow-listed one of :func:`~durable_harness.sandbox.agent_user.agent_env`)."""
    return agent_env(str(home), None, {"TERM": "dumb"})
